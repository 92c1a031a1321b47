"""Diagnoses of group creation and of collectives: who is missing from collective #k of a group,
and who issued it differently (op, dtype, size, all_to_all splits).

Collectives of one group must be issued by every member in the same order with matching
arguments (the chapter's common mistakes: collective ordering, group creation that differs under a
rank-dependent branch, split arrays that do not mirror each other; docs/chapter.md Q3, Q21 and
"Faults the doctor names"): position k of each member's sequence on a group is compared across the
members.
"""

from __future__ import annotations

from collections import defaultdict

from ..core.events import CommEvent
from .evidence import P2P, Finding, RankLog, blocked_in, brief, issued_at, key, last_call


def group_order(ranks: dict[int, RankLog]) -> list[Finding]:
    ref = ranks[min(ranks)]
    out = []
    for r, info in sorted(ranks.items()):
        for i, (mine, theirs) in enumerate(zip(info.groups, ref.groups)):
            if mine != theirs:
                out.append(Finding(
                    "group-order", mine[0], list(mine[1]), [r],
                    f"new_group #{i}: rank {r} created {mine[0]}{list(mine[1])}, rank {ref.rank} created "
                    f"{theirs[0]}{list(theirs[1])}",
                    "ranks call new_group in different orders; group creation is a global protocol that every "
                    "rank must follow identically, whatever branch it takes, or initialisation and collective "
                    "ordering deadlock (see docs/chapter.md, Q3)"))
                break
    return out


def _by_group(ranks, want_p2p: bool) -> dict[tuple, dict[int, list[CommEvent]]]:
    out: dict = defaultdict(dict)
    for r, info in ranks.items():
        for e in info.issued:
            if (e.op in P2P) == want_p2p:
                out[(e.axis, e.group)].setdefault(r, []).append(e)
    return out


def collectives(ranks: dict[int, RankLog], predicted: dict | None = None) -> list[Finding]:
    """`predicted`: {(axis, group): {rank: [op, ...]}} of one step, to tell which rank skipped a call."""
    out = []
    for (axis, group), per_rank in sorted(_by_group(ranks, False).items()):
        members = [m for m in group if m in ranks]
        lists = {m: per_rank.get(m, []) for m in members}
        longest = max(len(v) for v in lists.values())
        for k in range(longest):
            have = {m: v[k] for m, v in lists.items() if k < len(v)}
            missing = sorted(set(members) - set(have))
            if missing:
                waiting = sorted(m for m, e in have.items() if key(e) not in ranks[m].completed)
                e = next(iter(have.values()))
                last = "; ".join(f"rank {m} last issued {last_call(ranks[m])}" for m in missing)
                # Missing ranks blocked elsewhere never got here: date the wait by their blocks.
                blocks = [c for c in map(lambda m: blocked_in(ranks, m), missing) if c is not None]
                t = max([issued_at(ranks, *have.values())] + [issued_at(ranks, c) for c in blocks])
                out.append(Finding(
                    "missing", axis, list(group), missing,
                    f"collective #{k} of {axis}{list(group)}: {brief(e)}",
                    f"ranks {missing} never issued it while ranks {waiting or sorted(have)} "
                    f"{'wait in it' if waiting else 'did'}; {last}", t, derived=bool(blocks)))
                break
            bad = _disagreement(have, group)
            if bad and len({e.op for e in have.values()}) > 1 and predicted:
                bad = _skipped(have, predicted.get((axis, group), {}), k) or bad
            if bad:
                out.append(Finding("mismatch", axis, list(group), bad[0], f"collective #{k} of {axis}{list(group)}: "
                                   + "; ".join(f"rank {m} {brief(e)}" for m, e in sorted(have.items())), bad[1],
                                   issued_at(ranks, *have.values())))
                break
    return out


def _skipped(have: dict[int, CommEvent], plan: dict[int, list[str]], k: int) -> tuple[list[int], str] | None:
    """Ranks whose call #k is not the predicted one while the others' is: they skipped (or added) a call."""
    expected = {m: plan[m][k % len(plan[m])] for m in have if plan.get(m)}
    off = sorted(m for m, e in have.items() if m in expected and e.op != expected[m])
    if not off or len(off) == len(have):
        return None
    m = off[0]
    return off, (f"rank {m} issued {have[m].op} where {expected[m]} was predicted, while its peers issued "
                 f"{expected[m]}: rank {m} skipped that collective (a call made on some ranks only, e.g. under a "
                 f"rank-dependent branch)")


def _disagreement(have: dict[int, CommEvent], group) -> tuple[list[int], str] | None:
    events = list(have.values())
    for field_, cause in (("op", "ranks issued different collectives at the same position of one group: "
                                  "a missing or extra call on some rank (see docs/chapter.md, Faults the doctor names)"),
                          ("dtype", "ranks reduce tensors of different dtypes")):
        values = {getattr(e, field_) for e in events}
        if len(values) > 1:
            return sorted(have), cause
    op = events[0].op
    if op == "all_to_all":
        for i, ei in have.items():
            for j, ej in have.items():
                gi, gj = group.index(i), group.index(j)
                if ei.input_splits and ej.output_splits and ei.input_splits[gj] != ej.output_splits[gi]:
                    return [i, j], (f"split sizes disagree: rank {i} sends {ei.input_splits[gj]} rows to rank {j}, "
                                    f"which expects {ej.output_splits[gi]} (input_splits/output_splits must mirror "
                                    f"each other; see docs/chapter.md, Q20 and Q21)")
        return None
    if op != "barrier" and len({e.bytes_in for e in events}) > 1:
        return sorted(have), "ranks pass tensors of different sizes to the same collective"
    return None
