"""`meshscope diff DIR_A DIR_B`: what a change did to a job's communication.

Either directory may be a trace (`meshscope trace`) or a run (`meshscope run`, whose captured
ledger is one step, step 0). Per step, axis and op, the calls and logical bytes of A and B (summed
over the ranks both hold), and per rank the first call where the two ledgers diverge (op, group,
phase, dtype, bytes, splits or peer), so that a reader sees where, not only how much.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from ..core.errors import UsageError
from ..core.events import CommEvent
from ..core.result import RunResult
from .assemble import assemble


def load_events(run_dir: Path) -> tuple[str, list[CommEvent]]:
    """(kind, every rank's events) of a trace or run directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory; give two trace or run directories")
    spec = run_dir / "spec.json"
    if spec.exists() and json.loads(spec.read_text()).get("kind") == "trace":
        return "trace", assemble(run_dir).events
    result = run_dir / "result.json"
    if not result.exists():
        raise UsageError(f"{run_dir} holds neither a trace nor a finished run (no result.json)")
    doc = json.loads(result.read_text())
    if doc.get("kind") == "suite" or "experiment" not in doc:
        raise UsageError(f"{run_dir} is a {doc.get('kind', 'different')} directory; diff compares traces and runs")
    events = RunResult.from_json(doc).captured
    return "run", [e if e.step is not None else replace(e, step=0) for e in events]


def _signature(e: CommEvent) -> tuple:
    return (e.step, e.op, e.axis, e.group, e.phase, e.region, e.dtype, e.bytes_in, e.bytes_out, e.input_splits,
            e.output_splits, e.peer)


def _brief(e: CommEvent | None) -> str:
    if e is None:
        return "nothing"
    splits = f" splits {list(e.input_splits)}" if e.input_splits else ""
    return f"step {e.step} {e.op} {e.axis}{list(e.group)} {e.phase} {e.dtype} {e.bytes_in}->{e.bytes_out} B{splits}"


def diff(dir_a: Path, dir_b: Path) -> dict:
    kind_a, a = load_events(dir_a)
    kind_b, b = load_events(dir_b)
    ranks = sorted({e.rank for e in a} & {e.rank for e in b})
    totals: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for side, events in ((0, a), (1, b)):
        for e in events:
            if e.rank in ranks:
                slot = totals[(e.step or 0, e.axis, e.op)]
                slot[side] += 1
                slot[2 + side] += max(e.bytes_in, e.bytes_out)
    rows = [{"step": s, "axis": ax, "op": op, "count_a": ca, "count_b": cb, "bytes_a": ba, "bytes_b": bb}
            for (s, ax, op), (ca, cb, ba, bb) in sorted(totals.items()) if (ca, ba) != (cb, bb)]
    first = {}
    for r in ranks:
        xs = sorted((e for e in a if e.rank == r), key=lambda e: (e.step or 0, e.t_issue or 0, e.seq))
        ys = sorted((e for e in b if e.rank == r), key=lambda e: (e.step or 0, e.t_issue or 0, e.seq))
        for i in range(max(len(xs), len(ys))):
            x, y = (xs[i] if i < len(xs) else None), (ys[i] if i < len(ys) else None)
            if x is None or y is None or _signature(x) != _signature(y):
                first[r] = {"index": i, "a": _brief(x), "b": _brief(y)}
                break
    return {"kind": "diff", "a": str(dir_a), "b": str(dir_b), "kinds": [kind_a, kind_b], "ranks": ranks,
            "same": not rows and not first, "rows": rows, "first_divergence": first}
