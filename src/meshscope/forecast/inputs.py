"""A trace directory as the forecast reads it: per traced rank its ledger, its work log (`capture.work`) and the
step to forecast, and which traced rank plays each rank of the world.

The step is the last steady step of the traced ranks (`TraceResult.steady`, as ``place --from-trace`` and the
budgets read it): a later one carries the optimizer's state, and the steady ones repeat their calls. A rank's
program for it is its work log's items between the marks of the step before and of this one.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ..capture.work import STEP, WorkLog
from ..core.errors import UsageError
from ..core.events import CommEvent, parse_rank_ranges
from ..core.rundir import RunDir
from ..core.steady import MIN_RUN
from ..core.trace_result import TraceResult
from ..trace.assemble import load


@dataclass(frozen=True)
class TracedJob:
    """What the forecast takes from a trace directory."""

    run_dir: Path
    result: TraceResult
    step: int
    """The step forecast: the last steady step common to every traced rank."""
    ledgers: dict[int, list[CommEvent]]
    """Traced rank -> its calls in issue order (a work log's call index points into it)."""
    work: dict[int, WorkLog]
    programs: dict[int, list]
    """Traced rank -> its work log's items of `step`."""
    represent: dict[int, int]
    """Every rank of the world -> the traced rank that plays it."""
    classes: dict[int, int]
    """Traced rank -> how many ranks of the world it plays."""

    @property
    def world(self) -> int:
        return self.result.world


def read(path: Path | str, flag: str = "--from-trace") -> TracedJob:
    """Read the trace at `path` (given as `flag`); one-line `UsageError` for a directory that cannot be forecast."""
    run_dir = RunDir(Path(path))
    if not (run_dir.path / "result.json").is_file():
        raise UsageError(f"{flag} {run_dir.path}: not a finished meshscope trace directory (no result.json)")
    result = load(run_dir)
    traced = [r.rank for r in result.ranks if r.ended]
    missing = [r for r in traced if not run_dir.work(r).is_file()]
    if not traced:
        raise UsageError(f"{flag} {run_dir.path}: no traced rank ended ({result.outcome})")
    if missing:
        again = f"meshscope trace --fake-world {result.world} --fake-tensors --work -- {shlex.join(result.command)}" \
            if result.command else "meshscope trace --fake-world N --fake-tensors --work -- SCRIPT ARGS"
        raise UsageError(f"{flag} {run_dir.path}: rank(s) {', '.join(map(str, missing[:8]))} have no work log (the trace "
                         f"counted no work): trace the job again with its work counted, {again} (meshscope forecast "
                         f"does)")
    steady = [result.steady.get(r) for r in traced]
    steps = set.intersection(*(set(s.steps) if s is not None else set() for s in steady))
    if not steps:
        raise UsageError(f"{flag} {run_dir.path}: the traced ranks share no steady step (none had {MIN_RUN} steps in a "
                         f"row issue the same calls after step 0); run more optimizer steps (--steps)")
    step = max(steps)
    work = {r: WorkLog.read(run_dir.work(r)) for r in traced}
    programs = {r: _step_items(work[r].items, step) for r in traced}
    ledgers: dict[int, list[CommEvent]] = {r: [] for r in traced}
    for e in result.events:  # each rank's in issue order, as its ledger file holds them
        if e.rank in ledgers:
            ledgers[e.rank].append(e)
    represent, classes = _players(result, traced)
    return TracedJob(run_dir.path, result, step, ledgers, work, programs, represent, classes)


def _step_items(items: list, step: int) -> list:
    """The items after the mark of step `step` - 1 (or from the start, for step 0) up to the mark of `step`."""
    marks = [i for i, item in enumerate(items) if item[0] == STEP]
    ends = {items[i][1]: i for i in marks}
    begin = ends[step - 1] + 1 if step > 0 and step - 1 in ends else 0
    return items[begin:ends.get(step, len(items))]


def _players(result: TraceResult, traced: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    world = result.fake_world
    if world is not None and world.classes is not None:
        represent = {}
        for c in world.classes:
            player = c.representative if c.representative in traced else None
            if player is None:
                raise UsageError(f"the trace did not trace rank {c.representative}, which plays ranks {c.ranks}; "
                                 f"trace with --ranks auto")
            represent.update({m: player for m in parse_rank_ranges(c.ranks)})
    else:
        untraced = sorted(set(range(result.world)) - set(traced))
        if untraced:
            raise UsageError(f"ranks {untraced[:8]} were not traced and the trace has no rank classes to play them; "
                             f"trace with --ranks auto")
        represent = {r: r for r in traced}
    classes: dict[int, int] = {}
    for player in represent.values():
        classes[player] = classes.get(player, 0) + 1
    return represent, classes
