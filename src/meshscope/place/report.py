"""How `meshscope place` shows a `place.Ranking`: a text table, one JSON document, a PNG bar chart.

The chart stacks, per placement, the pacing stage's step time T_s by axis (and compute), so each bar's
length is the step estimate `place` ranks by, best placement on top, and the axis that makes a
placement slow is the widest segment.
"""

from __future__ import annotations

from pathlib import Path

from ..predict.volume import table
from .advisor import Ranking, fmt_bytes


def to_json(r: Ranking) -> dict:
    """The `place --json` document."""
    return {
        "world": r.layout.world, "gpus_per_node": r.gpus_per_node, "nodes": r.layout.world // r.gpus_per_node,
        "sizes": r.layout.sizes, "spec": r.spec.to_json(),
        "links": {"intra": r.intra.to_json(), "inter": r.inter.to_json()},
        "layer_compute_s": r.layer_s, "volume_source": r.source,
        "aggregate": "step_s = max over pipeline stages of T_s = (M + p - 1) / M x (compute + forward/backward "
                     "comm) + optimizer comm, each stage on its own groups; total_s = sum of per-axis times",
        "volume": {axis: {op: {"calls": c, "bytes": b} for op, (c, b) in ops.items()}
                   for axis, ops in table(r.traffic).items()},
        "traffic": [{"axis": t.axis, "op": t.op, "phase": t.phase, "region": t.region, "count": t.count,
                     "size": t.size} for t in r.traffic],
        "placements": [{
            "rank": i + 1, "order": p.order, "orders": list(p.orders), "step_s": p.step_s, "total_s": p.total_s,
            "pacing_stage": p.pacing.stage, "reason": p.reason(),
            "axes": {a.axis: {"group_size": a.group_size, "groups": a.groups, "crossing_groups": a.crossing,
                              "bytes": a.bytes, "link": a.link.name, "time_s": a.time_s} for a in p.axes},
            "stages": [{"stage": st.stage, "layers": st.layers, "step_s": st.step_s, "compute_s": st.compute_s,
                        "axes_s": dict(st.axis_s)} for st in p.stages],
        } for i, p in enumerate(r.placements)],
        "skipped_orders": list(r.skipped_orders),
    }


def render(r: Ranking, limit: int = 20) -> str:
    """The ranking as text: the volume per axis, then the best `limit` placements with their reasons."""
    lay = r.layout
    sizes = " ".join(f"{k} {v}" for k, v in lay.sizes.items() if v > 1) or "all axes 1"
    lines = [f"world {lay.world} = {lay.world // r.gpus_per_node} nodes x {r.gpus_per_node} GPUs; {sizes}",
             (f"links: intra {r.intra.bandwidth / 1e9:.3g} GB/s + {r.intra.latency_s * 1e6:.3g} us/call "
             f"({r.intra.source}); inter {r.inter.bandwidth / 1e9:.3g} GB/s + {r.inter.latency_s * 1e6:.3g} us/call "
             f"({r.inter.source})"),
             f"per-step volume on the busiest rank (logical bytes, nccl-tests sizes), from {r.source}:"]
    for axis, ops in table(r.traffic).items():
        lines.append(f"  {axis:6s} " + ", ".join(f"{c} x {op} = {fmt_bytes(b)}" for op, (c, b) in ops.items()))
    n = len(r.placements)
    skipped = f"; {len(r.skipped_orders)} orders rejected by Layout" if r.skipped_orders else ""
    valid = sum(len(p.orders) for p in r.placements)
    if r.layout.pp > 1:
        layers = ",".join(map(str, r.spec.layers_per_stage(r.layout.pp)))
        lines.append(f"stages: layers {layers}; compute {r.layer_s * 1e3:.3g} ms per layer and microbatch")
    lines.append(f"{n} distinct placements from {valid} valid orders{skipped}; step = slowest stage's time "
                 f"(sum = per-axis times added up), best first:")
    for i, p in enumerate(r.placements[:limit]):
        axes = "  ".join(f"{a.axis} {a.time_s * 1e3:.3g}ms{'*' if a.crossing else ''}" for a in p.axes)
        lines.append(f"{i + 1:3d}. {p.order:16s} step {p.step_s * 1e3:10.3f} ms  sum {p.total_s * 1e3:.3f} ms   {axes}")
        lines.append(f"       {p.reason()}")
    if n > limit:
        lines.append(f"  ... {n - limit} more (--json lists all); * = some groups cross nodes")
    return "\n".join(lines)


def plot(r: Ranking, path: Path) -> None:
    """Horizontal stacked bars of per-axis time for every placement, best on top, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ps = r.placements
    axes = [a.axis for a in ps[0].axes] if ps else []
    parts = axes + (["compute"] if r.layer_s else [])
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.32 * len(ps)))
    left = [0.0] * len(ps)
    ys = list(range(len(ps)))[::-1]
    for k, axis in enumerate(parts):
        widths = [(p.pacing.compute_s if axis == "compute" else p.pacing.axis_s[k][1]) * 1e3 for p in ps]
        hatches = ["//" if axis != "compute" and p.axes[k].crossing else "" for p in ps]
        bars = ax.barh(ys, widths, left=left, label=axis, color=f"C{k}")
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, [f"{i + 1}. {p.order}" for i, p in enumerate(ps)], fontsize=8)
    ax.set_xlabel("predicted step time (ms, the slowest stage's, by axis); hatched = crosses nodes")
    ax.set_title(f"placements of world {r.layout.world} ({r.gpus_per_node} GPUs/node), best on top", fontsize=10)
    # proxy patches: a legend entry would otherwise copy the first bar's hatch
    handles = [Patch(color=f"C{k}", label=axis) for k, axis in enumerate(parts)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
