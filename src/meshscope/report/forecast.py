"""``meshscope forecast`` on the terminal (the step, each rank class, each axis's exposed communication) and its
figure (``figures/forecast-<cluster>.png`` in the trace's directory)."""

from __future__ import annotations

from pathlib import Path

from ..core.events import human_bytes
from ..forecast.result import Forecast
from .table import make_console, print_table


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"


def render(f: Forecast, console=None) -> None:
    console = console or make_console()
    net = f.cluster["network"]
    console.print(f"forecast of {f.run_dir} (traced step {f.step}, world {f.world}) on {f.cluster['name']}: "
                  f"{f.cluster['gpu']['name']}, {net['gpus_per_node']} per node")
    rate = f", {f.tokens_per_s_per_gpu:,.0f} tokens/s per GPU" if f.tokens_per_s_per_gpu else ""
    console.print(f"step {_s(f.step_s)} (rank {f.critical_rank}'s class paces it){rate}; HFU {f.hfu:.1%} "
                  f"(counted matmul FLOPs, recomputation included, over the bf16 peak)")
    print_table(console, "rank classes", ("rank", "plays", "step", "compute", "exposed comm", "waits on side streams",
                                          "peak memory", "reserved", "peak at"),
                [(c.rank, c.ranks, _s(c.step_s), _s(c.compute_s), _s(c.exposed_s), _s(c.waited_on_streams_s),
                  human_bytes(c.peak_bytes), human_bytes(c.reserved_bytes) if c.reserved_at else "-",
                  f"step {c.peak_at.get('step')} {c.peak_at.get('phase')} {c.peak_at.get('module') or ''}".strip())
                 for c in f.classes])
    print_table(console, "communication per axis (each class's step)",
                ("rank", "axis", "calls", "bytes", "on the link", "exposed", "of which waiting for peers"),
                [(c.rank, a.axis, a.calls, human_bytes(a.bytes), _s(a.seconds), _s(a.exposed_s),
                  _s(a.waiting_for_peers_s)) for c in f.classes for a in c.axes], key=2)
    console.print(f"compute: {f.compute_source}")
    for c in f.classes:
        console.print(f"  rank {c.rank}'s compute stream: " + ", ".join(
            f"{kind} {_s(s)}" for kind, s in sorted(c.compute_by_kind.items(), key=lambda kv: -kv[1])))
    expandable = {c.reserved_at.get("expandable_segments") for c in f.classes}
    console.print("memory: peak = tensor bytes (max_memory_allocated); reserved = what torch's caching allocator "
                  "would hold (max_memory_reserved), " + (
                      "with expandable segments" if expandable == {True} else
                      "without expandable segments" if expandable == {False} else
                      "not in this trace (made before meshscope modelled the allocator: trace again)"
                      if expandable == {None} else "expandable segments in some classes"))
    for note in f.notes:
        console.print(f"note: {note}")


def plot(f: Forecast, path: Path) -> str:
    """Per rank class: the step as compute, each axis's exposed communication and the rest (waits on side streams),
    with each axis's hidden part beside it; and the peak memory by the phase that made it, with what the caching
    allocator would reserve, against the GPU's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = list(f.classes)
    names = [f"rank {c.rank} ({c.ranks})" for c in classes]
    axes_names = sorted({a.axis for c in classes for a in c.axes})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 2.6 + 0.45 * len(classes)), layout="constrained")
    y = range(len(classes))
    start = [0.0] * len(classes)

    def bar(values, label, hatch=None):
        left.barh(y, values, left=start, label=label, hatch=hatch)
        for i, v in enumerate(values):
            start[i] += v

    bar([c.compute_s * 1e3 for c in classes], "compute")
    for axis in axes_names:
        bar([sum(a.exposed_s for a in c.axes if a.axis == axis) * 1e3 for c in classes], f"{axis} exposed")
    bar([c.waited_on_streams_s * 1e3 for c in classes], "waits on side streams")
    for axis in axes_names:
        bar([max(0.0, sum(a.seconds - a.exposed_s for a in c.axes if a.axis == axis)) * 1e3 for c in classes],
            f"{axis} hidden (beside the step)", hatch="//")
    left.set_yticks(list(y), names)
    left.set_xlabel("ms (hatched: communication that ran beside compute)")
    left.set_title(f"step on {f.cluster['name']}: {f.step_s * 1e3:.1f} ms")
    left.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.2), ncol=2, frameon=False)
    phases = sorted({p for c in classes for p in c.peak_at.get("by_phase", {})})
    start = [0.0] * len(classes)
    for phase in phases:
        values = [c.peak_at.get("by_phase", {}).get(phase, 0) / 2**30 for c in classes]
        right.barh(y, values, left=start, label=f"made in {phase}")
        start = [s + v for s, v in zip(start, values)]
    right.scatter([c.reserved_bytes / 2**30 for c in classes], list(y), marker="|", s=400, color="black",
                  label="reserved (caching allocator)")
    right.axvline(f.cluster["gpu"]["hbm_bytes"] / 2**30, color="black", linestyle="--", label="GPU memory")
    right.set_yticks(list(y), names)
    right.set_xlabel("GiB at the peak")
    right.set_title("peak memory per rank class")
    right.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.2), ncol=3, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
