"""Pipeline timelines: per-rank F/B spans of one step, the bubble they leave, Chrome trace and Gantt PNG.

The chapter's microbatch experiment (rank0's pp_mb8 timeline F0..F7 then B7..B0; docs/chapter.md Q16) reads a
schedule off the start/end times of each microbatch's forward and backward on each rank. `Recorder` takes them:
the host clock on CPU, CUDA events on GPU (host timestamps of asynchronous kernels would show launch times, not
execution). Every rank starts its clock right after a barrier, so times are comparable across ranks (and across
hosts, within the barrier's skew). On GPU it also takes the step's peak memory above what was allocated at its
start: the issue's "peak allocated memory" next to the stash count.

Bubble: the fraction of the step a rank's compute leaves idle, averaged over ranks, next to the ideal
pipeline's (p - 1) / (m + p - 1) (equal F and B cost on every stage, free communication). On a tiny CPU
model P2P dominates, so the measured figure exceeds the theory; it is reported, not asserted.

Files: a result's ``timeline`` section has one place and one name per file, `paths(label)`:
``figures/LABEL.timeline.json`` (Chrome trace format; opens in Perfetto or chrome://tracing) and
``figures/LABEL.timeline.png`` under the run directory, LABEL being the run's (the suite
configuration, or the experiment plus the options it was given). The section lists them; the report layer
writes them with `write_files`, once, after the run and again on ``meshscope report``.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch


class Recorder:
    """Start/end of named spans (kind F/B, microbatch) of one step, in microseconds from `start`."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.clock = "cuda events" if self.cuda else "host perf_counter"
        self._raw: list[tuple[str, int, object, object]] = []
        self._t0: object = None
        self._resident = 0

    def start(self) -> None:
        """Mark time zero (call right after a barrier); on GPU also start the step's memory peak."""
        self._raw.clear()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            self._resident = torch.cuda.memory_allocated()
        self._t0 = self._now()

    def peak_step_bytes(self) -> int | None:
        """GPU memory allocated above the step's start at its peak (stash, messages, grads); None on CPU."""
        return torch.cuda.max_memory_allocated() - self._resident if self.cuda else None

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter_ns()

    @contextlib.contextmanager
    def span(self, kind: str, microbatch: int):
        begin = self._now()
        yield
        self._raw.append((kind, microbatch, begin, self._now()))

    def spans(self) -> list[dict]:
        """[{microbatch, kind, start_us, end_us}] in execution order (synchronises the GPU)."""
        if self.cuda:
            torch.cuda.synchronize()
            rel = lambda ev: self._t0.elapsed_time(ev) * 1e3  # noqa: E731  (ms -> us)
        else:
            rel = lambda ns: (ns - self._t0) / 1e3  # noqa: E731
        return [{"microbatch": mb, "kind": kind, "start_us": round(rel(b), 1), "end_us": round(rel(e), 1)}
                for kind, mb, b, e in self._raw]


def bubble_theory(pp: int, microbatches: int) -> float:
    """Idle fraction of an ideal pipeline: (p - 1) / (m + p - 1) (GPipe paper; also 1F1B's)."""
    return (pp - 1) / (microbatches + pp - 1)


def bubble_fraction(spans_by_rank: list[list[dict]]) -> float:
    """Mean over ranks of 1 - busy / makespan, the makespan running from the first start to the last end."""
    spans = [s for rank in spans_by_rank for s in rank]
    if not spans:
        return 0.0
    makespan = max(s["end_us"] for s in spans) - min(s["start_us"] for s in spans)
    if makespan <= 0:
        return 0.0
    idle = [1 - sum(s["end_us"] - s["start_us"] for s in rank) / makespan for rank in spans_by_rank]
    return sum(idle) / len(idle)


def chrome_trace(section: dict) -> dict:
    """Chrome trace events: one thread per rank, one complete ("X") event per span."""
    events = []
    for r in section["ranks"]:
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": r["rank"],
                       "args": {"name": f"rank {r['rank']} (stage {r['stage']})"}})
        for s in r["spans"]:
            events.append({"ph": "X", "name": f"{s['kind']}{s['microbatch']}", "pid": 0, "tid": r["rank"],
                           "cat": "forward" if s["kind"] == "F" else "backward",
                           "ts": s["start_us"], "dur": round(s["end_us"] - s["start_us"], 1),
                           "args": {"microbatch": s["microbatch"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {k: section[k] for k in ("schedule", "pp", "microbatches", "clock")}}


def write_png(section: dict, path: Path) -> None:
    """Gantt chart: one row per rank, F bars blue and B bars green, labelled with the microbatch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = section["ranks"]
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(ranks) + 1.2))
    colors = {"F": "#4c72b0", "B": "#55a868"}
    end = max((s["end_us"] for r in ranks for s in r["spans"]), default=1.0)
    for row, r in enumerate(ranks):
        for s in r["spans"]:
            width = s["end_us"] - s["start_us"]
            ax.broken_barh([(s["start_us"], width)], (row - 0.4, 0.8), facecolors=colors[s["kind"]], edgecolor="white")
            if width > 0.012 * end:  # label only bars wide enough to hold it
                ax.text(s["start_us"] + width / 2, row, f"{s['kind']}{s['microbatch']}", ha="center", va="center",
                        fontsize=6, color="white")
    ax.set_yticks(range(len(ranks)), [f"rank {r['rank']} / stage {r['stage']}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(f"time in one step (us, {section['clock']})")
    ax.set_title(f"{section['schedule']} pp={section['pp']} M={section['microbatches']}: bubble "
                 f"{section['bubble_fraction']:.2f} measured, {section['bubble_theory']:.2f} theory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paths(label: str) -> list[str]:
    """Where a run labelled `label` keeps its timeline, relative to its run directory: the Chrome
    trace, then the Gantt PNG."""
    return [f"figures/{label}.timeline.json", f"figures/{label}.timeline.png"]


def write_files(run_dir: Path, label: str, section: dict) -> list[str]:
    """Write the timeline of `section` to `paths(label)` under `run_dir`; return the paths written."""
    trace, png = (Path(run_dir) / p for p in paths(label))
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.write_text(json.dumps(chrome_trace(section)))
    write_png(section, png)
    return [str(trace), str(png)]
