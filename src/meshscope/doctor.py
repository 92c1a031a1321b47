"""`meshscope doctor RUN_DIR`: turn flight logs into named root causes.

The seed's "生产故障诊断" and "常见错误" tables are the checklist. Every diagnosis names the mesh axis
and ranks of the group, the first divergent entry, and the cause in plain words, so that a hang is
placed on its dimension ("必须把hang或慢通信定位到具体维度") rather than on a global rank.

Evidence: ``flight/rank<R>.jsonl`` (group creations and every collective, issued and completed),
``errors/rank<R>.json``, ``spec.json`` (to rebuild the layout) and, if the run got that far,
``result.json`` (the predicted and captured ledgers of one step).

Diagnoses, in the order they are looked for:
  group-order     ranks created process groups in different orders
  missing         some ranks never issued collective #k of a group the others wait in
  mismatch        ranks issued collective #k of a group with different op, dtype, size or splits
  p2p             a send without its recv, a size mismatch, or both ends sending/receiving first
  dp-wrong-group  a gradient averaged over ranks that hold different shards
  pruned-a2a      fewer all_to_all than predicted because the tokens needed no gradient
  pp-no-grad      a pipeline stage received activations but never sent their gradients back
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import UsageError
from .events import CommEvent
from .flightlog import read

P2P = ("send", "recv")


@dataclass
class Finding:
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

    def line(self) -> str:
        where = f"{self.axis}{self.group}" if self.group else self.axis
        return f"[{self.kind}] {where} ranks {self.ranks}: {self.entry} -- {self.cause}"


@dataclass
class _Rank:
    rank: int
    groups: list[tuple[str, tuple[int, ...]]]
    issued: list[CommEvent]
    completed: set[tuple]
    issued_at: dict[tuple, float]


def _key(e: CommEvent) -> tuple:
    return (e.axis, e.group, e.seq)


def load(run_dir: Path) -> dict[int, _Rank]:
    files = sorted((run_dir / "flight").glob("rank*.jsonl"))
    if not files:
        raise UsageError(f"{run_dir} has no flight logs (flight/rank*.jsonl); is it a meshscope run directory?")
    ranks = {}
    for path in files:
        r = int(path.stem.removeprefix("rank"))
        lines = read(path)
        ranks[r] = _Rank(
            r,
            [(ln["axis"], tuple(ln["ranks"])) for ln in lines if ln["kind"] == "group"],
            [CommEvent.from_json(ln) for ln in lines if ln["kind"] == "issued"],
            {(ln["axis"], tuple(ln["group"]), ln["seq"]) for ln in lines if ln["kind"] == "completed"},
            {_key(CommEvent.from_json(ln)): ln["t"] for ln in lines if ln["kind"] == "issued"},
        )
    return ranks


def _brief(e: CommEvent) -> str:
    from .events import human_bytes

    size = human_bytes(max(e.bytes_in, e.bytes_out))
    splits = f" splits {list(e.input_splits)}->{list(e.output_splits)}" if e.input_splits is not None else ""
    where = f" in {e.region}" if e.region else ""
    return f"{e.op} {e.phase} {size}{splits}{where}"


# -- diagnoses -------------------------------------------------------------------------------------
def group_order(ranks: dict[int, _Rank]) -> list[Finding]:
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
                    "rank must follow identically (seed: 条件分支导致创建协议不同), or initialisation and "
                    "collective ordering deadlock"))
                break
    return out


def _by_group(ranks, want_p2p: bool) -> dict[tuple, dict[int, list[CommEvent]]]:
    out: dict = defaultdict(dict)
    for r, info in ranks.items():
        for e in info.issued:
            if (e.op in P2P) == want_p2p:
                out[(e.axis, e.group)].setdefault(r, []).append(e)
    return out


def collectives(ranks: dict[int, _Rank], predicted: dict | None = None) -> list[Finding]:
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
                waiting = sorted(m for m, e in have.items() if _key(e) not in ranks[m].completed)
                e = next(iter(have.values()))
                last = "; ".join(f"rank {m} last issued {_last(ranks[m])}" for m in missing)
                out.append(Finding(
                    "missing", axis, list(group), missing,
                    f"collective #{k} of {axis}{list(group)}: {_brief(e)}",
                    f"ranks {missing} never issued it while ranks {waiting or sorted(have)} "
                    f"{'wait in it' if waiting else 'did'}; {last}", _when(ranks, have)))
                break
            bad = _disagreement(have, group)
            if bad and len({e.op for e in have.values()}) > 1 and predicted:
                bad = _skipped(have, predicted.get((axis, group), {}), k) or bad
            if bad:
                out.append(Finding("mismatch", axis, list(group), bad[0], f"collective #{k} of {axis}{list(group)}: "
                                   + "; ".join(f"rank {m} {_brief(e)}" for m, e in sorted(have.items())), bad[1],
                                   _when(ranks, have)))
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


def _when(ranks, have: dict[int, CommEvent]) -> float:
    return min(ranks[m].issued_at.get(_key(e), float("inf")) for m, e in have.items())


def _last(info: _Rank) -> str:
    if not info.issued:
        return "no collective at all"
    e = info.issued[-1]
    state = "completed" if _key(e) in info.completed else "still waiting"
    return f"{_brief(e)} on {e.axis}{list(e.group)} ({state})"


def _disagreement(have: dict[int, CommEvent], group) -> tuple[list[int], str] | None:
    events = list(have.values())
    for field_, cause in (("op", "ranks issued different collectives at the same position of one group: "
                                  "a missing or extra call on some rank (seed: collective ordering)"),
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
                                    f"each other, seed: 不均衡router怎样变成split)")
        return None
    if op != "barrier" and len({e.bytes_in for e in events}) > 1:
        return sorted(have), "ranks pass tensors of different sizes to the same collective"
    return None


def p2p(ranks: dict[int, _Rank]) -> list[Finding]:
    out = []
    pairs: dict[tuple[int, int], list[CommEvent]] = defaultdict(list)
    for r, info in ranks.items():
        for e in info.issued:
            if e.op in P2P and e.peer is not None:
                pairs[(r, e.peer)].append(e)
    seen = set()
    for (a, b) in sorted(pairs):
        if (b, a) in seen or b not in ranks:
            continue
        seen.add((a, b))
        ours, theirs = pairs[(a, b)], pairs.get((b, a), [])
        sends_ab = [e for e in ours if e.op == "send"]
        recvs_ba = [e for e in theirs if e.op == "recv"]
        for k, (s, rv) in enumerate(zip(sends_ab, recvs_ba)):
            if s.bytes_in != rv.bytes_out:
                out.append(Finding("p2p", s.axis, list(s.group), [a, b],
                                   f"message #{k} {a}->{b}: send {_brief(s)}, recv {_brief(rv)}",
                                   "size mismatch between a send and its recv (seed: PP hang, shape不一致)"))
                return out
        for k in range(min(len(ours), len(theirs))):
            x, y = ours[k], theirs[k]
            stuck = _key(x) not in ranks[a].completed or _key(y) not in ranks[b].completed
            if x.op == y.op and stuck:
                verb = "send" if x.op == "send" else "receive"
                out.append(Finding("p2p", x.axis, list(x.group), [a, b],
                                   f"P2P #{k} between {a} and {b}: both {verb} first ({_brief(x)} / {_brief(y)})",
                                   f"order mismatch: both ends {verb} first and block; matching sends and receives "
                                   "must be issued in complementary order (seed: send/recv顺序不一致)"))
                return out
        for src, dst, sends, recvs in ((a, b, sends_ab, recvs_ba),
                                       (b, a, [e for e in theirs if e.op == "send"], [e for e in ours if e.op == "recv"])):
            if len(sends) != len(recvs):
                hung = [e for e in (sends + recvs) if _key(e) not in ranks[e.rank].completed]
                if hung or len(sends) > len(recvs):
                    out.append(Finding("p2p", (sends or recvs)[0].axis, list((sends or recvs)[0].group), [src, dst],
                                       f"{len(sends)} sends {src}->{dst}, {len(recvs)} receives",
                                       "a send without the matching recv (or the reverse): one side waits forever"))
                    return out
    return out


def pp_no_grad(ranks: dict[int, _Rank]) -> list[Finding]:
    out = []
    for r, info in sorted(ranks.items()):
        got = defaultdict(int)
        sent_back = defaultdict(int)
        for e in info.issued:
            if e.axis != "pp" or e.peer is None:
                continue  # only pipeline-boundary traffic carries activations and their gradients
            if e.op == "recv" and e.phase == "forward":
                got[e.peer] += 1
            if e.op == "send" and e.phase == "backward":
                sent_back[e.peer] += 1
        for peer, n in got.items():
            if sent_back[peer] == 0 and _has_backward_sends(ranks, r):
                out.append(Finding("pp-no-grad", "pp", sorted([r, peer]), [r],
                                   f"rank {r} received {n} activations from rank {peer} and sent no gradient back",
                                   "plain send/recv does not connect autograd across processes: the receiving stage "
                                   "must send the activation gradient back and the sender call backward with it "
                                   "(seed: PP反向无gradient)"))
    return out


def _has_backward_sends(ranks, r) -> bool:
    """Whether the run reached backward at all (otherwise missing gradients are not the cause)."""
    return any(e.phase in ("backward", "optimizer") for info in ranks.values() for e in info.issued)


def dp_wrong_group(ranks: dict[int, _Rank], layout) -> list[Finding]:
    if layout is None:
        return []
    out = []
    for r, info in sorted(ranks.items()):
        for e in info.issued:
            if e.op != "all_reduce" or ".grad_sync" not in e.region:
                continue
            axis = e.region.split(".grad_sync")[0]
            valid = layout.groups(axis)
            if list(e.group) not in valid:
                differ = _sharded_axes(layout, e.group)
                param = e.region.split(":", 1)[-1]
                out.append(Finding(
                    "dp-wrong-group", e.axis, list(e.group), [r],
                    f"gradient of {param} averaged over {e.axis}{list(e.group)}",
                    f"these ranks hold different shards (their {', '.join(differ) or 'coordinates'} differ); "
                    f"the {axis} group of rank {r} is {layout.group_of(axis, r)} (seed: 把不同TP shard放进同一个DP group)"))
                return out
    return out


def _sharded_axes(layout, group) -> list[str]:
    coords = [layout.coords(r) for r in group]
    return [a for a in ("tp", "cp", "pp", "ep", "etp") if len({c[a] for c in coords}) > 1]


def pruned_a2a(result: dict | None) -> list[Finding]:
    if not result or "comm" not in result or "events" not in result["comm"]:
        return []
    pred = [CommEvent.from_json(e) for e in result["comm"]["events"]["predicted"]]
    capt = [CommEvent.from_json(e) for e in result["comm"]["events"]["captured"]]
    out = []
    for r in sorted({e.rank for e in pred}):
        p = [e for e in pred if e.rank == r and e.op == "all_to_all" and e.phase == "backward"]
        c = [e for e in capt if e.rank == r and e.op == "all_to_all" and e.phase == "backward"]
        if len(c) < len(p):
            missing = [e for e in p if e.region not in {x.region for x in c}] or p[len(c):]
            e = missing[0]
            out.append(Finding(
                "pruned-a2a", e.axis, list(e.group), [r],
                f"{len(p)} backward all_to_all predicted, {len(c)} issued; missing: {_brief(e)}",
                "the tokens entering the dispatch need no gradient, so autograd pruned the reverse dispatch: "
                "legal, not a lost NCCL call (seed: 为什么初版MoE只有3个SendRecv); give the upstream activation "
                "requires_grad if its gradient is wanted"))
    return out


def _first_experiment(run_dir: Path):
    """(experiment, config) of the run's first experiment, from spec.json; None if unreadable."""
    try:
        spec = json.loads((run_dir / "spec.json").read_text())
        from . import experiments

        item = spec["experiments"][0]
        exp = experiments.get(item["name"])
        return exp, exp.config(item.get("overrides", {}))
    except (OSError, KeyError, IndexError, ValueError):
        return None


def _plan(first) -> dict | None:
    """Predicted collective ops of one step, per group and rank (P2P excluded)."""
    if first is None:
        return None
    exp, cfg = first
    out: dict = defaultdict(lambda: defaultdict(list))
    for e in sorted(exp.predict(cfg), key=lambda e: (e.rank, e.axis, e.group, e.seq)):
        if e.op not in P2P:
            out[(e.axis, e.group)][e.rank].append(e.op)
    return out


def diagnose(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    ranks = load(run_dir)
    result = None
    if (run_dir / "result.json").exists():
        result = json.loads((run_dir / "result.json").read_text())
        result = result["results"][0] if "results" in result else result
    first = _first_experiment(run_dir)
    layout = first[0].layout(first[1]) if first else None
    findings = group_order(ranks) or (collectives(ranks, _plan(first)) + p2p(ranks)) or pp_no_grad(ranks)
    findings += dp_wrong_group(ranks, layout) + pruned_a2a(result)
    findings.sort(key=lambda f: f.t)
    errors = []
    for path in sorted((run_dir / "errors").glob("rank*.json")):
        err = json.loads(path.read_text())
        errors.append({"rank": err["rank"], "error": err["error"]})
    return {"run_dir": str(run_dir), "ranks": sorted(ranks), "healthy": not findings and not errors,
            "findings": [{k: v for k, v in asdict(f).items() if k != "t"} | {"summary": f.line()} for f in findings],
            "errors": errors}
