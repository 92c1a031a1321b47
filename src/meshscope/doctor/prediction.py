"""Diagnoses that need the experiment itself: its layout (which ranks hold which shard) and its
predicted ledger of one step.

dp-wrong-group: a gradient sync whose group is not the layout's group of that axis, i.e. ranks
holding different shards averaged together (chapter Q2: why rank0 and rank1 cannot sync the same
parameter shard gradient). pruned-a2a: fewer backward all_to_all captured than predicted because
autograd pruned the reverse dispatch (chapter Q22: why the first MoE had only 3 SendRecv kernels),
read from result.json.
"""

from __future__ import annotations

from collections import defaultdict

from ..core.events import CommEvent
from ..core.result import RunResult
from ..core.findings import Finding
from .evidence import RankLog, brief


def dp_wrong_group(ranks: dict[int, RankLog], layout) -> list[Finding]:
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
                    f"the {axis} group of rank {r} is {layout.group_of(axis, r)} (see docs/chapter.md, Q2)"))
                return out
    return out


def _sharded_axes(layout, group) -> list[str]:
    coords = [layout.coords(r) for r in group]
    return [a for a in ("tp", "cp", "pp", "ep", "etp") if len({c[a] for c in coords}) > 1]


def pruned_a2a(result: RunResult) -> list[Finding]:
    """Fewer backward all_to_all captured than predicted, per EP group (from result.json's ledgers)."""
    ledgers = {"predicted": [e for e in result.predicted if e.op == "all_to_all"],
               "captured": [e for e in result.captured if e.op == "all_to_all"]}
    short: dict[tuple, list[int]] = defaultdict(list)
    first: dict[tuple, tuple[CommEvent, int, int]] = {}
    for r in sorted({e.rank for e in ledgers["predicted"]}):
        pred, capt = ([e for e in ledgers[k] if e.rank == r] for k in ("predicted", "captured"))
        back = {k: [e for e in v if e.phase == "backward"] for k, v in (("p", pred), ("c", capt))}
        if len(back["c"]) < len(back["p"]):
            issued = {e.region for e in back["c"]}
            e = next((e for e in back["p"] if e.region not in issued), back["p"][len(back["c"])])
            short[(e.axis, e.group)].append(r)
            first.setdefault((e.axis, e.group), (e, len(pred), len(capt)))
    out = []
    for (axis, group), members in short.items():
        e, n_pred, n_capt = first[(axis, group)]
        out.append(Finding(
            "pruned-a2a", axis, list(group), members,
            f"{n_pred} all_to_all predicted per step, {n_capt} issued; missing: {brief(e)}",
            "the tokens entering the dispatch need no gradient, so autograd pruned the reverse dispatch while the "
            "prediction assumed they require grad: legal, not a lost NCCL call (see docs/chapter.md, Q22); "
            "give the upstream activation requires_grad if its gradient is wanted, or predict without it"))
    return out
