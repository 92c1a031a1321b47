"""Where a traced job's time went: the ``time`` section of a trace's result (`TraceResult.time`).

Written once, by `timing.stragglers.analyse` (the trace's assembly calls it; the doctor calls it on the
same flight logs for its ``straggler`` findings), read by the report, ``--json`` and the doctor alike.
Milliseconds throughout; a step is one of the steady steps analysed (docs/trace.md, "Time").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class AxisTime:
    """One axis's time per rank and steady step, averaged over the ranks that issued on it."""

    axis: str
    inside_ms: float
    """From each call's arrival (`timing.waits.arrivals`) to its completion, summed over the step's calls."""
    waiting_ms: float
    """Of which waiting for a later member (a collective's last arrival, a send not yet issued)."""
    max_waiting_ms: float
    """The largest one rank's waiting averaged over the steps (the rank that waits most)."""
    gpu_ms: float | None = None
    """NCCL: the calls' time on the GPU (`CommEvent.gpu_ms`), where torch's Flight Recorder timed them."""


GPU_QUEUE = "gpu"
"""A straggler's `phase` where its time went to its GPU reaching its late calls after their CPU issue
(`CommEvent.t_gpu`; `timing.stragglers` writes it, `Straggler.where` words it)."""


@dataclass(frozen=True)
class Straggler:
    """A rank the others waited for, step after step, and where its time went before its late calls."""

    rank: int
    axis: str
    """The axis whose members waited for it most."""
    ms_per_step: float
    """The others' mean wait per steady step it caused on `axis` (over all the steady steps)."""
    share: float
    """`ms_per_step` over the median step."""
    steps: tuple[int, ...]
    """The steady steps on which it held the others by at least the rule's share."""
    phase: str
    """Where its extra time went: the (phase, module) of its segments before its late calls (from its
    previous completion to the late issue) that exceeds the other members' median by most; ``gpu`` (no
    module) where it was the time its GPU took to reach the calls after their issue (NCCL)."""
    module: str
    excess_ms: float
    """That excess, per steady step on which it held the others."""
    caused_held_ms: float = 0.0
    """The others' mean wait it caused on `axis`, per step among `steps` (those it held them on)."""
    queued_ms: float | None = None
    """Its main thread's wait for a CPU (the run queue), per step among `steps`; None where not known.
    A rank whose run-queue wait is most of what it caused is its host's, not named (`timing.stragglers`)."""

    @property
    def where(self) -> str:
        if self.phase == GPU_QUEUE:  # its GPU reached the calls late, its CPU did not
            return "gpu, its kernels before the calls (the CPU issued them on time)"
        return f"{self.phase}, {self.module or 'no module'}"


@dataclass(frozen=True)
class TimeSection:
    """Waits per axis, the waits each rank caused per step, and the stragglers."""

    analysed: bool
    note: str = ""
    """Why it was not analysed (a fake world, no clock, too few steps), or what limits it."""
    rule: str = ""
    """The straggler rule, in words (with its thresholds)."""
    steps: tuple[int, ...] = ()
    step_ms: float | None = None
    """The median steady step (each step's median over the ranks)."""
    clock_error_ms: float | None = None
    """The largest error bound of the offsets used (`core.clock.offsets`): 0 on one host, where they are
    exact; else half the fastest round trip through the store of another host's best estimate."""
    clock_true_error_ms: float | None = None
    """On one host: the store estimate's largest difference from the true offset (one monotonic clock),
    which is what it would have cost across hosts."""
    axes: tuple[AxisTime, ...] = ()
    caused: tuple[tuple[int, int, float], ...] = ()
    """(rank, step, ms): the others' mean wait that rank caused in that step, every axis summed."""
    stragglers: tuple[Straggler, ...] = ()

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["caused"] = [list(c) for c in self.caused]
        doc["steps"] = list(self.steps)
        for s in doc["stragglers"]:
            s["steps"] = list(s["steps"])
        return doc

    @classmethod
    def from_json(cls, d: dict) -> TimeSection:
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        values["steps"] = tuple(d.get("steps", ()))
        values["axes"] = tuple(AxisTime(**a) for a in d.get("axes", ()))
        values["caused"] = tuple(tuple(c) for c in d.get("caused", ()))
        values["stragglers"] = tuple(Straggler(**{**s, "steps": tuple(s["steps"])}) for s in d.get("stragglers", ()))
        return cls(**values)
