"""A trace directory -> one `TraceResult`: the ranks' ledgers and ends, the axes and layout they
imply, the checks, and notes each derived from the record it states.

It reads only the directory, so the launcher (after the job), rank 0 of a user's own torchrun
(after every rank wrote its ledger) and ``meshscope report DIR`` all assemble the same result.
A rank that wrote no ledger (killed, or still hung) is read from its flight log, whose lines were
flushed as the job ran; an expected rank with neither is ``missing``. `load` is the one reader of a
finished trace for every command that compares or renders one (its ``result.json``, which also holds
what the launcher added: the fake world's classes, the doctor's findings).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from ..capture.flightlog import read_creations, read_flight
from ..core.axes import GROUP, axis_of, is_mesh_axis
from ..core.events import WORLD, CommEvent
from ..core.findings import Diagnosis
from ..core.mesh_fit import fit
from ..core.mesh_infer import Inferred, infer
from ..core.rundir import RunDir
from ..core.steady import of_ranks, warmup_note
from ..core.fake_world import FakeWorld
from ..core.rank_end import RankEnd
from ..core.trace_result import LastLines, Outcome, TraceError, TraceResult
from ..timing.stragglers import of_trace
from .checks import run_all
from .fake import devices


def rank_events(run_dir: RunDir, rank: int) -> list[CommEvent]:
    """What a rank issued: its ledger, or where it wrote none (it was killed), its flight log."""
    ledger = run_dir.ledger(rank)
    if ledger.exists():
        return [CommEvent.from_json(json.loads(line)) for line in ledger.read_text().splitlines() if line]
    flight = run_dir.flight(rank)
    return list(read_flight(flight, rank).issued) if flight.exists() else []


def created_groups(run_dir: RunDir) -> list[tuple[str, list[int]]]:
    """(description, ranks) of every group rank 0 created, member or not, in order (`trace.created`)."""
    path = run_dir.groups(0)
    return [(c["desc"], c["ranks"]) for c in read_creations(path).creations] if path.exists() else []


def layout_section(world: int, axes: dict[str, list[list[int]]], inferred: Inferred = Inferred()) -> dict:
    """The layout the groups imply, as `meshscope layout` names it where it can (`core.mesh_fit`); where
    `inferred` named axes the job left unnamed (`core.mesh_infer`), the line says so, and ``inferred``
    says whose names they are."""
    if set(axes) <= {WORLD}:
        text = (f"world {world}: every call is on the default group, so there is no mesh axis to reconstruct" if axes
                else f"world {world}: no collective was issued, so there is no layout to reconstruct")
        return {"fits": True, "order": None, "sizes": {WORLD: world}, "text": text}
    found = fit(world, axes)
    named = {"inferred": inferred.convention} if inferred.note() and set(inferred.labels.values()) & set(axes) else {}
    said = f"; {inferred.note()}" if named else ""
    if not found.ok:
        return {"fits": False, "order": None, "sizes": {}, "text": found.reason + said, **named}
    if found.layout is not None:
        return {"fits": True, "order": found.layout.order, "sizes": found.sizes, "text": found.describe() + said,
                "layout": found.layout.brief(), **named}
    return {"fits": True, "order": "-".join(found.order), "sizes": found.sizes, "text": found.describe() + said,
            **named}


def _process_group_note(run_dir: RunDir, ranks: list[int]) -> str:
    """Why a job issued no collective, from what its ranks recorded of their process groups."""
    logs = [read_creations(run_dir.groups(r)) for r in ranks if run_dir.groups(r).exists()]
    created = max((len(g.creations) for g in logs), default=0)
    if not any(g.initialised for g in logs):
        return "no collective was issued: no rank initialised a process group (init_process_group never returned)"
    groups = f" and {created} more with new_group" if created else ""
    return (f"no collective was issued, though the ranks initialised the default process group{groups} "
            f"(groups/rank<R>.jsonl): the script ended before its first collective")


def undecoded_note(undecoded: dict[str, int], ranks: list[int]) -> str:
    """What a trace could not read: calls of c10d ops this meshscope has no decoder for."""
    calls = ", ".join(f"c10d::{op} {n}" for op, n in sorted(undecoded.items()))
    return (f"not in the ledger: calls of c10d ops this meshscope cannot decode (a torch newer than it knows), "
            f"counted on ranks {ranks}: {calls}; each rank's record lists them (`undecoded`)")


def _error(ranks: list[RankEnd], run_dir: RunDir, account: str | None) -> TraceError | None:
    """The first rank that failed on its own (by when it wrote its end), else what the launcher saw, else
    which ranks did not finish."""
    failed = [r for r in ranks if r.status == "error"]
    if failed:
        first = min(failed, key=lambda r: (not r.script_error, r.time))  # a script's error before its peers' timeouts
        log = run_dir.log(first.rank)
        return TraceError(first.error, first.rank, str(log) if log.is_file() else "", first.exit_code)
    unfinished = [r for r in ranks if not r.ended]
    if account:
        return TraceError(account)
    if unfinished:
        statuses = sorted({r.status for r in unfinished})
        return TraceError(f"ranks {[r.rank for r in unfinished]} did not finish ({', '.join(statuses)})")
    return None


def assemble(run_dir: Path | RunDir, account: str | None = None, fake_world: FakeWorld | None = None) -> TraceResult:
    """The result of a trace directory. `account`: what the launcher saw when the job did not end well
    (torchrun's exit, a fork server that died), used where no rank says why; `fake_world`: its section."""
    run_dir = RunDir(run_dir) if not isinstance(run_dir, RunDir) else run_dir
    spec = run_dir.trace_spec()
    world = spec.world
    present = set(run_dir.ranks_with("flight")) | set(run_dir.ranks_with("ranks"))
    listed = sorted(present | set(spec.expected or ()))
    ranks = [run_dir.read_end(r) for r in listed]
    events = [e for r in listed for e in rank_events(run_dir, r)]
    created = created_groups(run_dir)
    # groups the job named none of (picotron's, DeepSpeed's): their members say which mesh axis each is,
    # so that each axis's calls are a row of their own. A rank labels its own ledger so from the same
    # creations (`RankTrace.inferred`); what still reads `group` is a killed rank's flight log, or a rank
    # whose record lacked groups others called on, and the calls of every rank complete the members here
    inferred = infer(world, created, {e.group for e in events if e.axis == GROUP})
    if inferred.labels:
        events = [replace(e, axis=inferred.labels.get(e.group, GROUP)) if e.axis == GROUP else e for e in events]
    axes: dict[str, set] = {}
    for e in events:
        if e.op not in ("send", "recv") or e.axis != "world":
            axes.setdefault(e.axis, set()).add(e.group)
    # rank 0 saw every group created, member or not, for real as in a fake world: new_group "requires that
    # all processes in the main group enter this function, even if they are not going to be members"
    # (torch 2.13, distributed_c10d.py:5758), so a family some ranks never call on is whole here too
    for desc, members in created:
        axis = axis_of(desc)
        if axis == GROUP and not desc:
            axis = inferred.labels.get(tuple(members), GROUP)
        # a mesh axis of 1-rank groups joins nobody (torchtitan builds its dims of size 1 too): it is
        # listed only where the job called on it, and then whole
        if axis not in (WORLD, GROUP) and (len(members) > 1 or axis in axes or not is_mesh_axis(axis)):
            axes.setdefault(axis, set()).add(tuple(members))
    axes_sorted = {a: sorted(map(list, gs)) for a, gs in sorted(axes.items())}
    traced = {r.rank for r in ranks if r.status != "missing"}
    steady = of_ranks(events, {r.rank: r.steps for r in ranks if r.status != "missing"})
    checks = run_all(events, axes_sorted, traced, world, steady, {r.rank for r in ranks if r.ended})
    notes = sorted({r.note for r in ranks if r.note})
    if warmed := warmup_note(steady):
        notes.append(warmed)
    mapped = list(dict.fromkeys(call for r in ranks for call in r.mapped))  # one note for all ranks
    if mapped:
        notes.append(devices.note(mapped))
    if len(traced) < world:
        notes.append(f"ranks traced: {len(traced)} of {world}; cross-rank checks ran among the traced ranks only")
    if not events and traced:
        notes.append(_process_group_note(run_dir, sorted(traced)))
    undecoded = Counter()
    for r in ranks:
        undecoded.update(r.undecoded)
    if undecoded:
        notes.append(undecoded_note(undecoded, [r.rank for r in ranks if r.undecoded]))
    # several nodes writing one directory: each node's spec counts only its own ranks, so the directory
    # holds at least that many
    expected = len(spec.expected) if spec.expected is not None else spec.traced
    result = TraceResult(world=world, command=list(spec.command), events=events, axes=axes_sorted,
                         layout=layout_section(world, axes_sorted, inferred), checks=checks, ranks=ranks,
                         run_dir=str(run_dir), notes=notes, expected=expected, fake_world=fake_world,
                         undecoded=dict(sorted(undecoded.items())),
                         time=of_trace(run_dir, events, ranks, steady, spec.fake_world), steady=steady,
                         created=tuple((desc, tuple(members)) for desc, members in created))
    if result.outcome in (Outcome.FAILED, Outcome.INCOMPLETE):
        result.error = _error(ranks, run_dir, account)
    if result.outcome != Outcome.PASSED:
        result.last_lines = _last_lines(run_dir, result)
    return result


LAST_LINES = 10
"""Lines of the explaining rank's output a result keeps (the whole output is in ``logs/rank<R>.log``)."""


def _last_lines(run_dir: RunDir, result: TraceResult) -> LastLines | None:
    """What the rank that explains the outcome printed last: the failing rank, else the first that did
    not finish, else (an empty job) the lowest."""
    rank = result.error.rank if result.error is not None and result.error.rank is not None else next(
        (r.rank for r in result.ranks if not r.ended), result.ranks[0].rank if result.ranks else None)
    tail = run_dir.log_tail(rank, LAST_LINES) if rank is not None else None
    if tail is None:
        return None
    end = next(r for r in result.ranks if r.rank == rank)
    return LastLines(rank, end.exit_code, str(run_dir.log(rank)), tuple(tail[0]), tail[1])


def load(run_dir: Path | RunDir) -> TraceResult:
    """A trace directory's result: its ``result.json`` once the trace has concluded and it holds every
    rank the directory has, else assembled from what the ranks wrote (a hung or killed trace, nodes
    that shared the directory)."""
    run_dir = RunDir(run_dir) if not isinstance(run_dir, RunDir) else run_dir
    run_dir.trace_spec()  # a trace directory, or a one-line error
    doc = run_dir.read_result()
    if doc is not None and not run_dir.incomplete.exists():
        result = TraceResult.from_json(doc)
        # several nodes sharing the directory (`torchrun -m meshscope.trace`): each node's local rank 0
        # writes a result when its node ends, so the last may lack ranks another node ended after it
        if {r.rank for r in result.ranks} >= set(run_dir.ranks_with("ranks")):
            return result
    return assemble(run_dir)


def conclude(run_dir: RunDir, result: TraceResult) -> TraceResult:
    """A job that failed or did not finish gets the doctor's findings (gloo lets some faults through
    silently, so a failed check is diagnosed too); then result.json is written and the marker removed."""
    if result.outcome in (Outcome.FAILED, Outcome.INCOMPLETE):
        result.doctor = _doctor(run_dir, result)
    run_dir.conclude(result.to_json())
    return result


def _doctor(run_dir: RunDir, result: TraceResult) -> Diagnosis:
    from ..doctor import diagnose

    try:
        return diagnose(run_dir.path, result.time)
    except Exception as exc:  # noqa: BLE001 - the job already failed; the diagnosis is a bonus
        return Diagnosis(str(run_dir), [], failure=f"could not diagnose: {type(exc).__name__}: {exc}".splitlines()[0])
