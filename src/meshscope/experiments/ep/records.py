"""The production records of an EP run, the least the chapter says verifying MoE load costs needs: per rank the
dispatch/combine splits and bytes, rows and GEMM time per local expert, all_to_all time, aux loss; per EP group
the tokens routed, kept and dropped per expert; critical-rank step statistics.

Legend: E experts, L local experts per EP rank.
"""

from __future__ import annotations

import statistics

from ...models.moe.layer import MoELayer
from .model import capacity


def summarize(cfg, layout, outputs) -> dict:
    """The ``experts`` section from every rank's `rank_extra`.

    tokens_per_expert[g][e]: tokens expert e received in EP group g (excluding padding rows).
    """
    ext = {o.rank: o.extra for o in outputs}
    groups = layout.groups("ep")
    local = cfg.experts // cfg.ep
    by_group = lambda key: [[sum(ext[s][key][e] for s in g) for e in range(cfg.experts)] for g in groups]  # noqa: E731
    ranks = []
    for r in sorted(ext):
        send, recv = ext[r]["input_splits"], ext[r]["output_splits"]
        ranks.append({"rank": r, "ep_group": ext[r]["ep_group"], "local_experts": ext[r]["local_experts"],
                      "dispatch": a2a_record(send, recv, cfg.hidden), "combine": a2a_record(recv, send, cfg.hidden),
                      "rows_per_local_expert": ext[r]["rows_per_local_expert"], "gemm_ms": ext[r]["gemm_ms"],
                      "all_to_all_ms": statistics.median(ext[r]["all_to_all_ms"]), "aux_loss": ext[r]["aux_loss"]})
    critical = lambda key: step_stats([max(ext[r][key][s] for r in ext) for s in range(cfg.steps)])  # noqa: E731
    return {
        "ep_groups": [list(g) for g in groups],
        "tokens_per_expert": by_group("kept_E"),
        "routed_per_expert": by_group("routed_E"),
        "dropped_per_expert": by_group("dropped_E"),
        "capacity": capacity(cfg),
        "padded": cfg.pad,
        "gemm_ms_per_expert": [[ext[g[e // local]]["gemm_ms"][e % local] for e in range(cfg.experts)] for g in groups],
        "all_to_all_ms_critical_rank": critical("all_to_all_ms"),
        "step_ms_critical_rank": critical("step_ms"),
        "aux_loss": [ext[r]["aux_loss"] for r in sorted(ext)] if cfg.routing == "learned" else None,
        "ranks": ranks,
    }


def rank_extra(layer: MoELayer, routing, records, step_s) -> dict:
    """This rank's raw figures for `summarize`: routing of the captured step as a source, its splits
    and rows as an expert owner, and per-step timings."""
    return {"ep_group": list(layer.group.ranks), "local_experts": list(range(layer.first, layer.first + layer.local)),
            "routed_E": routing.routed_E, "dropped_E": routing.dropped_E, "kept_E": routing.kept_E,
            "input_splits": records[0].input_splits, "output_splits": records[0].output_splits,
            "rows_per_local_expert": records[0].rows_per_local_expert,
            "gemm_ms": [1e3 * statistics.median(r.gemm_s[l] for r in records) for l in range(layer.local)],
            "all_to_all_ms": [1e3 * r.all_to_all_s for r in records], "step_ms": [1e3 * s for s in step_s],
            "aux_loss": None if routing.aux_loss is None else routing.aux_loss.item()}


def a2a_record(input_splits, output_splits, hidden: int) -> dict:
    """Split arrays and logical bytes of one all_to_all on one rank (FP32 rows of `hidden`)."""
    row = hidden * 4
    return {"input_splits": input_splits, "output_splits": output_splits,
            "bytes_in": sum(input_splits) * row, "bytes_out": sum(output_splits) * row}


def step_stats(values_ms: list[float]) -> dict:
    """Median, nearest-rank P95/P99 and CV of per-step times (few steps: read n before trusting them)."""
    ordered = sorted(values_ms)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    mean = statistics.fmean(ordered)
    return {"n": len(ordered), "p50": statistics.median(ordered), "p95": pick(0.95), "p99": pick(0.99),
            "cv": statistics.pstdev(ordered) / mean if mean else 0.0}
