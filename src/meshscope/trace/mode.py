"""What a traced rank does differently in a real job and in a fake world, behind one set of calls.

The rank program (`trace.rank`) picks its mode once (`RealMode` here, `trace.fake.mode.FakeMode` for
``--fake-world``) and calls it at fixed points: `start` (before anything prints), `install` (before
the script's first line), `recording` (around the script), `explain` (a failure, in the user's
words), `failed` and `ended`; it tests no fake-world flag of its own.

A real rank keeps what it prints in ``logs/rank<R>.log`` (`output.tee`), turns torch's Flight
Recorder on and dumps it when it fails (`fr_dump`; on NCCL its entries give each call its GPU time),
ends at once when the launcher sends SIGTERM (`stopping.stop_on_sigterm`), estimates its offset to rank 0's clock through the job's store once
the default group exists (`clock`) and, with ``--steps``, tells the ranks waiting for it that it is
done when its script ended first.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import NamedTuple

from ..core.rundir import RunDir
from . import fr_dump
from .entry_points import wrap
from .options import RankOptions
from .output import tee
from .recording import RankTrace
from .stopping import count_done, stop_on_sigterm


class Explained(NamedTuple):
    """A failure in the user's words (`RealMode.explain`)."""

    error: str | None
    """One line better than the exception's own, or None."""
    note: str | None
    cause: BaseException
    """The exception the failure is recorded for: the one raised, or the first cause it hid."""


class RealMode:
    """A worker of a real job, started by torchrun."""

    alone = False
    """Whether the rank has no peers to meet (`stopping.stop_when_all_done`)."""

    def __init__(self, options: RankOptions, run_dir: RunDir, rank: int):
        self.options, self.run_dir, self.rank = options, run_dir, rank

    @property
    def recorder(self) -> str:
        return self.options.recorder

    def start(self) -> None:
        tee(self.run_dir.log(self.rank))

    def install(self, trace: RankTrace, stopped) -> None:
        self.trace = trace
        if self.options.flight_recorder:
            fr_dump.enable(self.run_dir)
        stop_on_sigterm(stopped)

        def clocked(original):
            @functools.wraps(original)  # its signature stays visible to the wrappers after this one
            def init_process_group(*args, **kwargs):
                out = original(*args, **kwargs)
                import torch.distributed as dist

                trace.begin_clock(dist.get_rank(), dist.get_world_size())
                return out
            return init_process_group

        wrap("init_process_group", clocked)

    def recording(self, trace: RankTrace) -> AbstractContextManager:
        return trace.recording()

    def explain(self, exc: BaseException) -> Explained:
        """A failure in the user's words: a real job's is its own."""
        return Explained(None, None, exc)

    def failed(self) -> None:
        """The rank failed or was stopped: gloo dumps no Flight Recorder on its own timeout."""
        if self.options.flight_recorder:
            fr_dump.dump(self.run_dir, self.rank)

    def ended(self, stopped: bool) -> None:
        """The script is over; `stopped`: by ``--steps``. On NCCL its calls get their GPU times."""
        if self.options.steps and not stopped:
            count_done()
        if self.options.flight_recorder:
            self.trace.flush()
            self.trace.gpu_ms = fr_dump.gpu_durations([(call[0], call[2]) for call in self.trace.calls], self.rank)

    def record(self) -> dict:
        """What this mode adds to the rank's end (`core.rank_end.RankEnd`)."""
        return {}
