"""The steady steps of a traced rank, found from what it issued: the one selection the checks, the time
analysis, `place` and the budgets share.

Step 0 holds set-up (DDP's and DTensor's parameter broadcasts, and collectives whose number depends on
random draws: ``trunc_normal_`` on sharded tensors issued 252 calls in one run of torchtitan's step 0
and 258 in the next), so it is never steady. How many steps after it are warm-up depends on the job,
not on an index: DDP rebuilds its buckets in its second iteration (step 1: two broadcasts), and with
``static_graph=True`` in its third (step 2; torch 2.13 ``nn/parallel/distributed.py``,
``_rebuild_buckets`` after ``static_graph``'s first iteration), which TorchRec's dense part uses by
default. So the steady steps are those from the first run of `MIN_RUN` identical steps after step 0 to
the last complete one; the steps between are warm-up, each with what set it apart (`Steady.warmup`).
Identical means the same calls in the same order (`same_call`), all-to-all splits aside: those move
with the routing.

A rank whose steps never repeat twice in a row has no steady steps. Where it completed enough steps
for a warm-up of `WARMUP_LIMIT` steps and a run after it (`Steady.decided`), that is a finding (the
``steady steps repeat`` check fails on it); with fewer it is only too short a trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .events import CommEvent, rank_ranges

MIN_RUN = 2
"""Identical steps in a row before they are taken for the job's steady state."""

WARMUP_LIMIT = 3
"""Warm-up steps after step 0 that a job may take before its steps repeat (DDP's static graph takes 2)."""


def same_call(e: CommEvent) -> tuple:
    """What two steps' calls must share to be the same call: everything a step repeats, where an
    all-to-all's bytes and splits follow the routing and are left out."""
    if e.op == "all_to_all":
        return (e.op, e.axis, e.group, e.phase, e.dtype)
    return (e.op, e.axis, e.group, e.phase, e.dtype, e.bytes_in, e.bytes_out, e.input_splits, e.output_splits,
            e.peer, e.region)


@dataclass(frozen=True)
class Steady:
    """One rank's steady steps, as its own calls showed them."""

    complete: int
    """Steps the rank completed (steps ``0 .. complete - 1``)."""
    first: int | None
    """The first steady step (None: no run of `MIN_RUN` identical steps after step 0)."""
    warmup: tuple[tuple[int, str], ...] = ()
    """The steps after step 0 and before `first`, each with what it issued apart from the steady steps."""

    @property
    def steps(self) -> list[int]:
        """The steady steps: `first` to the last complete step (none when no run was found)."""
        return list(range(self.first, self.complete)) if self.first is not None else []

    @property
    def decided(self) -> bool:
        """Enough steps were traced that finding no run is the job's doing, not a short trace's."""
        return self.first is not None or self.complete >= 1 + WARMUP_LIMIT + MIN_RUN

    def needed(self, steady: int) -> int:
        """How many complete steps give `steady` steady steps, if the run starts where it did (or, with no
        run yet, right after the longest warm-up allowed)."""
        start = self.first if self.first is not None else 1 + WARMUP_LIMIT
        return start + steady

    def to_json(self) -> dict:
        return {"complete": self.complete, "first": self.first, "warmup": [list(w) for w in self.warmup]}

    @classmethod
    def from_json(cls, d: dict) -> Steady:
        return cls(d["complete"], d.get("first"), tuple((int(k), str(why)) for k, why in d.get("warmup", ())))


def find(steps: Mapping[int, Sequence[CommEvent]], complete: int) -> Steady:
    """The steady steps of a rank that completed `complete` steps, `steps` its calls by step."""
    keys = {k: [same_call(e) for e in steps.get(k, ())] for k in range(complete)}
    for k in range(1, complete - MIN_RUN + 1):
        if all(keys[k + i] == keys[k] for i in range(1, MIN_RUN)):
            warmup = tuple((j, _apart(steps.get(j, ()), steps.get(k, ()))) for j in range(1, k))
            return Steady(complete, k, warmup)
    return Steady(complete, None)


def of_ranks(events: Iterable[CommEvent], complete: Mapping[int, int]) -> dict[int, Steady]:
    """`find` for every rank of `complete` (rank -> steps it completed)."""
    by_rank: dict[int, dict[int, list[CommEvent]]] = {r: {} for r in complete}
    for e in events:
        if e.rank in by_rank and e.step is not None:
            by_rank[e.rank].setdefault(e.step, []).append(e)
    return {r: find(by_rank[r], n) for r, n in sorted(complete.items())}


def common(steady: Iterable[Steady]) -> list[int]:
    """The steps steady on every rank given."""
    runs = [set(s.steps) for s in steady]
    return sorted(set.intersection(*runs)) if runs else []


def _apart(step: Sequence[CommEvent], steady: Sequence[CommEvent]) -> str:
    """What a warm-up step issued apart from the steady step, by op and axis: ``2 broadcast on world more
    (forward, MLP)``, or the first call that differs where the counts agree."""
    mine = Counter((e.op, e.axis) for e in step)
    theirs = Counter((e.op, e.axis) for e in steady)
    parts = []
    for op, axis in sorted(set(mine) | set(theirs)):
        a, b = mine[(op, axis)], theirs[(op, axis)]
        if a != b:
            where = sorted({f"{e.phase}{', ' + e.region if e.region else ''}" for e in step
                            if (e.op, e.axis) == (op, axis)}) if a > b else []
            parts.append(f"{op} on {axis} {a} where the steady step has {b}"
                         + (f" ({'; '.join(where)})" if where else ""))
    if parts:
        return ", ".join(parts)
    first = next((i for i, (x, y) in enumerate(zip(step, steady)) if same_call(x) != same_call(y)), None)
    if first is None:  # TorchRec's DDP (static_graph, one bucket): step 1 is step 3's, step 2 adds the rebuild
        return "the steady step's calls, but the next step differs"
    e = step[first]
    return f"call {first} differs: {e.op} {e.dtype} {e.bytes_in}->{e.bytes_out} B ({e.phase})"


def warmup_note(steady: Mapping[int, Steady]) -> str:
    """One line for the result's notes: where the steady steps start, and the warm-up skipped before them
    (said once for ranks that skipped the same), or '' when every rank's run starts at step 1."""
    skipped: dict[tuple, list[int]] = {}
    for rank, s in steady.items():
        if s.warmup:
            skipped.setdefault((s.first, s.warmup), []).append(rank)
    parts = []
    for (first, warmup), ranks in skipped.items():
        steps = "; ".join(f"step {k}: {why}" for k, why in warmup)
        parts.append(f"ranks {rank_ranges(ranks)}: steady from step {first}, skipping {steps}")
    return ("steady steps start after the warm-up the job's calls showed (step 0 is set-up): " + " | ".join(parts)
            if parts else "")
