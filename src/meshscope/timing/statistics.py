"""Honest timing statistics: the critical rank per step, percentiles, CV and the PERF_UNSTABLE verdict.

The chapter's full performance table (with its statistical limits) takes, for every logical step, the maximum
time over the ranks (the critical rank: the step is done only when the slowest rank is), then reports the
median and the host CV, and marks every difference that the spread can explain as PERF_UNSTABLE (all but the
large effect of PP's multiplied message count). Its CVs were 12-81 %, so a bare median ratio would have
published noise. This module does the same arithmetic, precisely defined:

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

import math
from dataclasses import asdict, dataclass

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
    The chapter's pp_mb1 vs pp_mb8 (1.14 ms vs 6.97 ms) passes this; its tp_ar_b32 vs tp_ar_b128 (CV 55 %
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
