"""A trace directory as `place` reads it: the layout it reconstructed and each traced rank's steady step.

The steady step is the last of the rank's steady steps (`TraceResult.steady`, found from its calls by
`core.steady`: after step 0's set-up and the warm-up the calls show; `trace.checks` compares the same steps). Its calls, grouped by axis, op,
phase and size, are the same `Traffic` records the analytic model (`volume.stage_traffic`) gives,
so the advisor can rank placements from what a job really issued (`place --from-trace`) and the
model can be held against it (`compare`). Sizes follow nccl-tests (`alpha_beta.model_bytes`).

Axis names are mapped to the advisor's: a flattened DeviceMesh dim ``dp_cp`` is ``dp-cp``, and a
job whose every call is on the default group (plain DDP) has its ``world`` calls on dp. Calls on
axes the advisor does not place (a named non-mesh group) are left out and listed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UsageError
from ..core.events import CommEvent
from ..core.mesh import Layout
from ..core.trace_result import TraceResult
from ..predict.alpha_beta import model_bytes
from ..predict.volume import Traffic
from ..core.steady import MIN_RUN
from .node_crossing import AXIS_MEMBERS


@dataclass(frozen=True)
class TracedRank:
    """One traced rank's steady step."""

    rank: int
    step: int
    """The step read: the rank's last complete one."""
    stage: int
    """Its pipeline stage in the trace's layout."""
    traffic: tuple[Traffic, ...]
    """Its calls on the advisor's axes, per (axis, op, phase, size)."""


@dataclass(frozen=True)
class Trace:
    """What `place` takes from a trace directory."""

    run_dir: Path
    layout: Layout
    ranks: tuple[TracedRank, ...]
    skipped_axes: tuple[str, ...]
    """Axes with calls in the steady step that no placement can move (left out of `traffic`)."""

    def stages(self) -> tuple[tuple[Traffic, ...], ...]:
        """Per pipeline stage, the busiest traced rank's traffic (as `volume.step_traffic` picks)."""
        out = []
        for s in range(self.layout.pp):
            ranks = [r for r in self.ranks if r.stage == s]
            if not ranks:
                raise UsageError(f"{self.run_dir}: no rank of pipeline stage {s} was traced; trace a rank of "
                                 f"every stage (--ranks auto does)")
            out.append(max((r.traffic for r in ranks), key=lambda ts: sum(t.bytes for t in ts)))
        return tuple(out)


def load(run_dir: Path, flag: str) -> Trace:
    """Read `run_dir` (the value of `flag`); a directory that is no finished trace, or whose ranks reached no
    steady step, raises `UsageError` in one line."""
    run_dir = Path(run_dir)
    doc_path = run_dir / "result.json"
    try:
        doc = json.loads(doc_path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {run_dir}: not a finished meshscope trace directory (no readable result.json: "
                         f"{exc.__class__.__name__})") from None
    if doc.get("kind") != "trace":
        raise UsageError(f"{flag} {run_dir}: result.json is a {doc.get('kind') or 'run'} document, not a trace")
    result = TraceResult.from_json(doc)
    layout = layout_of(result, flag, run_dir)
    rename = {"dp_cp": "dp-cp", **({"world": "dp"} if set(result.layout.get("sizes", {})) <= {"world"} else {})}
    ranks, skipped = [], set()
    for end in result.ranks:
        found = result.steady.get(end.rank)
        if found is None or not found.steps:
            raise UsageError(f"{flag} {run_dir}: rank {end.rank} completed {end.steps} step(s) and no {MIN_RUN} in a row "
                             f"after step 0 issued the same calls, so no steady step; trace more optimizer steps")
        step = found.steps[-1]
        events = [e for e in result.events if e.rank == end.rank and e.step == step]
        axes = {e: rename.get(e.axis, e.axis) for e in events}
        skipped |= {a for a in axes.values() if a not in AXIS_MEMBERS}
        traffic = _traffic([e for e in events if axes[e] in AXIS_MEMBERS], axes, layout)
        ranks.append(TracedRank(end.rank, step, layout.coords(end.rank)["pp"], traffic))
    if not ranks:
        raise UsageError(f"{flag} {run_dir}: the trace holds no rank")
    return Trace(run_dir, layout, tuple(ranks), tuple(sorted(skipped)))


def layout_of(result: TraceResult, flag: str, run_dir: Path) -> Layout:
    """The layout the trace's groups reconstructed (a job on the default group alone: dp over the world)."""
    section = result.layout
    if set(section.get("sizes", {})) <= {"world"}:
        return Layout(result.world)
    if "layout" not in section:
        raise UsageError(f"{flag} {run_dir}: the trace's groups name no meshscope layout ({section.get('text')}); "
                         f"place needs tp, cp, ep, etp, pp and dp axes")
    return Layout.from_json(section["layout"])


def _traffic(events: list[CommEvent], axes: dict[CommEvent, str], layout: Layout) -> tuple[Traffic, ...]:
    counted: Counter = Counter()
    for e in events:
        peer_stage = layout.coords(e.peer)["pp"] if axes[e] == "pp" and e.peer is not None else None
        counted[(axes[e], e.op, e.phase, model_bytes(e), peer_stage)] += 1
    return tuple(Traffic(axis, op, phase, "traced", n, size, peer)
                 for (axis, op, phase, size, peer), n in counted.items())
