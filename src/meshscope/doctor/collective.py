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

from ..core.agreement import disagreement
from ..core.axes import axis_of
from ..core.events import P2P, CommEvent
from ..core.findings import Finding
from .evidence import RankLog, blocked_in, brief, issued_at, key, last_call


def group_order(ranks: dict[int, RankLog]) -> list[Finding]:
    """Ranks whose group creations differ from the lowest rank's: in order (the same groups created in
    another order) or in members (a group the others create with other ranks, or not at all). A
    traced job's own record of every ``new_group`` call is used where the directory has it."""
    if all(info.created is not None for info in ranks.values()):
        return _creations_differ(ranks)
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


def _creations_differ(ranks: dict[int, RankLog]) -> list[Finding]:
    def seq(info):
        return [c for c in info.created if not c["local"]]  # members-only creation is no global protocol

    def label(c):
        return f"{c['desc'] or 'a group'}{c['ranks']}"

    ref = ranks[min(ranks)]
    out = []
    for r, info in sorted(ranks.items()):
        mine, theirs = seq(info), seq(ref)
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if _same(a) == _same(b):
                continue
            # one of the two created elsewhere in the other's sequence (a rank stuck at a creation never
            # reached the rest of its own)
            reordered = _same(a) in {_same(c) for c in theirs} or _same(b) in {_same(c) for c in mine}
            stuck = "; ".join(f"rank {q} is stuck creating {label(c)}" for q, c in ((r, a), (ref.rank, b))
                              if not c["done"])
            entry = f"new_group #{i}: rank {r} created {label(a)}, rank {ref.rank} created {label(b)}"
            if reordered:
                cause = ("ranks create the same groups in different orders (a creation under a rank-dependent "
                         "condition): group creation is a global protocol that every rank must follow "
                         "identically, member or not, or the groups pair up wrongly and initialisation and "
                         "collectives deadlock (see docs/chapter.md, Q3)")
            else:
                cause = (f"ranks build their groups with different members or sizes: rank {r} a group of "
                         f"{len(a['ranks'])} {a['ranks']}, rank {ref.rank} a group of {len(b['ranks'])} {b['ranks']} "
                         f"(a size computed differently on some ranks, e.g. from a per-rank setting); every rank "
                         f"must pass the same rank lists to new_group, in the same order")
            out.append(Finding("group-order" if reordered else "group-members", axis_of(a["desc"]), a["ranks"],
                               sorted({r, ref.rank}), entry + (f" ({stuck})" if stuck else ""), cause,
                               min(a["t"], b["t"])))
            break
    return out


def _same(creation: dict) -> tuple:
    """What makes two ranks' creations the same group: its description and members."""
    return creation["desc"], tuple(creation["ranks"])


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
                # A missing rank that finished the call's step without it diverged then, perhaps before a
                # slow peer issued it (DDP's unused parameters under load: the skipping rank went on and
                # raised at its next forward before the other issued the bucket it waits in).
                passed = [p for m in missing if (p := ranks[m].passed(e.step)) is not None]
                if passed and not blocks:
                    t = min(t, *passed)
                plain = (f"ranks {missing} never issued it while ranks {waiting or sorted(have)} "
                         f"{'wait in it' if waiting else 'did'}; {last}")
                kind, cause = _unused_parameters(ranks, lists, e, missing) or ("missing", plain)
                out.append(Finding(kind, axis, list(group), missing, f"collective #{k} of {axis}{list(group)}: {brief(e)}",
                                   cause, t, derived=bool(blocks)))
                break
            bad = disagreement(group, have)
            if bad is not None:
                skipped = _skipped(have, predicted.get((axis, group), {}), k) if bad.field == "op" and predicted else None
                who, cause = skipped or (bad.ranks, bad.cause)
                out.append(Finding("mismatch", axis, list(group), who, f"collective #{k} of {axis}{list(group)}: "
                                   + "; ".join(f"rank {m} {brief(e)}" for m, e in sorted(have.items())), cause,
                                   issued_at(ranks, *have.values())))
                break
    return out


def _unused_parameters(ranks, lists: dict[int, list[CommEvent]], e: CommEvent, missing: list[int]):
    """(kind, cause) when the missing call is a gradient all-reduce of a backward that the missing ranks
    went through with fewer such calls: DDP's unused-parameter hang. None otherwise."""
    if e.op != "all_reduce" or e.phase != "backward" or e.step is None:  # no steps: meshscope's own runs
        return None
    counts = {m: sum(1 for c in v if c.step == e.step and c.phase == "backward" and c.op == "all_reduce")
              for m, v in lists.items()}
    short = [m for m in missing if ranks[m].steps_done > e.step]  # it stepped past that backward
    if not short:
        return None
    full = max(counts, key=counts.get)
    m = short[0]
    return "ddp-unused", (
        f"in step {e.step}'s backward rank {m} issued {counts[m]} gradient all-reduces on this group and rank "
        f"{full} {counts[full]}: their backward passes reached different sets of parameters (a branch taken on "
        f"some ranks only). DDP with find_unused_parameters=False reduces a bucket once every parameter in it has "
        f"its gradient, so the ranks without one never issue that bucket's all-reduce and the others wait in it; "
        f"make every rank use every parameter, or pass find_unused_parameters=True; rank {m} last issued "
        f"{last_call(ranks[m])}")


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
