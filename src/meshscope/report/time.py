"""Where a traced job's time went, as the report shows it: per axis, the time in collectives and the
waits per step; the stragglers and where their time went; a heat map of the waits each rank caused
(rank x step); and the waits as slices of the Chrome trace, on the common clock. All of it is read
from `TraceResult.time` (`timing.stragglers` wrote it) and the events' times."""

from __future__ import annotations

from pathlib import Path

from ..core.clock import offsets
from ..core.trace_result import TraceResult
from ..timing.waits import instances


def time_rows(result: TraceResult) -> tuple[list[str], list[list[str]]]:
    """The time table's head and rows (none where the time was not analysed); the GPU column only where
    a call has a GPU time (NCCL)."""
    t = result.time
    if t is None or not t.analysed:
        return TIME_HEAD, []
    gpu = any(a.gpu_ms is not None for a in t.axes)
    rows = [[a.axis, f"{a.inside_ms:.2f}", f"{a.waiting_ms:.2f}", f"{a.max_waiting_ms:.2f}"]
            + (["-" if a.gpu_ms is None else f"{a.gpu_ms:.3f}"] if gpu else []) for a in t.axes]
    return (TIME_HEAD + ["on the GPU ms/step"] if gpu else TIME_HEAD), rows


TIME_HEAD = ["axis", "in collectives ms/step", "waiting ms/step", "most waiting (one rank)"]


def time_lines(result: TraceResult) -> list[str]:
    """The time section in words: what was analysed, the clock, each straggler and where its time went."""
    t = result.time
    if t is None:
        return []
    if not t.analysed:
        return [f"time: not analysed: {t.note}"]
    true = f"; the store's estimate was off by {t.clock_true_error_ms:.3f} ms at most" if t.clock_true_error_ms is not None else ""
    lines = [f"time: steady steps {list(t.steps)}, median step {t.step_ms:.1f} ms; clock offsets within "
             f"{t.clock_error_ms:.3f} ms{true}"]
    if t.note:
        lines.append(f"time: {t.note}")
    for s in t.stragglers:
        lines.append(f"straggler: rank {s.rank} made the others wait {s.ms_per_step:.1f} ms per step on {s.axis} "
                     f"({s.share:.0%} of the step, on {len(s.steps)} of {len(t.steps)} steady steps); its time went to "
                     f"{s.where} ({s.excess_ms:.1f} ms per step more than the other members')")
    if not t.stragglers:
        lines.append(f"time: no straggler ({t.rule})")
    return lines


def caused_figure(result: TraceResult, path: Path) -> str | None:
    """Rank x steady step: the others' mean wait each rank caused (every axis summed), in ms."""
    t = result.time
    if t is None or not t.analysed or not t.caused:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r for r, _, _ in t.caused})
    steps = list(t.steps)
    grid = [[0.0] * len(steps) for _ in ranks]
    for r, s, ms in t.caused:
        if s in steps:
            grid[ranks.index(r)][steps.index(s)] = ms
    fig, ax = plt.subplots(figsize=(1.2 + 0.5 * len(steps), 1.2 + 0.3 * len(ranks)), layout="constrained")
    image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xticks(range(len(steps)), [str(s) for s in steps])
    ax.set_yticks(range(len(ranks)), [str(r) for r in ranks])
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.set_title("waits each rank caused (ms, the others' mean)")
    fig.colorbar(image, ax=ax)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def shifts(result: TraceResult) -> dict[int, float]:
    """Rank -> seconds to add to its times to put them on the common clock (0 where unknown)."""
    known = offsets({r.rank: r.clock for r in result.ranks})
    return {r.rank: known.get(r.rank, (0.0, 0.0))[0] for r in result.ranks}


def wait_slices(result: TraceResult, shift: dict[int, float]) -> list[dict]:
    """Chrome trace slices: every member's wait in each collective instance (and a receiver's for its send),
    from its arrival to the last arrival, on the common clock."""
    if result.time is None or not result.time.analysed:
        return []
    out = []
    for inst in instances(result.events, shift):
        start = max(inst.arrivals.values())
        for rank, wait in inst.waits.items():
            if wait > 0:
                out.append({"name": f"wait for rank {inst.last}", "cat": "wait", "ph": "X", "pid": rank,
                            "tid": f"{inst.axis} waits", "ts": (start - wait) * 1e6, "dur": wait * 1e6,
                            "args": {"op": inst.op, "axis": inst.axis, "group": list(inst.group), "step": inst.step}})
    return out
