"""`meshscope diff DIR_A DIR_B`: what a change did to a job's communication.

Either directory may be a trace (`meshscope trace`) or a run (`meshscope run`, whose captured
ledger is one step, step 0). Per step, axis and op, the calls and logical bytes of A and B (summed
over the ranks both hold), and per rank the first call where the two ledgers diverge (op, group,
phase, dtype, bytes, splits or peer), so that a reader sees where, not only how much.

Fields a side marks as assumed (`CommEvent.assumed`: a fake world's all-to-all sizes) are not compared:
two calls agree when every field neither side assumed agrees, and a step/axis/op total whose calls
carry assumed bytes is compared by its count only. The document's ``assumed`` says which calls and
fields were left out, so that "same" never hides what a fake world invented.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from ..core.errors import UsageError
from ..core.events import CommEvent, compared
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


SIGNATURE = ("step", "op", "axis", "group", "phase", "region", "dtype", "bytes_in", "bytes_out", "input_splits",
             "output_splits", "peer")
"""The fields two calls at the same place of a rank's ledgers must share."""


def _same(x: CommEvent, y: CommEvent) -> bool:
    return all(getattr(x, f) == getattr(y, f) for f in compared(x, y, SIGNATURE))


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
    guessed: dict[tuple, int] = defaultdict(int)  # (step, axis, op) -> calls with assumed bytes, both sides
    fields: set[str] = set()
    for side, events in ((0, a), (1, b)):
        for e in events:
            if e.rank in ranks:
                key = (e.step or 0, e.axis, e.op)
                slot = totals[key]
                slot[side] += 1
                slot[2 + side] += max(e.bytes_in, e.bytes_out)
                if e.assumed:
                    fields.update(e.assumed)
                    guessed[key] += "bytes_in" in e.assumed or "bytes_out" in e.assumed
    rows = [{"step": s, "axis": ax, "op": op, "count_a": ca, "count_b": cb, "bytes_a": ba, "bytes_b": bb,
             "bytes_assumed": bool(guessed[(s, ax, op)])}
            for (s, ax, op), (ca, cb, ba, bb) in sorted(totals.items())
            if ca != cb or (ba != bb and not guessed[(s, ax, op)])]
    first = {}
    for r in ranks:
        xs = sorted((e for e in a if e.rank == r), key=lambda e: (e.step or 0, e.t_issue or 0, e.seq))
        ys = sorted((e for e in b if e.rank == r), key=lambda e: (e.step or 0, e.t_issue or 0, e.seq))
        for i in range(max(len(xs), len(ys))):
            x, y = (xs[i] if i < len(xs) else None), (ys[i] if i < len(ys) else None)
            if x is None or y is None or not _same(x, y):
                first[r] = {"index": i, "a": _brief(x), "b": _brief(y)}
                break
    assumed = {"calls": {side: sum(1 for e in events if e.rank in ranks and e.assumed) for side, events
                         in (("a", a), ("b", b))}, "fields": sorted(fields),
               "totals": [{"step": s, "axis": ax, "op": op} for (s, ax, op), n in sorted(guessed.items()) if n]}
    return {"kind": "diff", "a": str(dir_a), "b": str(dir_b), "kinds": [kind_a, kind_b], "ranks": ranks,
            "same": not rows and not first, "rows": rows, "first_divergence": first, "assumed": assumed}
