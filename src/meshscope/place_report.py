"""How `meshscope place` shows a `place.Ranking`: a text table, one JSON document, a PNG bar chart.

The chart stacks each placement's predicted communication time per axis (the total is their sum, as
`place` ranks by), best placement on top, so the axis that makes a placement slow is the widest bar.
"""

from __future__ import annotations

from pathlib import Path

from .place import Ranking, fmt_bytes
from .volume import table


def to_json(r: Ranking) -> dict:
    """The `place --json` document."""
    return {
        "world": r.layout.world, "gpus_per_node": r.gpus_per_node, "nodes": r.layout.world // r.gpus_per_node,
        "sizes": r.layout.sizes, "spec": r.spec.to_json(),
        "links": {"intra": r.intra.to_json(), "inter": r.inter.to_json()},
        "aggregate": "sum of per-axis times (no overlap between axes assumed)",
        "volume": {axis: {op: {"calls": c, "bytes": b} for op, (c, b) in ops.items()}
                   for axis, ops in table(r.traffic).items()},
        "traffic": [{"axis": t.axis, "op": t.op, "phase": t.phase, "region": t.region, "count": t.count,
                     "size": t.size} for t in r.traffic],
        "placements": [{
            "rank": i + 1, "order": p.order, "orders": list(p.orders), "total_s": p.total_s, "reason": p.reason(),
            "axes": {a.axis: {"group_size": a.group_size, "groups": a.groups, "crossing_groups": a.crossing,
                              "bytes": a.bytes, "link": a.link.name, "time_s": a.time_s} for a in p.axes},
        } for i, p in enumerate(r.placements)],
        "skipped_orders": list(r.skipped_orders),
    }


def render(r: Ranking, limit: int = 20) -> str:
    """The ranking as text: the volume per axis, then the best `limit` placements with their reasons."""
    lay = r.layout
    sizes = " ".join(f"{k} {v}" for k, v in lay.sizes.items() if v > 1) or "all axes 1"
    lines = [f"world {lay.world} = {lay.world // r.gpus_per_node} nodes x {r.gpus_per_node} GPUs; {sizes}",
             f"links: intra {r.intra.bandwidth / 1e9:.3g} GB/s + {r.intra.latency_s * 1e6:.3g} us/call "
             f"({r.intra.source}); inter {r.inter.bandwidth / 1e9:.3g} GB/s + {r.inter.latency_s * 1e6:.3g} us/call "
             f"({r.inter.source})",
             "per-step volume on the busiest rank (logical bytes, nccl-tests sizes):"]
    for axis, ops in table(r.traffic).items():
        lines.append(f"  {axis:6s} " + ", ".join(f"{c} x {op} = {fmt_bytes(b)}" for op, (c, b) in ops.items()))
    n = len(r.placements)
    skipped = f"; {len(r.skipped_orders)} orders rejected by Layout" if r.skipped_orders else ""
    valid = sum(len(p.orders) for p in r.placements)
    lines.append(f"{n} distinct placements from {valid} valid orders{skipped}; "
                 f"total = sum over axes (no overlap assumed), best first:")
    for i, p in enumerate(r.placements[:limit]):
        axes = "  ".join(f"{a.axis} {a.time_s * 1e3:.3g}ms{'*' if a.crossing else ''}" for a in p.axes)
        lines.append(f"{i + 1:3d}. {p.order:16s} {p.total_s * 1e3:10.3f} ms   {axes}")
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
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.32 * len(ps)))
    left = [0.0] * len(ps)
    ys = list(range(len(ps)))[::-1]
    for k, axis in enumerate(axes):
        widths = [p.axes[k].time_s * 1e3 for p in ps]
        hatches = ["//" if p.axes[k].crossing else "" for p in ps]
        bars = ax.barh(ys, widths, left=left, label=axis, color=f"C{k}")
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, [f"{i + 1}. {p.order}" for i, p in enumerate(ps)], fontsize=8)
    ax.set_xlabel("predicted communication time per step (ms, sum over axes); hatched = crosses nodes")
    ax.set_title(f"placements of world {r.layout.world} ({r.gpus_per_node} GPUs/node), best on top", fontsize=10)
    # proxy patches: a legend entry would otherwise copy the first bar's hatch
    handles = [Patch(color=f"C{k}", label=axis) for k, axis in enumerate(axes)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
