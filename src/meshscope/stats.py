"""Honest timing statistics: the critical rank per step, percentiles, CV and the PERF_UNSTABLE verdict.

The seed's performance table ("完整性能表与统计边界") takes, for every logical step, the maximum time over
the ranks (the critical rank: the step is done only when the slowest rank is), then reports the median
and the host CV, and marks every difference that the spread can explain as PERF_UNSTABLE ("除PP消息数
放大的大效应外，其余精确性能差值都标记为PERF_UNSTABLE"). Its CVs were 12-81 %, so a bare median ratio
would have published noise. This module does the same arithmetic, precisely defined:

- A rank's clock never mixes with another's except through the per-step max (`critical_path`): no
  clock offsets between processes, no averaging of one rank's step against another rank's.
- Percentiles are linearly interpolated between order statistics (`PERCENTILE_DEFINITION`).
- A series is PERF_UNSTABLE when its CV = std / mean exceeds a threshold (default 5 %).
- Two series are *distinguishable* only when their [P5, P95] intervals do not overlap (`compare`).

`time_steps` produces the per-step samples on one rank: a barrier before every sample so that all
ranks start a step together (otherwise the critical rank's time would include waiting for a late
peer's previous step), warmup samples discarded, host `perf_counter` always and CUDA events on a GPU.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from .capture import suspended
from .cuda_graph import graphed

PERCENTILE_DEFINITION = ("linear interpolation between order statistics: P(q) = x[k] + (h - k)(x[k+1] - x[k]) "
                         "with h = (n - 1) q / 100 and k = floor(h) (numpy 'linear', Hyndman-Fan type 7)")
DEFAULT_CV_THRESHOLD = 0.05
"""Above this coefficient of variation a series is PERF_UNSTABLE (issue 6 default: 5 %)."""
INTERVAL = (5.0, 95.0)
"""The percentile interval that `compare` requires to be disjoint for a difference to count."""


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) of `values`, as `PERCENTILE_DEFINITION` states."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of an empty series")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    h = (len(xs) - 1) * q / 100.0
    k = math.floor(h)
    if k + 1 >= len(xs):
        return float(xs[-1])
    return float(xs[k] + (h - k) * (xs[k + 1] - xs[k]))


def critical_path(table) -> list[float]:
    """Per step, the max over ranks of a [ranks][steps] table of seconds: the critical rank's time."""
    rows = [list(r) for r in table]
    if not rows:
        raise ValueError("critical_path of a table with no ranks")
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise ValueError(f"every rank must report the same number of steps; got {sorted(lengths)} steps per rank")
    return [max(step) for step in zip(*rows)]


@dataclass(frozen=True)
class Summary:
    """Statistics of one series of per-step times (seconds)."""

    n: int
    """Number of samples (warmup excluded)."""
    median: float
    p5: float
    p95: float
    p99: float
    mean: float
    std: float
    """Sample standard deviation (n - 1 in the denominator; 0 for one sample)."""
    cv: float
    """std / mean."""
    min: float
    max: float
    cv_threshold: float
    """The CV above which `unstable` is set."""

    @property
    def unstable(self) -> bool:
        """PERF_UNSTABLE: the spread is too large for the median to stand for the series."""
        return self.cv > self.cv_threshold

    def to_json(self) -> dict:
        return {**asdict(self), "unstable": self.unstable, "percentiles": PERCENTILE_DEFINITION}


def summarize(samples, cv_threshold: float = DEFAULT_CV_THRESHOLD) -> Summary:
    """Summary of one series of per-step seconds."""
    xs = [float(x) for x in samples]
    if not xs:
        raise ValueError("summarize needs at least one sample")
    if cv_threshold < 0:
        raise ValueError(f"cv_threshold {cv_threshold} must be >= 0")
    n, mean = len(xs), sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return Summary(n=n, median=percentile(xs, 50), p5=percentile(xs, INTERVAL[0]), p95=percentile(xs, INTERVAL[1]),
                   p99=percentile(xs, 99), mean=mean, std=std, cv=std / mean if mean > 0 else math.inf,
                   min=min(xs), max=max(xs), cv_threshold=cv_threshold)


def summarize_table(table, cv_threshold: float = DEFAULT_CV_THRESHOLD) -> Summary:
    """Summary of the critical rank's per-step times of a [ranks][steps] table."""
    return summarize(critical_path(table), cv_threshold)


@dataclass(frozen=True)
class Comparison:
    """Config B against config A."""

    ratio: float
    """median(B) / median(A)."""
    distinguishable: bool
    """True only if the [P5, P95] intervals of A and B are disjoint."""
    unstable: bool
    """PERF_UNSTABLE: not distinguishable, or either series is itself unstable (CV above threshold)."""
    detail: str

    def to_json(self) -> dict:
        return asdict(self)


def compare(a: Summary, b: Summary) -> Comparison:
    """Is B really different from A? Ratio of medians and a spread-aware verdict.

    Definition: the difference counts (``distinguishable``) only when A's and B's [P5, P95] intervals
    do not overlap, i.e. at least 90 % of one config's steps lie on one side of 90 % of the other's.
    The seed's pp_mb1 vs pp_mb8 (1.14 ms vs 6.97 ms) passes this; its tp_ar_b32 vs tp_ar_b128 (CV 55 %
    and 81 %) does not. The verdict is PERF_UNSTABLE when the intervals overlap or either CV is above
    its threshold; the ratio is reported either way, never hidden.
    """
    ratio = b.median / a.median if a.median > 0 else math.inf
    disjoint = a.p95 < b.p5 or b.p95 < a.p5
    unstable = not disjoint or a.unstable or b.unstable
    why = [] if disjoint else ["[P5, P95] intervals overlap"]
    why += [f"{name} CV {s.cv:.1%} > {s.cv_threshold:.0%}" for name, s in (("A", a), ("B", b)) if s.unstable]
    detail = (f"B/A median ratio {ratio:.3f}; A [P5,P95] = [{a.p5:.3g}, {a.p95:.3g}] s, "
              f"B [P5,P95] = [{b.p5:.3g}, {b.p95:.3g}] s; " + ("; ".join(why) if why else "distinguishable"))
    return Comparison(ratio=ratio, distinguishable=disjoint, unstable=unstable, detail=detail)


@dataclass(frozen=True)
class StepTimes:
    """One rank's timed samples, warmup discarded."""

    host_s: list[float]
    """Host wall time per sample (perf_counter), per step: the sample's time / steps_per_sample."""
    gpu_s: list[float] | None
    """GPU time per sample from CUDA events, per step likewise; None on CPU."""
    steps_per_sample: int
    method: str
    """How the samples were taken, in words, for the report (the method is part of the figure)."""

    def to_json(self) -> dict:
        return asdict(self)


def time_steps(fn, samples: int, *, warmup: int = 3, device=None, group=None, steps_per_sample: int = 1,
               cuda_graph: bool = False) -> StepTimes:
    """Time `fn()` on this rank: `samples` samples after `warmup` discarded ones.

    Before each sample every rank of `group` (None: the default group; no barrier when
    torch.distributed is not initialised) meets at a barrier, and on a GPU the device is synchronised,
    so a sample starts from an idle device on all ranks at once. A sample runs `fn` `steps_per_sample`
    times back to back and its time is divided by that number: with 1 this is per-step timing; with K
    it is "the mean of K back-to-back steps per sample", which the design brief proposes where eager
    per-step CV on the H200 stayed at 17-20 % however many steps were taken. With `cuda_graph` the
    sample's `steps_per_sample` steps are captured once, after `warmup` eager steps, into one CUDA
    graph (`cuda_graph.graphed`) and each sample is one replay: the device-side steps, without Python
    or launch overhead. The method string says which was used. Host time always includes waiting for the device (synchronise before the clock stops);
    GPU time is CUDA-event time between the first step's start and the last step's end.

    No collective is recorded while sampling (`capture.suspended`): the recording's own cost would be
    part of the figure. Callers mark what they time in the flight log instead (`RankContext.progress`).
    """
    if samples < 1 or warmup < 0 or steps_per_sample < 1:
        raise ValueError(f"need samples >= 1, warmup >= 0, steps_per_sample >= 1; got {samples}, {warmup}, {steps_per_sample}")
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda_graph and not cuda:
        raise ValueError(f"CUDA-graph timing needs a CUDA device, not {device}")
    host, gpu = [], [] if cuda else None
    # A garbage-collection pause inside a sample is noise of the harness, not of the step: collect
    # now and keep the collector off while sampling (re-enabled after, whatever happens).
    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with suspended():
            sample = graphed(fn, device, warmup, steps_per_sample) if cuda_graph else None
            for i in range(warmup + samples):
                if dist.is_available() and dist.is_initialized():
                    dist.barrier(group=group)
                if cuda:
                    torch.cuda.synchronize(device)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                t0 = time.perf_counter()
                if sample is not None:
                    sample()
                else:
                    for _ in range(steps_per_sample):
                        fn()
                if cuda:
                    end.record()
                    end.synchronize()
                t1 = time.perf_counter()
                if i >= warmup:
                    host.append((t1 - t0) / steps_per_sample)
                    if cuda:
                        gpu.append(start.elapsed_time(end) / 1e3 / steps_per_sample)
    finally:
        if gc_was_on:
            gc.enable()
    return StepTimes(host, gpu, steps_per_sample, method_text(samples, warmup, steps_per_sample, cuda, cuda_graph))


def method_text(samples: int, warmup: int, steps_per_sample: int, cuda: bool, cuda_graph: bool = False) -> str:
    """How `time_steps` took its samples, in words (the method is part of the figure)."""
    harness = ("a barrier before each sample" + (" and a device synchronise" if cuda else "")
               + ", garbage collector off and no collective recording while sampling")
    step = (f"each sample one replay of a CUDA graph of its {steps_per_sample} step(s), captured after {max(warmup, 1)} "
            f"eager steps (device time: no Python or launch overhead)" if cuda_graph else "eager steps")
    if steps_per_sample == 1:
        return f"per step: {samples} steps after {warmup} warmup, {step}, {harness}"
    return (f"per sample of {steps_per_sample} back-to-back steps, time / {steps_per_sample}: {samples} samples "
            f"after {warmup} warmup, {step}, {harness}")
