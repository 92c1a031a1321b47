"""A trace directory -> one `TraceResult`: the ranks' ledgers, the axes and layout they imply, the checks.

It reads only the directory, so the launcher (after the job), rank 0 of a user's own torchrun
(after every rank wrote its ledger) and ``meshscope report DIR`` all assemble the same result.
A rank that wrote no ledger (killed, or still hung) is read from its flight log, whose lines were
flushed as the job ran.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..capture.flightlog import read, read_creations
from ..core.axes import axis_of
from ..core.errors import UsageError
from ..core.events import CommEvent
from ..core.mesh_fit import dims, fit_layout
from ..core.result import RankEnd, TraceResult
from ..run import rundir
from . import device_map
from .checks import run_all


def _events(run_dir: Path, rank: int) -> list[CommEvent]:
    ledger = run_dir / "ledgers" / f"rank{rank}.jsonl"
    if ledger.exists():
        return [CommEvent.from_json(json.loads(line)) for line in ledger.read_text().splitlines() if line]
    flight = run_dir / "flight" / f"rank{rank}.jsonl"
    return [CommEvent.from_json(ln) for ln in read(flight) if ln["kind"] == "issued"] if flight.exists() else []


def _end(run_dir: Path, rank: int) -> RankEnd:
    path = run_dir / "ranks" / f"rank{rank}.json"
    if not path.exists():
        return RankEnd(rank, "missing", error="no record: the rank was killed or never finished")
    return RankEnd.from_json(json.loads(path.read_text()))  # the rank's own record (trace.rank)


def created_groups(run_dir: Path) -> list[tuple[str, list[int]]]:
    """(description, ranks) of every group rank 0 created, member or not, in order (`trace.created`)."""
    path = run_dir / "groups" / "rank0.jsonl"
    return [(c["desc"], c["ranks"]) for c in read_creations(path)] if path.exists() else []


def layout_section(world: int, axes: dict[str, list[list[int]]]) -> dict:
    """The layout the groups imply, as `meshscope layout` names it where it can (`core.mesh_fit`)."""
    if set(axes) <= {"world"}:  # DDP, a pipeline over the world, a plain script: nothing to reconstruct
        return {"fits": True, "order": None, "sizes": {"world": world},
                "text": f"world {world}: every call is on the default group, so there is no mesh axis to reconstruct"}
    fit = fit_layout(world, axes)
    if fit.ok:
        return {"fits": True, "order": fit.layout.order, "sizes": fit.sizes, "text": fit.describe(),
                "layout": fit.layout.brief()}
    mesh = dims(world, {a: g for a, g in axes.items() if a not in ("world", "group")})
    if mesh.ok:
        return {"fits": True, "order": "-".join(mesh.order), "sizes": mesh.sizes, "text": mesh.describe()}
    return {"fits": False, "order": None, "sizes": {}, "text": f"{fit.reason}; {mesh.reason}"}


def assemble(run_dir: Path) -> TraceResult:
    run_dir = Path(run_dir)
    spec_path = run_dir / "spec.json"
    if not spec_path.exists():
        raise UsageError(f"{run_dir} is not a meshscope trace directory (no spec.json)")
    spec = json.loads(spec_path.read_text())
    world = spec["world"]
    present = sorted(int(p.stem.removeprefix("rank")) for p in (run_dir / "flight").glob("rank*.jsonl"))
    ranks = [_end(run_dir, r) for r in present]
    events = [e for r in present for e in _events(run_dir, r)]
    axes: dict[str, set] = {}
    for e in events:
        if e.op not in ("send", "recv") or e.axis != "world":
            axes.setdefault(e.axis, set()).add(e.group)
    for desc, members in created_groups(run_dir) if spec.get("fake_world") else ():  # its rank 0 saw every group created
        axis = axis_of(desc)
        if axis not in ("world", "group"):
            axes.setdefault(axis, set()).add(tuple(members))
    axes_sorted = {a: sorted(map(list, gs)) for a, gs in sorted(axes.items())}
    traced = set(present)
    complete = {r.rank: r.steps for r in ranks}
    checks = run_all(events, axes_sorted, traced, world, complete)
    notes = sorted({r.note for r in ranks if r.note})
    mapped = list(dict.fromkeys(call for r in ranks for call in r.mapped))  # one note for all ranks
    if mapped:
        notes.append(device_map.note(mapped))
    if len(traced) < world:
        notes.append(f"ranks traced: {len(traced)} of {world}; cross-rank checks ran among the traced ranks only")
    if not events:
        notes.append("no collective was issued: the script never initialised a process group, or used none")
    # >=: with a directory shared by several nodes, each node's spec counts only its own ranks
    done = all(r.status in ("ok", "stopped") for r in ranks) and len(ranks) >= spec.get("traced", world)
    return TraceResult(world=world, command=spec["command"], events=events, axes=axes_sorted,
                       layout=layout_section(world, axes_sorted), checks=checks, ranks=ranks, run_dir=str(run_dir),
                       notes=notes, complete=done)


INCOMPLETE = "INCOMPLETE"
"""The marker of a trace directory whose job has not finished (or whose launcher was killed)."""


def begin(run_dir: Path, spec: dict) -> None:
    """Take `run_dir` for a trace: clear an earlier run's files, write the spec and the marker."""
    rundir.start(run_dir, spec)
    (run_dir / INCOMPLETE).write_text("the traced job has not finished; result.json is written when it has\n")


def conclude(run_dir: Path, doc: dict) -> None:
    """Write the result document and remove the marker."""
    (run_dir / "result.json").write_text(json.dumps(doc))
    (run_dir / INCOMPLETE).unlink()
