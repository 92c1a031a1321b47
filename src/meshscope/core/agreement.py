"""What the members of one collective must agree on: the one rule that the trace's ``group members
agree`` check and the doctor's ``mismatch`` finding both apply to call #k of a group.

Every member names the same op and dtype. Beyond that, what must match depends on the op, since the
logical bytes a rank records are its own (`core.events`):

- all_reduce, all_gather, reduce_scatter: every member's input and output bytes (torch requires one
  size per member: c10d's ``allgather`` checks it, NCCL hangs or corrupts without it);
- broadcast and reduce: the root, and each member's tensor (the root's is the others');
- gather: the root, and each member's own tensor; the root's output list holds one such tensor per
  member, the others receive nothing;
- scatter: the root, and each member's own tensor (its output); the root's input list holds one such
  tensor per member, the others send nothing. The root's list is not "a different size":
  ``distribute_tensor`` scatters every DTensor this way (torch 2.13,
  torch/distributed/tensor/_api.py), and a rule that compared input bytes blamed every healthy job;
- all_to_all: the split sizes mirror (what i sends to j is what j expects from i); the bytes differ
  by design when the splits are uneven;
- barrier: nothing more.

A field either side marks as assumed (`CommEvent.assumed`: a fake world's) is not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import ROOTED, CommEvent


@dataclass(frozen=True)
class Disagreement:
    """Call #k of a group, issued differently: what differs, between which members, in plain words."""

    field: str
    """``op``, ``dtype``, ``root``, ``size`` or ``splits``."""
    ranks: list[int]
    cause: str


def _known(e: CommEvent, *names: str) -> bool:
    return not any(n in e.assumed for n in names)


def disagreement(group: tuple[int, ...], calls: dict[int, CommEvent]) -> Disagreement | None:
    """How the members' call #k on `group` disagree (`calls`: member -> its call), None if it does not."""
    members = sorted(calls)
    events = [calls[m] for m in members]
    ops = {e.op for e in events}
    if len(ops) > 1:
        return Disagreement("op", members, "ranks issued different collectives at the same position of one "
                            "group: a missing or extra call on some rank (see docs/chapter.md, Faults the doctor names)")
    op = events[0].op
    if op == "barrier":
        return None
    if len({e.dtype for e in events}) > 1:
        return Disagreement("dtype", members, "ranks pass tensors of different dtypes to the same collective")
    if op == "all_to_all":
        return _splits(group, calls)
    if op in ROOTED:
        return _rooted(op, calls)
    for name in ("bytes_in", "bytes_out"):
        sizes = {getattr(e, name) for e in events if _known(e, name)}
        if len(sizes) > 1:
            return Disagreement("size", members, "ranks pass tensors of different sizes to the same collective")
    return None


def _splits(group, calls: dict[int, CommEvent]) -> Disagreement | None:
    for i, ei in calls.items():
        for j, ej in calls.items():
            if ei.input_splits is None or ej.output_splits is None or not (_known(ei, "input_splits")
                                                                           and _known(ej, "output_splits")):
                continue
            gi, gj = group.index(i), group.index(j)
            if ei.input_splits[gj] != ej.output_splits[gi]:
                return Disagreement("splits", [i, j], (
                    f"split sizes disagree: rank {i} sends {ei.input_splits[gj]} rows to rank {j}, which expects "
                    f"{ej.output_splits[gi]} (input_splits/output_splits must mirror each other; see "
                    f"docs/chapter.md, Q20 and Q21)"))
    return None


OWN = {"broadcast": "bytes_in", "reduce": "bytes_in", "gather": "bytes_in", "scatter": "bytes_out"}
"""The field holding each member's own tensor of a rooted op."""

LIST = {"gather": "bytes_out", "scatter": "bytes_in"}
"""The field holding the root's list of one tensor per member."""


def _rooted(op: str, calls: dict[int, CommEvent]) -> Disagreement | None:
    members = sorted(calls)
    roots = {calls[m].peer for m in members}
    if len(roots) > 1:
        return Disagreement("root", members, "ranks name different roots for the same "
                            f"{op}: " + ", ".join(f"rank {m} root {calls[m].peer}" for m in members))
    own = OWN[op]
    sizes = {getattr(calls[m], own) for m in members if _known(calls[m], own)}
    if len(sizes) > 1:
        return Disagreement("size", members, f"ranks pass tensors of different sizes to the same {op}")
    root = next(iter(roots))
    if op in LIST and root in calls and sizes and _known(calls[root], LIST[op]):
        listed, each = getattr(calls[root], LIST[op]), next(iter(sizes))
        n = len(calls[root].group)
        if listed != n * each:
            return Disagreement("size", members, (
                f"the root's {op} list of {listed} B is not one {each} B tensor for each of the {n} members"))
    return None
