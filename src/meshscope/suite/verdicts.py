"""How the suite words what it measured: the clock a verdict uses, PERF_UNSTABLE or stable, and the
summary line (records, checked invariants, device traces, passed or not)."""

from __future__ import annotations

from ..core.result import SuiteResult

CLOCKS = {"gpu": "GPU time (CUDA events)", "host": "host time"}


def verdict_clock(row: dict) -> str:
    """The clock a configuration's verdicts use: CUDA events on a GPU (they span the sample on the
    device, first kernel to last; the host clock adds the wake-up of the final synchronise, which
    shows on 70 us graph-replayed steps), the host clock on CPU."""
    return "gpu" if "gpu" in row else "host"


def _verdict(c) -> str:
    """PERF_UNSTABLE as the issue defines it (a noisy series, or a difference within the spread); a
    difference beyond the spread of noisy series (the chapter's PP effect, docs/chapter.md Q18) says so."""
    if not c.unstable:
        return "stable"
    return "PERF_UNSTABLE, but the [P5, P95] intervals are disjoint" if c.distinguishable else "PERF_UNSTABLE"


def _summary(d: dict):
    from ..timing.statistics import Summary

    return Summary(**{k: d[k] for k in Summary.__dataclass_fields__})


# -- summary line ---------------------------------------------------------------------------------------
def summary(doc: SuiteResult) -> dict:
    """Record counts of the whole suite and its one line; passed when every configuration passed."""
    results = doc.results.values()
    training = sum(len(v or []) for r in results for v in r.sections.get("losses", {}).values())
    comm = sum(len(r.captured) for r in results)
    timeline = sum(len(p["spans"]) for r in results if r.sections.get("timeline")
                   for p in r.sections["timeline"]["ranks"])
    checks = sum(len(r.checks) for r in results)
    traces = sum(len(r.kernels["per_rank"]) for r in results if r.kernels)
    passed = doc.passed
    return {"training_records": training, "communication_records": comm, "timeline_records": timeline,
            "checked_invariants": checks, "device_traces": traces, "passed": passed,
            "line": (f"{training} training, {comm} communication, {timeline} timeline records, {checks} checked "
                     f"invariants and {traces} device traces: {'all passed' if passed else 'SOME FAILED'}")}
