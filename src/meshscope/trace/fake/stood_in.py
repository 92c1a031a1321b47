"""The calls in which a fake world's rank kept its own integers where a peer's were not known (`replay`): one
writer (the rank, at its end) and one reader (`world`, for the result's note), without torch (the trace's
own process reads it). Apart from them, the first receive of integers that nothing stood in for, which held
zeros (`UNFILLED`: a P2P message's, or a collective's part of another size than the rank's own): a rank that
then failed is named with it, its failure likely that receive's, not the script's."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ...core.events import rank_ranges
from ...core.rundir import RunDir, write_atomic

FILE = "stood-in.json"
"""Its name in the rank's ``objects/rank<R>/`` folder (beside what the rank sent)."""
UNFILLED = "unfilled.json"
"""The receive a rank could fill with nothing (zeros), in the same folder."""
UNNAMED = "undefined"
"""torch's description of a group made with no ``group_desc`` (torch 2.13 distributed_c10d.py ``new_group``)."""
NAMED = 20
"""Calls a rank names (the others are counted)."""
SHOWN = 4
"""Calls the result's note names."""
UNTRACED = "not traced before it"
"""Why a sender's part was not known, where it had not run before the rank."""
UNSENT = "sent nothing in this call"
"""Why it was not known, where the sender ran before the rank but has no record of the call (it failed first)."""
DERIVED = "kept its own integers for a peer's before it sent"
"""Why it is not known for sure, where the sender's record was itself issued after a stand-in of its own."""


@dataclass(frozen=True)
class StandIn:
    """A call that kept this rank's own integers where a peer's were not known."""

    op: str
    desc: str
    """The group's description as torch has it: ``default_pg``, DeviceMesh's ``mesh_tp``, or torch's placeholder
    ``undefined`` for a group the script named not (picotron's, DeepSpeed's)."""
    members: tuple[int, ...]
    step: int
    senders: tuple[tuple[int, str], ...]
    """(global rank, why what it sent is not known) per such sender."""

    def text(self, axes: dict[tuple[int, ...], str]) -> str:
        """``all_reduce on pp [0,2] at step 0 (...)``: an unnamed group by the axis its members make in the
        trace's layout (`axes`: members -> axis, inferred where the job named none: core.mesh_infer)."""
        why: dict[str, list[int]] = {}
        for rank, reason in self.senders:
            why.setdefault(reason, []).append(rank)
        senders = "; ".join(f"rank{'s' if len(r) > 1 else ''} {rank_ranges(r)} {reason}" for reason, r in why.items())
        name = axes.get(self.members, "group") if self.desc in ("", UNNAMED) else self.desc
        return f"{self.op} on {name} [{rank_ranges(list(self.members))}] at step {self.step} ({senders})"


def write(run_dir: RunDir, rank: int, count: int, named: list[StandIn]) -> None:
    folder = run_dir.objects(rank)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / FILE, json.dumps({"count": count, "named": [asdict(s) for s in named]}))


def clear(run_dir: RunDir, rank: int) -> None:
    for name in (FILE, UNFILLED):
        (run_dir.objects(rank) / name).unlink(missing_ok=True)


def unsent(stood: list[StandIn], ops: tuple[str, ...] | None = None) -> set[int]:
    """The senders of `stood` (of its calls of `ops`, where given) whose part a run of theirs after the rank's
    may hold (`world.retrace`): those that had not run before it, had no record of the call, or made it up
    themselves."""
    return {rank for s in stood if ops is None or s.op in ops
            for rank, why in s.senders if why in (UNTRACED, UNSENT, DERIVED)}


def write_unfilled(run_dir: RunDir, rank: int, call: StandIn) -> None:
    folder = run_dir.objects(rank)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / UNFILLED, json.dumps(asdict(call)))


def _stand_in(doc: dict) -> StandIn:
    return StandIn(doc["op"], doc["desc"], tuple(doc["members"]), doc["step"], tuple(map(tuple, doc["senders"])))


def unfilled(run_dir: RunDir, ranks) -> dict[int, StandIn]:
    """Rank -> the receive of integers it held zeros in, for those of `ranks` that had one."""
    paths = {rank: run_dir.objects(rank) / UNFILLED for rank in ranks}
    return {rank: _stand_in(json.loads(path.read_text())) for rank, path in paths.items() if path.exists()}


def unfilled_note(failed: dict[int, StandIn], axes: dict[tuple[int, ...], str]) -> str | None:
    """The result's note on ranks that failed after a receive they held zeros in (`unfilled`); None where none."""
    if not failed:
        return None
    senders = sorted({rank for call in failed.values() for rank, _ in call.senders})
    said = "; ".join(call.text(axes) if len(failed) == 1 else f"rank {rank}: {call.text(axes)}"
                     for rank, call in sorted(failed.items()))
    return (f"fake backend: rank{'s' if len(failed) > 1 else ''} {rank_ranges(list(failed))} failed after a "
            f"receive of integers (a size, a count) that held zeros, what its sender sent not being known: "
            f"{said}; the error may be the fake world's, not the script's. A fake world replays what a rank "
            f"traced before the receiver sent: trace rank{'s' if len(senders) > 1 else ''} {rank_ranges(senders)} "
            f"too (--ranks)")


def read(run_dir: RunDir, ranks) -> dict[int, tuple[int, list[StandIn]]]:
    """Rank -> (how many calls kept its own integers, the first of them), for those of `ranks` that kept any."""
    out = {}
    for rank in ranks:
        path = run_dir.objects(rank) / FILE
        if path.exists():
            doc = json.loads(path.read_text())
            out[rank] = (doc["count"], [_stand_in(s) for s in doc["named"]])
    return out


def note(stood: dict[int, tuple[int, list[StandIn]]], axes: dict[tuple[int, ...], str]) -> str | None:
    """The result's note: how many calls on which ranks, the first of them by name (`StandIn.text`); None where
    none."""
    if not stood:
        return None
    total = sum(count for count, _ in stood.values())
    named, shown = [], 0
    for rank, (_, calls) in sorted(stood.items()):
        texts = [s.text(axes) for s in calls[:SHOWN - shown]]
        shown += len(texts)
        if texts:
            named.append(f"rank {rank}: {', '.join(texts)}")
    more = f"; and {total - shown} more (objects/rank<R>/{FILE})" if total > shown else ""
    return (f"fake backend: {total} call{'s' if total > 1 else ''} on rank{'s' if len(stood) > 1 else ''} "
            f"{rank_ranges(list(stood))} received integers (counts, sizes, flags) from ranks whose values were not "
            f"known, and kept the rank's own instead (zeros where its own part was of another size): "
            f"{'; '.join(named)}{more}. The sizes of the calls the function "
            f"that received them issued after them, and every later all-to-all's splits, are assumed (`assumed`); "
            f"trace the sending ranks first (--ranks) to have them replayed")
