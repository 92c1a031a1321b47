"""Where a rank's time went between two instants: its moves between phases and modules, summed.

A traced rank notes every change of (phase, module) on its main thread with its time
(`capture.job_context.JobContext.moves`, written to its flight log and read back by
`capture.flightlog.read_flight`). Between two instants, each (phase, module) gets the time the rank
was in it: the state at the start is the last move before it (``other``, no module, before any).
A segment before a call is what the rank did from its previous completion to the call's issue
(`before`): what made it late, when it was.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from ..core.events import CommEvent

Where = tuple[str, str]
"""(phase, module): ``("forward", "layers.1.mlp")``, ``("other", "")``."""


class Moves:
    """One rank's moves, for time lookups: `spent` between two instants."""

    def __init__(self, moves: list[tuple[float, str, str]]):
        self.times = [t for t, _, _ in moves]
        self.states = [(phase, module) for _, phase, module in moves]

    def spent(self, a: float, b: float) -> dict[Where, float]:
        """Seconds of ``[a, b]`` in each (phase, module)."""
        out: dict[Where, float] = defaultdict(float)
        if b <= a:
            return out
        i = bisect_right(self.times, a) - 1
        state, t = (self.states[i] if i >= 0 else ("other", "")), a
        for j in range(i + 1, len(self.times)):
            if self.times[j] >= b:
                break
            out[state] += self.times[j] - t
            state, t = self.states[j], self.times[j]
        out[state] += b - t
        return out


class Completions:
    """One rank's completion times, for "its previous completion before t"."""

    def __init__(self, events: list[CommEvent]):
        self.times = sorted(e.t_complete for e in events if e.t_complete is not None)

    def before(self, t: float) -> float | None:
        i = bisect_right(self.times, t) - 1
        return self.times[i] if i >= 0 else None


def before(e: CommEvent, moves: Moves, completions: Completions) -> dict[Where, float]:
    """What the rank did from its previous completion to `e`'s issue, per (phase, module) (from its
    first move when nothing completed before)."""
    start = completions.before(e.t_issue)
    if start is None:
        start = moves.times[0] if moves.times else e.t_issue
    return moves.spent(start, e.t_issue)
