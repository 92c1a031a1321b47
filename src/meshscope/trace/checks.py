"""Checks of a traced job that need no prediction, each named after the mistake it catches.

- ``group members agree``: every member of a group issued the same ordered sequence of calls on it,
  each agreeing as `core.agreement` says (the doctor's rule too: op, dtype, sizes, root, splits):
  collective ordering, a conditional collective, a shape that differs by rank;
- ``every send has its recv``: the sends from a to b and the receives at b from a pair up in order
  and size (pipeline P2P order, a stage that skips its gradient);
- ``all-to-all splits mirror``: what member i sends to j is what j receives from i, per call (split
  sizes computed differently on two ranks); splits a side assumed (a fake world's) are not checked;
- ``steady steps repeat``: from the first steady step on (`core.steady`: after step 0's set-up and the
  warm-up the calls show, such as DDP's bucket rebuild), every complete step issues what that step
  did; all-to-all splits that change are reported as routing, anything else as the first divergent
  call; steps that never repeat twice in a row, over enough steps to tell, fail it;
- ``mesh axes partition the world``: the groups of each mesh axis are disjoint and cover the ranks
  traced (named non-mesh groups such as Megatron's embedding groups are exempt).

Only the ranks traced take part; with some ranks missing (a fake world's representatives, a rank
that died) a check says which groups it could not see whole. A check with nothing to look at (no
point-to-point call, fewer than two steady steps, no mesh axis) is ``not_checked``, saying why: it
never reads as a pass (`core.result.Check`).
"""

from __future__ import annotations

from collections import defaultdict

from ..core.agreement import disagreement
from ..core.axes import is_mesh_axis
from ..core.events import P2P, CommEvent, by_group
from ..core.result import Check
from ..core.steady import MIN_RUN, WARMUP_LIMIT, Steady, same_call


def _brief(e: CommEvent) -> str:
    return f"{e.op} {e.dtype} {e.bytes_in}->{e.bytes_out} B (step {e.step}, {e.phase}{', ' + e.region if e.region else ''})"


def _by_group(events, p2p: bool) -> dict[tuple[str, tuple[int, ...]], dict[int, list[CommEvent]]]:
    """(axis, group) -> member rank -> its calls there in issue order (`events.by_group`), P2P or not."""
    out: dict = defaultdict(dict)
    for (rank, axis, group), calls in by_group(events).items():
        calls = [e for e in calls if (e.op in P2P) == p2p]
        if calls:
            out[(axis, group)][rank] = calls
    return out


def group_agreement(events, traced: set[int], finished: set[int] | None = None) -> Check:
    """Call #k of every group, member against member, by the one rule of `core.agreement`. A rank that
    did not finish (`finished`: those that did; None: all) lacks the calls after its end, which is its
    failure, not a disagreement: only its calls are compared."""
    name = "group members agree"
    finished = traced if finished is None else finished
    groups, partial, cut = 0, 0, 0
    for (axis, group), per_rank in sorted(_by_group(events, p2p=False).items()):
        groups += 1
        members = [m for m in group if m in traced]
        partial += len(members) < len(group)
        calls = {m: per_rank.get(m, []) for m in members}
        for k in range(max(len(c) for c in calls.values())):
            have = {m: c[k] for m, c in calls.items() if k < len(c)}
            lacking = [m for m in members if m not in have]
            cut += bool(lacking) and not any(m in finished for m in lacking)
            lacking = [m for m in lacking if m in finished]
            if lacking:
                m = min(have)
                return Check(name, False, f"{axis}{list(group)} call #{k}: rank {m} issued {_brief(have[m])}, rank "
                                          f"{lacking[0]} issued no call #{k}")
            bad = disagreement(group, have) if len(have) > 1 else None
            if bad is not None:
                a, b = bad.ranks[0], bad.ranks[-1]
                return Check(name, False, f"{axis}{list(group)} call #{k}: rank {a} issued {_brief(have[a])}, rank {b} "
                                          f"{_brief(have[b])}: {bad.cause}")
    if not groups:
        return Check.not_checked(name, "no collective on any group: nothing to compare")
    seen = f" ({partial} seen only in part: not every member was traced)" if partial else ""
    ended = f"; {cut} calls past the end of a rank that did not finish were not compared" if cut else ""
    return Check(name, True, f"{groups} group{'s' if groups != 1 else ''}, every member issued the same ops, dtypes "
                             f"and sizes in order{seen}{ended}")


def p2p_pairs(events, traced: set[int]) -> Check:
    name = "every send has its recv"
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    for e in sorted(events, key=lambda e: (e.rank, e.t_issue or 0, e.seq)):
        if e.op == "send":
            sends[(e.rank, e.peer)].append(e)
        elif e.op == "recv":
            recvs[(e.peer, e.rank)].append(e)
    pairs = sorted(set(sends) | set(recvs), key=lambda p: (p[0] if p[0] is not None else -1, p[1] or -1))
    checked = 0
    for src, dst in pairs:
        if src not in traced or dst not in traced or src == -1:
            continue
        s, r = sends.get((src, dst), []), recvs.get((src, dst), [])
        checked += 1
        for k in range(max(len(s), len(r))):
            if k >= len(s):
                return Check(name, False, f"rank {dst} receives #{k} from rank {src} ({_brief(r[k])}) that rank {src} "
                                          f"never sends")
            if k >= len(r):
                return Check(name, False, f"rank {src} sends #{k} to rank {dst} ({_brief(s[k])}) that rank {dst} "
                                          f"never receives")
            if s[k].bytes_in != r[k].bytes_out:
                return Check(name, False, f"message #{k} from rank {src} to rank {dst}: {s[k].bytes_in} B sent, "
                                          f"{r[k].bytes_out} B expected by the receiver")
    if not checked:
        return Check.not_checked(name, "no point-to-point calls between traced ranks")
    total = sum(len(v) for v in sends.values())
    return Check(name, True, f"{total} sends over {checked} rank pairs, each received in order with its size")


def a2a_mirror(events, traced: set[int]) -> Check:
    name = "all-to-all splits mirror"
    calls, assumed = 0, 0
    for (axis, group), per_rank in sorted(_by_group(events, p2p=False).items()):
        members = [m for m in group if m in traced]
        if len(members) < len(group):
            continue
        a2a = {m: [e for e in per_rank.get(m, []) if e.op == "all_to_all"] for m in group}
        for k in range(min(len(v) for v in a2a.values())):
            calls += 1
            for i, src in enumerate(group):
                for j, dst in enumerate(group):
                    x, y = a2a[src][k], a2a[dst][k]
                    if "input_splits" in x.assumed or "output_splits" in y.assumed:
                        assumed += 1
                        continue
                    sent, got = x.input_splits, y.output_splits
                    if sent is None or got is None:
                        continue
                    if sent[j] != got[i]:
                        return Check(name, False, f"{axis}{list(group)} all_to_all #{k} (step {a2a[src][k].step}): "
                                                  f"rank {src} sends {sent[j]} rows to rank {dst}, which expects {got[i]}")
    if calls and assumed:
        return Check(name, True, f"{calls} all_to_all calls; {assumed} sender-receiver pairs not checked: their "
                                 "splits are assumed (a fake world)")
    if not calls:
        return Check.not_checked(name, "no all_to_all among fully traced groups")
    return Check(name, True, f"{calls} all_to_all calls, every pair's splits mirror")


def steady_steps(events, steady: dict[int, Steady]) -> Check:
    """Every rank's steady steps (`core.steady`, found from its calls) issue what its first steady step
    did, call for call; `steady`: rank -> its steady steps."""
    name = "steady steps repeat"
    per_rank: dict[int, dict[int, list[CommEvent]]] = {r: defaultdict(list) for r in steady}
    for e in events:
        if e.rank in per_rank and e.step is not None:
            per_rank[e.rank][e.step].append(e)
    routing, compared = [], []
    for rank, s in sorted(steady.items()):
        steps = per_rank[rank]
        if s.first is None:
            if s.decided:
                sizes = ", ".join(str(len(steps.get(k, []))) for k in range(1, min(s.complete, 9)))
                return Check(name, False, f"rank {rank}'s steps never repeat: of its {s.complete} complete steps, no "
                                          f"{MIN_RUN} in a row after step 0 issued the same calls (calls in steps 1 on: "
                                          f"{sizes}{', ...' if s.complete > 9 else ''})")
            continue
        compared.append(rank)
        ref = steps.get(s.first, [])
        for k in s.steps[1:]:
            cur = steps.get(k, [])
            for i in range(max(len(ref), len(cur))):
                if i >= len(ref) or i >= len(cur):
                    extra = cur[i] if i < len(cur) else ref[i]
                    return Check(name, False, f"rank {rank} step {k} issued {len(cur)} calls, steady step {s.first} "
                                              f"{len(ref)}; first unmatched: {_brief(extra)}")
                if same_call(ref[i]) != same_call(cur[i]):
                    return Check(name, False, f"rank {rank} step {k} call {i} is {_brief(cur[i])} where steady step "
                                              f"{s.first} issued {_brief(ref[i])}")
                if ref[i].op == "all_to_all" and (ref[i].input_splits, ref[i].output_splits, ref[i].bytes_in) != (
                        cur[i].input_splits, cur[i].output_splits, cur[i].bytes_in):
                    routing.append(k)
    if not compared:
        most = max((s.complete for s in steady.values()), default=0)
        return Check.not_checked(name, f"{most} complete steps, and no {MIN_RUN} in a row after step 0 issued the same "
                                       f"calls: trace more steps (a warm-up of up to {WARMUP_LIMIT} steps is skipped)")
    why = f"; all_to_all splits changed with the routing in steps {sorted(set(routing))}" if routing else ""
    spans = sorted({(steady[r].first, steady[r].complete - 1) for r in compared})
    span = ", ".join(f"{a}-{b}" for a, b in spans)
    return Check(name, True, f"steady steps {span} on each of {len(compared)} ranks: each issued the same calls as its "
                             f"first steady step{why}")


def axes_partition(axes: dict[str, list[list[int]]], traced: set[int], world: int) -> Check:
    name = "mesh axes partition the world"
    mesh = {a: gs for a, gs in axes.items() if is_mesh_axis(a)}
    for axis, groups in sorted(mesh.items()):
        seen: dict[int, list[int]] = {}
        for g in groups:
            for r in g:
                if r in seen:
                    return Check(name, False, f"rank {r} is in two {axis} groups: {seen[r]} and {g}")
                seen[r] = g
        missing = sorted(traced - set(seen))
        if missing and len(traced) == world:
            return Check(name, False, f"the {axis} groups {groups} leave out ranks {missing}")
    exempt = sorted(set(axes) - set(mesh))
    if not mesh:
        return Check.not_checked(name, "no mesh axis among the groups used" + (f" (not mesh axes: {', '.join(exempt)})"
                                                                               if exempt else ""))
    return Check(name, True, f"{len(mesh)} mesh axes ({', '.join(sorted(mesh)) or 'none'}), each a partition"
                 + (f"; not mesh axes: {', '.join(exempt)}" if exempt else ""))


def run_all(events, axes, traced: set[int], world: int, steady: dict[int, Steady],
            finished: set[int] | None = None) -> list[Check]:
    return [group_agreement(events, traced, finished), p2p_pairs(events, traced), a2a_mirror(events, traced),
            steady_steps(events, steady), axes_partition(axes, traced, world)]
