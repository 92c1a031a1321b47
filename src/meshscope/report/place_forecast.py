"""How `meshscope place --from-trace DIR --cluster SPEC` shows a `place.forecast_ranking.ForecastRanking`: the
placements best first, each with its forecast step and, per axis, the pacing class's exposed communication; or one
JSON document with the same."""

from __future__ import annotations

from ..place.forecast_ranking import ForecastPlacement, ForecastRanking

RANKED_BY = ("the forecast's job step (meshscope forecast's timeline: compute as traced, each call on the cluster's "
             "links by NCCL's cost model, the slowest rank class's step), under each placement's node map")
"""What orders the placements, in words (text and ``--json``)."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _notes(r: ForecastRanking) -> list[str]:
    """Every placement's forecast notes, each once, in order."""
    return list(dict.fromkeys(n for p in r.placements for n in p.forecast.notes))


def _axes(p: ForecastPlacement) -> dict:
    return {a.axis: {"calls": a.calls, "bytes": a.bytes, "seconds": a.seconds, "exposed_s": a.exposed_s,
                     "waiting_for_peers_s": a.waiting_for_peers_s, "crossing_calls": p.crossing.get(a.axis, 0)}
            for a in p.critical.axes}


def to_json(r: ForecastRanking) -> dict:
    """The `place --from-trace DIR --cluster SPEC --json` document."""
    best = r.placements[0]
    return {
        "kind": "place-forecast", "ranked_by": RANKED_BY, "run_dir": str(r.job.run_dir), "step": r.job.step,
        "layout": r.layout.brief(), "cluster": r.cluster.to_json(), "gpus_per_node": r.gpus_per_node,
        "nodes": r.layout.world // r.gpus_per_node, "compute_source": best.forecast.compute_source,
        "orders": r.orders, "skipped_orders": list(r.skipped_orders), "unpaired_orders": list(r.unpaired_orders),
        "seconds": r.seconds,
        "placements": [{
            "rank": i + 1, "order": p.order, "orders": list(p.orders), "traced": r.layout.order in p.orders,
            "step_s": p.step_s, "critical_rank": p.forecast.critical_rank, "axes": _axes(p),
            "classes": [{"rank": c.rank, "ranks": c.ranks, "step_s": c.step_s, "compute_s": c.compute_s,
                         "exposed_s": c.exposed_s} for c in p.forecast.classes],
        } for i, p in enumerate(r.placements)],
        "notes": _notes(r),
    }


def render(r: ForecastRanking, limit: int = 20) -> str:
    """The ranking as text: what ranked it, then the best `limit` placements, each against the trace's own."""
    lay, net = r.layout, r.cluster.network
    sizes = ", ".join(f"{a} {n}" for a, n in lay.sizes.items() if n > 1 and (a != "edp" or lay.ep > 1)) or "every axis 1"
    own = r.traced
    lines = [f"placements of {r.job.run_dir} (world {lay.world}: {sizes}; traced in order {lay.order}, steady step "
             f"{r.job.step}) on {r.cluster.name}: {r.cluster.gpu.name}, {lay.world // net.gpus_per_node} nodes x "
             f"{net.gpus_per_node} GPUs",
             f"ranked by {RANKED_BY}: the rank the trace called r sits at the rank its coordinates take in the "
             f"placement's order",
             f"compute (the same under every placement): {own.forecast.compute_source}"]
    skipped = [f"{len(r.skipped_orders)} rejected by Layout"] if r.skipped_orders else []
    if r.unpaired_orders:
        skipped.append(f"{len(r.unpaired_orders)} that pair dense and expert coordinates otherwise than the trace")
    lines.append(f"{len(r.placements)} distinct placements from {r.orders} orders{' (skipped: ' + '; '.join(skipped) + ')' if skipped else ''}, "
                 f"forecast in {r.seconds:.2f} s; per axis, of the class that paces the step: exposed / on the link "
                 f"(exposed counts waiting for peers, a pipeline's bubbles; * = some of its calls cross nodes); best "
                 f"first:")
    for i, p in enumerate(r.placements[:limit]):
        mine = "  (the trace's)" if p is own else f"  {(p.step_s - own.step_s) / own.step_s:+.1%} vs the trace's"
        lines.append(f"{i + 1:3d}. {p.order:16s} step {_ms(p.step_s):>11s}  rank {p.forecast.critical_rank}'s class "
                     f"paces it{mine}")
        axes = "  ".join(f"{a.axis} {_ms(a.exposed_s)} / {_ms(a.seconds)}{'*' if p.crossing.get(a.axis) else ''}"
                         for a in p.critical.axes)
        lines.append(f"       {axes or 'no communication'}")
    if len(r.placements) > limit:
        lines.append(f"  ... {len(r.placements) - limit} more (--json lists all)")
    lines += [f"note: {n}" for n in _notes(r)]
    return "\n".join(lines)
