"""The doctor's evidence: each rank's flight log loaded for comparison (`core.findings.Finding` is what
the rules make of it).

A rank's log (`flightlog`) lists its group creations and every call as ``issued`` and, once it
returned, ``completed``; a call issued and never completed is where that rank was blocked when it
stopped. A traced job's flight log names a group when it is first used; its creations, in order and
member or not, are in ``groups/rank<R>.jsonl`` (`trace.created`: ``creating`` before ``new_group``
is asked, ``created`` when it returned). Findings carry the time their first divergent entry was issued, so that the earliest one
can be reported as the likely root cause and later ones as its consequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..capture.flightlog import read_creations, read_flight
from ..core.errors import UsageError
from ..core.events import CommEvent, human_bytes
from ..core.rundir import RunDir


@dataclass
class RankLog:
    """One rank's flight log: groups in creation order, calls in issue order, which completed, when issued."""

    rank: int
    groups: list[tuple[str, tuple[int, ...]]]
    issued: list[CommEvent]
    completed: set[tuple]
    issued_at: dict[tuple, float]
    last_mark: str | None = None
    """The rank's last progress mark: where it was when no call is pending (timing and sweeps record
    no calls, so a hang there shows only as the last mark)."""
    created: list[dict] | None = None
    """A traced rank's group creations in order (`flightlog.read_creations`), None where the directory has none."""
    marked: dict[int, float] | None = None
    """A traced rank's ``step N done`` marks: N -> when, in wall-clock seconds."""
    cut: bool = False
    """A traced rank killed without an end record, or dead of a signal its flusher could not answer
    (`RankEnd.unflushed`): its log lacks what it issued after its last flush (`trace.recording`)."""

    @property
    def steps_done(self) -> int:
        """Optimizer steps a traced rank finished: the last of its ``step N done`` marks (0 without one)."""
        return max(self.marked or (), default=0)

    def passed(self, step: int | None) -> float | None:
        """When this rank finished `step` (its ``step step+1 done`` mark: step k holds what was issued
        after the k-th optimizer step up to the end of the next), None if it did not or is no trace."""
        return None if step is None or not self.marked else self.marked.get(step + 1)

    def on(self, e: CommEvent) -> list[CommEvent]:
        """This rank's calls on `e`'s group, in order."""
        return [c for c in self.issued if (c.axis, c.group) == (e.axis, e.group)]


def key(e: CommEvent) -> tuple:
    """A call's identity within one rank's log: its group and its position on that group."""
    return (e.axis, e.group, e.seq)


def load(run_dir: RunDir | Path) -> dict[int, RankLog]:
    """Every rank's flight log of a run directory; UsageError if it has none."""
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    present = run_dir.ranks_with("flight")
    if not present:
        raise UsageError(f"{run_dir} has no flight logs (flight/rank*.jsonl); is it a meshscope run directory?")
    ranks = {}
    for r in present:
        flight = read_flight(run_dir.flight(r), r)
        ranks[r] = RankLog(r, [(g["axis"], tuple(g["ranks"])) for g in flight.groups], flight.issued,
                           flight.completed, flight.issued_at, flight.marks[-1][1] if flight.marks else None,
                           marked={step: flight.wall(t) for t, _, step in flight.marks if step is not None})
        created = run_dir.groups(r)
        if created.exists():
            ranks[r].created = read_creations(created).creations
            end = run_dir.read_end(r)
            ranks[r].cut = end.status == "missing" or end.unflushed
    return ranks


def brief(e: CommEvent) -> str:
    """A call in a few words: op, phase, size, splits, region."""
    size = human_bytes(max(e.bytes_in, e.bytes_out))
    splits = f" splits {list(e.input_splits)}->{list(e.output_splits)}" if e.input_splits is not None else ""
    where = f" in {e.region}" if e.region else ""
    return f"{e.op} {e.phase} {size}{splits}{where}"


def last_call(info: RankLog) -> str:
    """Where a rank is: its last call and whether it returned."""
    unknown = (" in its flight log, which lacks what it issued in its last half second (killed, or dead in "
               "native code while holding the GIL)") if info.cut else ""
    if not info.issued:
        return f"no collective at all{unknown}"
    e = info.issued[-1]
    state = "completed" if key(e) in info.completed else "still waiting"
    return f"{brief(e)} on {e.axis}{list(e.group)} ({state}){unknown}"


def pending(ranks, e: CommEvent) -> bool:
    """Issued and never completed: the rank is (or was, when it stopped) blocked in this call."""
    return key(e) not in ranks[e.rank].completed


def blocked_in(ranks, r: int) -> CommEvent | None:
    """The call rank `r` was blocked in when it stopped (its last call, issued and never completed)."""
    calls = ranks[r].issued
    return calls[-1] if calls and pending(ranks, calls[-1]) else None


def issued_at(ranks, *events: CommEvent) -> float:
    """When the earliest of `events` was issued (the date of a finding about them)."""
    return min(ranks[e.rank].issued_at.get(key(e), float("inf")) for e in events)
