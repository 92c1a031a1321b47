"""How `meshscope place --compare-trace` shows a `place.compare.TraceComparison`: a table, or one JSON document."""

from __future__ import annotations

from ..place.compare import TOLERANCE, TraceComparison


def to_json(c: TraceComparison) -> dict:
    """The `place --compare-trace --json` document."""
    return {"kind": "place-compare", "run_dir": str(c.run_dir), "layout": c.layout.brief(), "spec": c.spec.to_json(),
            "tolerance": TOLERANCE, "agrees": c.agrees(TOLERANCE), "skipped_axes": list(c.skipped_axes),
            "classes": [{"ranks": list(k.ranks), "stage": k.stage, "step": k.step,
                         "rows": [{"axis": r.axis, "op": r.op, "model_calls": r.model_calls, "model_bytes": r.model_bytes,
                                   "trace_calls": r.trace_calls, "trace_bytes": r.trace_bytes,
                                   "bytes_error": r.bytes_error, "agrees": r.agrees(TOLERANCE)} for r in k.rows]}
                        for k in c.classes]}


def render(c: TraceComparison) -> str:
    """Per class of traced ranks, per axis and op: calls and bytes of the model and of the trace, the error."""
    lay = c.layout
    sizes = ", ".join(f"{a} {n}" for a, n in lay.sizes.items() if n > 1 and (a != "edp" or lay.ep > 1)) or "every axis 1"
    lines = [(f"{c.run_dir}: world {lay.world}, {sizes}; model: {c.spec.layers} layers, hidden {c.spec.hidden}, "
             f"data parallel {c.spec.data_parallel}{', sequence parallel' if c.spec.sequence_parallel else ''}"),
             ("per step, logical bytes in nccl-tests sizes (all-gather output, reduce-scatter input); "
             "error = (model - trace) / trace")]
    for k in c.classes:
        lines.append(f"ranks {_ranks(k.ranks)} (pipeline stage {k.stage}), steady step {k.step}:")
        lines.append(f"  {'axis':6s} {'op':15s} {'model calls':>11s} {'trace calls':>11s} {'model bytes':>13s} "
                     f"{'trace bytes':>13s} {'error':>8s}")
        for r in k.rows:
            err = "-" if r.bytes_error is None else f"{r.bytes_error:+.1%}"
            mark = "" if r.agrees(TOLERANCE) else "  <- differs"
            lines.append(f"  {r.axis:6s} {r.op:15s} {r.model_calls:11d} {r.trace_calls:11d} {r.model_bytes:13,d} "
                         f"{r.trace_bytes:13,d} {err:>8s}{mark}")
    worst = max((abs(r.bytes_error) for k in c.classes for r in k.rows if r.bytes_error is not None), default=0.0)
    verdict = ("the model agrees: every count exact, bytes within "
               f"{TOLERANCE:.0%} (largest error {worst:.1%})" if c.agrees(TOLERANCE)
               else f"the model differs from the trace (rows marked; counts must be exact, bytes within {TOLERANCE:.0%})")
    lines.append(verdict)
    if c.skipped_axes:
        lines.append(f"not compared (no mesh axis the model places): {', '.join(c.skipped_axes)}")
    return "\n".join(lines)


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)"
