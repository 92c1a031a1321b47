"""The doctor's evidence: each rank's flight log loaded for comparison, and the Finding it produces.

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

from ..capture.flightlog import read, read_creations
from ..core.errors import UsageError
from ..core.events import CommEvent, human_bytes

P2P = ("send", "recv")


@dataclass
class Finding:
    """One diagnosis: the group (axis and ranks) it is placed on, the entry where the ranks first diverge,
    and the cause in plain words."""

    kind: str
    axis: str
    group: list[int]
    ranks: list[int]
    """The ranks the finding is about (stuck, divergent, or offending)."""
    entry: str
    """The first divergent entry, e.g. 'collective #3: all_reduce 256 KiB'."""
    cause: str
    t: float = float("inf")
    """When the first divergent entry was issued; the earliest finding is the likeliest root cause."""
    derived: bool = False
    """Dated by the call a peer was blocked in instead: the wait follows from that block, so it sorts
    after a finding of the same date (load skews ranks on a busy host, so issue times alone can put a
    healthy group's wait before the fault that caused it)."""
    evidence: str = "flight log"
    """What the finding rests on: ``flight log`` (meshscope's own), ``flight recorder`` (torch's dumps)
    or ``both`` (each source shows it on its own)."""

    def line(self) -> str:
        where = f"{self.axis}{self.group}" if self.group else self.axis
        source = "" if self.evidence == "flight log" else f" (evidence: {self.evidence})"
        return f"[{self.kind}] {where} ranks {self.ranks}: {self.entry} -- {self.cause}{source}"


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


def key(e: CommEvent) -> tuple:
    """A call's identity within one rank's log: its group and its position on that group."""
    return (e.axis, e.group, e.seq)


def load(run_dir: Path) -> dict[int, RankLog]:
    """Every rank's flight log of a run directory; UsageError if it has none."""
    files = sorted((run_dir / "flight").glob("rank*.jsonl"))
    if not files:
        raise UsageError(f"{run_dir} has no flight logs (flight/rank*.jsonl); is it a meshscope run directory?")
    ranks = {}
    for path in files:
        r = int(path.stem.removeprefix("rank"))
        lines = read(path)
        ranks[r] = RankLog(
            r,
            [(ln["axis"], tuple(ln["ranks"])) for ln in lines if ln["kind"] == "group"],
            [CommEvent.from_json(ln) for ln in lines if ln["kind"] == "issued"],
            {(ln["axis"], tuple(ln["group"]), ln["seq"]) for ln in lines if ln["kind"] == "completed"},
            {key(CommEvent.from_json(ln)): ln["t"] for ln in lines if ln["kind"] == "issued"},
            next((ln["text"] for ln in reversed(lines) if ln["kind"] == "mark"), None),
        )
        created = run_dir / "groups" / f"rank{r}.jsonl"
        if created.exists():
            ranks[r].created = read_creations(created)
    return ranks


def brief(e: CommEvent) -> str:
    """A call in a few words: op, phase, size, splits, region."""
    size = human_bytes(max(e.bytes_in, e.bytes_out))
    splits = f" splits {list(e.input_splits)}->{list(e.output_splits)}" if e.input_splits is not None else ""
    where = f" in {e.region}" if e.region else ""
    return f"{e.op} {e.phase} {size}{splits}{where}"


def last_call(info: RankLog) -> str:
    """Where a rank is: its last call and whether it returned."""
    if not info.issued:
        return "no collective at all"
    e = info.issued[-1]
    state = "completed" if key(e) in info.completed else "still waiting"
    return f"{brief(e)} on {e.axis}{list(e.group)} ({state})"


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
