"""What a rank knows about itself while it runs: rank, device, backend, mesh groups, run directory.

`RankContext.start` initialises torch.distributed from the environment torchrun provides (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), with the collective timeout the user asked for: a
collective that does not complete in time raises instead of hanging (gloo enforces it per call; NCCL
through its watchdog with async error handling on).
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..core.faults import FAULT_RANK
from ..core.groups import MeshGroups, create_groups
from ..core.mesh import Layout

PROGRESS_PREFIX = "[meshscope] "
"""Lines a rank writes to stderr with this prefix are progress; the launcher shows them."""


@dataclass
class RankContext:
    rank: int
    world: int
    local_rank: int
    backend: str
    device: torch.device
    run_dir: Path
    timeout_s: float
    control: object = None
    """A gloo group over the whole world for gathering results (NCCL cannot carry Python objects)."""
    meshes: dict[Layout, MeshGroups] = field(default_factory=dict)
    flight: object = None
    """This rank's FlightLog, when the run keeps one: group creations are logged to it."""
    inject: str | None = None
    """A run-level planted fault (`faults.RUN_LEVEL`), or None."""

    @classmethod
    def start(cls, backend: str, timeout_s: float, run_dir: Path) -> "RankContext":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise RuntimeError("--backend nccl needs CUDA GPUs; none is visible (use --backend gloo on CPU)")
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
            control = dist.new_group(backend="gloo", timeout=timeout)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=timeout)
            control = dist.group.WORLD
        return cls(rank, world, local_rank, backend, device, run_dir, timeout_s, control)

    def mesh(self, layout: Layout) -> MeshGroups:
        """The groups of `layout`, created on first use by every rank in the global order."""
        if layout not in self.meshes:
            on_create = self.flight.group_created if self.flight is not None else None
            misorder = self.inject == "group-order" and self.rank == FAULT_RANK
            self.meshes[layout] = create_groups(layout, self.rank, datetime.timedelta(seconds=self.timeout_s),
                                                on_create, misorder)
        return self.meshes[layout]

    def progress(self, message: str) -> None:
        """Report progress: a mark in every rank's flight log (the doctor places a hang after the
        last one), and a terminal line from rank 0 only, one per step of work."""
        if self.flight is not None:
            self.flight.mark(message)
        if self.rank == 0:
            print(PROGRESS_PREFIX + message, file=sys.stderr, flush=True)

    def gather(self, obj) -> list | None:
        """Gather a picklable object to rank 0 (None elsewhere) over the control group."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
