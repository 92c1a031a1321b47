"""Where a rank's time went between two instants: its moves between phases and modules, summed.

A traced rank notes every change of (phase, module) on its main thread with its time
(`capture.job_context.JobContext.moved`: in the C++ recorder, or in Python's list without it; written
to its flight log and read back by `capture.flightlog.read_flight`). Between two instants, each (phase, module) gets the time the rank
was in it: the state at the start is the last move before it (``other``, no module, before any).
A segment before a call is what the rank did from its previous completion on the call's group to
the call's issue (`before`): what made it late, when it was. The group's, not any call's: a call
queued earlier and completing on its own (FSDP2's prefetched all-gathers, DDP's buckets) can complete
in the middle of what made the rank late, and would cut the segment there.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from ..core.events import P2P, CommEvent

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
    """One rank's calls per group, for "its previous completion on that group before t"."""

    def __init__(self, events: list[CommEvent]):
        by: dict[tuple, list[float]] = defaultdict(list)
        for e in events:
            # a call whose completion was not seen (gloo's send, recv and reduce_scatter_tensor works have no
            # future) stands in with its issue: the segment then starts no later than it could
            by[_channel(e)].append(e.t_complete if e.t_complete is not None else e.t_issue)
        self.times = {k: sorted(v) for k, v in by.items()}

    def before(self, e: CommEvent) -> float | None:
        times = self.times.get(_channel(e), [])
        i = bisect_right(times, e.t_issue) - 1
        while i >= 0 and times[i] >= e.t_issue:  # the call itself, where it stands in with its issue
            i -= 1
        return times[i] if i >= 0 else None


def _channel(e: CommEvent) -> tuple:
    """What a call queues behind: its group (a point-to-point call: its peer)."""
    return (e.axis, e.group, e.peer) if e.op in P2P else (e.axis, e.group)


def before(e: CommEvent, moves: Moves, completions: Completions) -> dict[Where, float]:
    """What the rank did from its previous completion on `e`'s group to `e`'s issue, per (phase,
    module) (from its first move when nothing completed before)."""
    start = completions.before(e)
    if start is None:
        start = moves.times[0] if moves.times else e.t_issue
    return moves.spent(start, e.t_issue)
