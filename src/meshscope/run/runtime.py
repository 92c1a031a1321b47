"""What a rank knows about itself while it runs: rank, device, backend, mesh groups, run directory.

`RankContext.start` initialises torch.distributed from the environment torchrun provides (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), with the collective timeout the user asked for: a
collective that does not complete in time raises instead of hanging (gloo enforces it per call; NCCL
through its watchdog with async error handling on).
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..core.faults import FAULT_RANK
from ..core.groups import MeshGroups, create_groups, forget_all, init_default_group
from ..core.mesh import Layout
from .launch import PROGRESS_PREFIX


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
            init_default_group("nccl", rank, world, timeout, device_id=device)
            control = dist.new_group(backend="gloo", timeout=timeout)
        else:
            device = torch.device("cpu")
            init_default_group("gloo", rank, world, timeout)
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

    def close(self, barrier: bool = True) -> None:
        """Tear torch.distributed down so that no communication thread outlives this call.

        Why (observed with two torch elastic agents on one host, c10d rendezvous, ``torchrun -m
        meshscope run tp_ar_b32``: 2 of 7, then 2 of 8, runs lost one rank with "terminate called
        without an active exception", exit -6, after rank 0 had written a passing result): a
        terminate handler preloaded into the ranks caught the aborting thread. It was a gloo worker,
        ``pt_gloo_runloop``, in ``ProcessGroupGloo::runLoop``, dropping its reference to the work it
        had just finished; that was the last reference to a tensor Python had already let go of, so
        ``TensorImpl::decref_pyobject`` took the GIL (``PyEval_AcquireThread``) - while the main thread
        was already finalising the interpreter. Python ends such a thread with ``pthread_exit``, whose
        forced unwind through torch's noexcept frames is a ``std::terminate``. The thread was still
        alive at exit because ``destroy_process_group`` does not stop gloo (its ``shutdown`` is a
        no-op; only ``~ProcessGroupGloo`` joins the workers) and meshscope kept every group referenced
        (``ctx.meshes``, ``ctx.control``, the registry of `core.groups`): at ``atexit`` each rank still
        ran 4 groups' threads (4 x ``gloo_tcp_loop`` + 8 x ``pt_gloo_runloop``). A plain script holds
        no other reference, so its groups die, and their threads are joined, inside
        ``destroy_process_group``; the standalone worker hid the race by leaving through ``os._exit``.

        So: a barrier first (when this rank succeeded), so no peer is still inside a collective with
        us; then ``destroy_process_group``; then every reference goes and the groups' destructors join
        their threads here, while the interpreter is fully alive (torch's ProcessGroup holder drops
        the GIL while it destructs, so a worker that needs the GIL gets it: no run hung). Afterwards
        no gloo thread is left at ``atexit``, and `benchmarks/soak_multinode.py` went from 10/12
        clean runs (the same 'terminate called') to 20/20. `live_comm_threads` reports any survivor.
        """
        if not dist.is_initialized():
            return
        if barrier:
            try:
                dist.barrier(group=self.control)
            except Exception as exc:  # noqa: BLE001 - a peer that died after its last collective
                print(f"{PROGRESS_PREFIX}rank {self.rank}: barrier before teardown failed: "
                      f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                      file=sys.stderr, flush=True)
        dist.destroy_process_group()
        self.meshes.clear()
        self.control = None
        forget_all()
        gc.collect()  # groups reachable only through reference cycles (models, closures) go now too
        left = live_comm_threads()
        if left:
            print(f"{PROGRESS_PREFIX}rank {self.rank}: {len(left)} communication threads outlived "
                  f"destroy_process_group ({', '.join(sorted(set(left)))}): a ProcessGroup is still referenced",
                  file=sys.stderr, flush=True)


COMM_THREAD_PREFIXES = ("pt_gloo", "gloo_")
"""Names (Linux ``comm``) of the threads a gloo ProcessGroup runs: ``pt_gloo_runloop`` (its workers)
and ``gloo_tcp_loop`` (its transport's event loop)."""


def live_comm_threads() -> list[str]:
    """Names of this process's threads that belong to a gloo ProcessGroup ([] where /proc is absent)."""
    names = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        if name.startswith(COMM_THREAD_PREFIXES):
            names.append(name)
    return names
