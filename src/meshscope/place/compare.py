"""The analytic model held against a trace of real code: per axis and op, calls and bytes side by side.

`meshscope place --compare-trace DIR` takes the layout from the trace and the shapes from the spec
flags, and sets, for each class of traced ranks (the ranks of one pipeline stage whose steady steps
issued the same table), the model's per-step calls and bytes of that stage
(`volume.stage_traffic`) beside the trace's (`traced`). The trace is the independent side: the
model never reads it. Counts should agree exactly and bytes closely; a row's error is
(model - trace) / trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.mesh import Layout
from ..predict.model_spec import ModelSpec
from ..predict.volume import stage_traffic, table
from .traced import Trace

TOLERANCE = 0.05
"""Bytes within 5 % and counts exact: what "the model agrees with the trace" means here."""


@dataclass(frozen=True)
class Row:
    """One axis and op: what the model says, what the trace shows."""

    axis: str
    op: str
    model_calls: int
    model_bytes: int
    trace_calls: int
    trace_bytes: int

    @property
    def bytes_error(self) -> float | None:
        """(model - trace) / trace; None when the trace moved no bytes here."""
        return (self.model_bytes - self.trace_bytes) / self.trace_bytes if self.trace_bytes else None

    def agrees(self, tolerance: float) -> bool:
        """Calls equal, and bytes within `tolerance` (relative), or both zero."""
        err = self.bytes_error
        return self.model_calls == self.trace_calls and (
            abs(err) <= tolerance if err is not None else self.model_bytes == 0)


@dataclass(frozen=True)
class Comparison:
    """One class of traced ranks against the model of their stage."""

    ranks: tuple[int, ...]
    """The traced ranks whose steady steps issued this table."""
    stage: int
    step: int
    """The steady step read (of the first rank)."""
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class TraceComparison:
    """Every class of one trace, with what was compared."""

    run_dir: Path
    layout: Layout
    spec: ModelSpec
    classes: tuple[Comparison, ...]
    skipped_axes: tuple[str, ...]
    """Axes the trace used that the model has no place for (their calls are not compared)."""

    def agrees(self, tolerance: float = TOLERANCE) -> bool:
        return all(r.agrees(tolerance) for c in self.classes for r in c.rows)


def compare_trace(trace: Trace, spec: ModelSpec) -> TraceComparison:
    """The model of `spec` on the trace's layout beside the steady step of every traced rank."""
    lay = trace.layout
    model = {s: table(stage_traffic(spec, lay, s)) for s in sorted({r.stage for r in trace.ranks})}
    classes: dict[tuple, list] = {}
    for r in trace.ranks:
        traced = table(r.traffic)
        rows = tuple(Row(axis, op, *model[r.stage].get(axis, {}).get(op, (0, 0)), *traced.get(axis, {}).get(op, (0, 0)))
                     for axis, op in _cells(model[r.stage], traced))
        classes.setdefault((r.stage, rows), []).append(r)
    return TraceComparison(trace.run_dir, lay, spec,
                           tuple(Comparison(tuple(m.rank for m in members), stage, members[0].step, rows)
                                 for (stage, rows), members in classes.items()), trace.skipped_axes)


def _cells(*tables: dict) -> list[tuple[str, str]]:
    """Every (axis, op) of the tables, sorted."""
    return sorted({(axis, op) for t in tables for axis, ops in t.items() for op in ops})
