"""The doctor's ``straggler`` findings: a rank of a traced job the others waited for, step after step.

The analysis is `timing.stragglers` (its rule, its thresholds), run on the trace's flight logs, which
the doctor has read already (`evidence.load`), and its ranks' ends (their clocks). A straggler is a
performance finding (`Diagnosis.performance`): it never makes a directory unhealthy, never outranks a
fault as the likely root cause, and leaves a trace's outcome as it was (docs/trace.md, "Time").
"""

from __future__ import annotations

from ..core.findings import Finding
from ..core.rundir import RunDir
from ..core.steady import of_ranks
from ..core.time_result import Straggler, TimeSection
from ..core.rank_end import RankEnd
from ..timing.stragglers import of_trace
from .evidence import RankLog


def time_of(run_dir: RunDir, logs: dict[int, RankLog], ended: list[RankEnd]) -> TimeSection | None:
    """A trace directory's time section from its flight logs (None for a run of meshscope's own models)."""
    if run_dir.kind() != "trace" or not ended:
        return None
    events = [e for log in logs.values() for e in log.issued]
    steady = of_ranks(events, {e.rank: e.steps for e in ended if e.status != "missing"})
    return of_trace(run_dir, events, ended, steady, run_dir.trace_spec().fake_world)


def finding(s: Straggler, step_ms: float) -> Finding:
    held = f"{len(s.steps)} of the steady steps" if len(s.steps) > 3 else f"steps {list(s.steps)}"
    return Finding("straggler", s.axis, [], [s.rank],
                   f"the others waited {s.ms_per_step:.1f} ms per step for it on {s.axis} ({s.share:.0%} of the "
                   f"{step_ms:.1f} ms step), holding them on {held}",
                   f"its time went to {s.where}: {s.excess_ms:.1f} ms per step more than the other members' before "
                   f"its late calls", where=s.where, ms_per_step=s.ms_per_step, steps=list(s.steps))
