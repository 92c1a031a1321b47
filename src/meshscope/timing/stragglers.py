"""Which rank made the others wait, on which axis, and where its time went: a trace's ``time`` section.

One pure function, `analyse`, over a traced job's calls (`CommEvent`, with each rank's `t_issue` and
`t_complete`), each rank's place on the common clock (`core.clock.Clock`), its moves between phases
and modules and its step ends (`capture.flightlog.Flight`). The trace's assembly calls it for
``TraceResult.time``; the doctor calls it on the same flight logs for its ``straggler`` findings; the
report draws it. docs/trace.md ("Time") says what the figures mean and what they cannot see.

**The rule.** Rank R is a straggler when, on at least `ON_STEPS` of the steady steps, both

- the others' mean wait it caused on one axis (`timing.waits.Instance.caused`, summed over the step's
  instances of that axis where R arrived last) is at least `SHARE` of the median step, and
- what it caused on every axis minus what it waited itself is at least `SHARE` of the median step too:
  a rank that only passes on a wait it suffered (its pair in another group was late) is not the cause.

`SHARE` is 15 %: a planted delay of 60 ms that is at least 30 % of the healthy step (the target of
docs/trace.md's benchmark) is at least 23 % of the slowed step; `benchmarks/bench_stragglers.py`
measured healthy runs of 4 ranks on 2 shared cores below it (its figures are in docs/trace.md).

**Where.** On each step R held the others, its late call is the instance of that axis where its
lateness cost them most; its segment before that call (from its previous completion on the call's
group to the late issue, `timing.where.before`) and each other member's segment before its own call of that instance
are split by (phase, module); the (phase, module) whose time on R exceeds the others' median by most,
summed over those steps, is where R's time went. On a GPU, each segment also counts the time from
the call's CPU issue to its arrival on the GPU as (``gpu``, no module): a kernel that keeps one rank's
GPU busy delays no CPU issue, only that arrival (`CommEvent.t_gpu`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from ..capture.flightlog import read_flight
from ..core.clock import Clock, crowded, offsets, truth
from ..core.events import CommEvent
from ..core.rundir import RunDir
from ..core.steady import Steady, common
from ..core.time_result import GPU_QUEUE, AxisTime, Straggler, TimeSection
from ..core.rank_end import RankEnd
from .waits import Instance, instances, per_step
from .where import Completions, Moves, before

SHARE = 0.15
"""Of the median steady step: the waits a rank must cause (and cause more than it waits) on a step."""
ON_STEPS = 0.75
"""Of the steady steps: on how many the rank must hold the others. A cause that recurs each step holds
them on every one, while at 50 % the scheduler's turns on a host whose ranks outnumber its CPUs named a
rank in 4 of 10 healthy DDP runs of `benchmarks/bench_stragglers.py` (4 ranks, 2 CPUs, load 5); its
figures at 75 % are in docs/trace.md."""
MIN_STEPS = 2
"""Steady steps needed for a verdict."""
FLOOR_MS = 3.0
"""The least wait per step a straggler must cause, whatever the step: a healthy 1F1B job of 5.6 ms steps
named its last stage (15 % of the step, at least 0.84 ms, in `other`) in 2 of 10 runs of
`benchmarks/bench_stragglers.py` without a floor (load 1.2), and at 2 ms in 1 of 10; on the quiet box its
last stage caused 1.5-1.9 ms on every steady step of 2 of 10 healthy runs (2026-12-02, load 0.2-1.1), the
same stage's loss and backward, not a straggler. Planted 60 ms delays cause 53-92 ms."""

HOST_SHARE = 0.8
"""A rank that waited for a CPU (its main thread on the run queue) at least this share of the wait it
caused, on the steps it held the others, was made late by its host, not by the job: the note names it, the
stragglers do not. Healthy 1F1B on 2 ranks beside another session's busy test workers (load 2-7 on 2 CPUs)
named a rank in 3 of 6 runs without it; those the guard held back had waited 85-157 % of what they
caused. A planted 60 ms sleep in FSDP2 x TP's data loading, with two test suites on the box (load 6-10),
had waited 51 % (70.7 of 138.7 ms), which 0.5 held back: a sleep is not on the run queue."""

RULE = (f"a rank whose lateness cost the others, on one axis, at least {SHARE:.0%} of the median step and "
        f"{FLOOR_MS:g} ms (and more than it waited itself by as much) on at least {ON_STEPS:.0%} of the steady "
        f"steps ({MIN_STEPS} at least), unless it waited for a CPU itself at least {HOST_SHARE:.0%} as long")


def analyse(events: list[CommEvent], clocks: dict[int, Clock | None], moves: dict[int, list[tuple[float, str, str]]],
            step_ends: dict[int, dict[int, float]], steps: list[int], fake_world: bool = False,
            queued: dict[int, dict[int, float]] | None = None) -> TimeSection:
    """The ``time`` section of a trace (module docstring). `step_ends`: rank -> step -> when that step's
    boundary passed on the rank (its own clock); `steps`: the steady steps to analyse; `queued`: rank ->
    step -> its main thread's run-queue wait by that boundary (`capture.flightlog.Flight.queued`)."""
    if fake_world:
        return TimeSection(False, "fake world: its ranks ran one after another, so their times say nothing of "
                                  "waits (trace the job for real to see them)", RULE)
    common = offsets(clocks)
    unclocked = sorted(r for r in {e.rank for e in events} if r not in common)
    shifts = {r: offset for r, (offset, _) in common.items()}
    events = [e for e in events if e.rank in shifts and e.t_issue is not None]
    notes = [f"ranks {unclocked} have no clock offset (no default group, or the estimate through the job's store "
             f"timed out): their calls are left out"] if unclocked else []
    notes += [f"{ranks} ranks shared {n} CPUs on one host: who arrived last there is also who the scheduler ran "
              f"last, so a straggler named there may be the host's, not the job's (give each rank a CPU of its own "
              f"to tell them apart)" for ranks, n in crowded(clocks).values()]
    note = "; ".join(notes)
    durations = _step_ms(step_ends, steps)
    if len(durations) < MIN_STEPS or not events:
        why = (f"{len(durations)} steady step{'s' if len(durations) != 1 else ''} with an end on every rank; waits need "
               f"{MIN_STEPS} at least (trace more steps)" if events else "no calls with a clock to compare")
        return TimeSection(False, "; ".join(n for n in (note, why) if n), RULE, clock_error_ms=_error(common),
                           clock_true_error_ms=_true_error(clocks))
    steps = sorted(durations)
    step_ms = statistics.median(durations.values())
    found = instances(events, shifts)
    by_step = per_step(events, shifts, found)
    held = _held(by_step, steps, step_ms)
    named = [_straggler(rank, axis, held_steps, by_step, steps, step_ms, found, events, moves, (queued or {}).get(rank))
             for rank, (axis, held_steps) in held.items()]
    hosts = [s for s in named if s.queued_ms is not None and s.queued_ms >= HOST_SHARE * s.caused_held_ms]
    note = "; ".join(n for n in [note] + [
        f"rank {s.rank} made the others wait {s.caused_held_ms:.1f} ms per step on {s.axis} but waited "
        f"{s.queued_ms:.1f} ms per step for a CPU itself (its host's other work ran instead): not named a straggler"
        for s in hosts] if n)
    stragglers = tuple(sorted((s for s in named if s not in hosts), key=lambda s: -s.ms_per_step))
    return TimeSection(True, note, RULE, tuple(steps), step_ms, _error(common), _true_error(clocks),
                       _axes(by_step, steps, events), _caused(by_step, steps), stragglers)


def of_trace(run_dir: RunDir, events: list[CommEvent], ends: list[RankEnd], steady: dict[int, Steady],
             fake_world: bool) -> TimeSection:
    """`analyse` of a trace directory: its ranks' moves and step ends from their flight logs, their clocks
    from their ends, the steps steady on every traced rank (`core.steady`)."""
    flights = [read_flight(run_dir.flight(r), r) for r in run_dir.ranks_with("flight")]
    traced = [e for e in ends if e.status != "missing"]
    return analyse(events, {e.rank: e.clock for e in traced}, {f.rank: f.moves for f in flights},
                   {f.rank: {step: t for t, _, step in f.marks if step is not None} for f in flights},
                   common(steady[e.rank] for e in traced if e.rank in steady), fake_world,
                   {f.rank: f.queued for f in flights})


def _step_ms(step_ends: dict[int, dict[int, float]], steps: list[int]) -> dict[int, float]:
    """Steady step -> its median duration over the ranks, in ms (step k runs from boundary k to k + 1)."""
    out = {}
    for s in steps:
        spans = [(ends[s + 1] - ends[s]) * 1e3 for ends in step_ends.values() if s in ends and s + 1 in ends]
        if spans and len(spans) == len(step_ends):
            out[s] = statistics.median(spans)
    return out


def _held(by_step, steps: list[int], step_ms: float) -> dict[int, tuple[str, list[int]]]:
    """Rank -> (the axis it held the others on most, the steps it held them) for ranks the rule names."""
    floor = max(SHARE * step_ms, FLOOR_MS)
    counts: dict[tuple[int, str], list[int]] = defaultdict(list)
    for s in steps:
        st = by_step.get(s)
        if st is None:
            continue
        net: dict[int, float] = defaultdict(float)
        for (axis, rank), t in st.ranks.items():
            net[rank] += (t.caused - t.waiting) * 1e3
        for (axis, rank), t in st.ranks.items():
            if t.caused * 1e3 >= floor and net[rank] >= floor:
                counts[(rank, axis)].append(s)
    out: dict[int, tuple[str, list[int]]] = {}
    for (rank, axis), held_steps in counts.items():
        if len(held_steps) >= max(MIN_STEPS, ON_STEPS * len(steps)):
            caused = sum(by_step[s].of(axis, rank).caused for s in steps)
            best = out.get(rank)
            if best is None or caused > sum(by_step[s].of(best[0], rank).caused for s in steps):
                out[rank] = (axis, held_steps)
    return out


def _straggler(rank: int, axis: str, held_steps: list[int], by_step, steps: list[int], step_ms: float,
               found: list[Instance], events: list[CommEvent], moves, queued: dict[int, float] | None) -> Straggler:
    ms_per_step = sum(by_step[s].of(axis, rank).caused for s in steps) * 1e3 / len(steps)
    excess = _excess(rank, axis, set(held_steps), found, events, moves)
    (phase, module), extra = max(excess.items(), key=lambda kv: kv[1]) if excess else (("other", ""), 0.0)
    waits = [queued[s + 1] - queued[s] for s in held_steps if queued and s in queued and s + 1 in queued]
    return Straggler(rank, axis, round(ms_per_step, 3), round(ms_per_step / step_ms, 3), tuple(held_steps), phase,
                     module, round(extra * 1e3 / len(held_steps), 3),
                     round(sum(by_step[s].of(axis, rank).caused for s in held_steps) * 1e3 / len(held_steps), 3),
                     round(sum(waits) * 1e3 / len(waits), 3) if len(waits) == len(held_steps) else None)


def _excess(rank: int, axis: str, held: set[int], found: list[Instance], events: list[CommEvent],
            moves) -> dict[tuple[str, str], float]:
    """(phase, module) -> seconds by which `rank`'s segment before its late call exceeded the other
    members' median, summed over the steps it held them on; its late call in a step is the instance of
    `axis` where its lateness cost the others most."""
    late: dict[int, Instance] = {}
    for inst in found:
        if inst.last == rank and inst.axis == axis and inst.step in held and inst.caused > 0:
            if inst.step not in late or inst.caused > late[inst.step].caused:
                late[inst.step] = inst
    ranks = {r for inst in late.values() for r in inst.calls}
    lookups = {r: Moves(moves.get(r, [])) for r in ranks}
    done = {r: Completions([e for e in events if e.rank == r]) for r in ranks}
    out: dict[tuple[str, str], float] = defaultdict(float)
    for inst in late.values():
        mine = _with_queue(before(inst.calls[rank], lookups[rank], done[rank]), inst.calls[rank])
        theirs = [_with_queue(before(e, lookups[r], done[r]), e) for r, e in inst.calls.items() if r != rank]
        for where in set(mine) | {w for t in theirs for w in t}:
            others = statistics.median(t.get(where, 0.0) for t in theirs) if theirs else 0.0
            out[where] += mine.get(where, 0.0) - others
    return out


def _with_queue(segment: dict[tuple[str, str], float], e: CommEvent) -> dict[tuple[str, str], float]:
    """A segment before a call, with the time its GPU still took to reach the call after its CPU issued
    it (``gpu``, no module: the kernels queued before it, which the CPU's moves do not see)."""
    if e.t_gpu is not None and e.t_gpu > e.t_issue:
        segment = {**segment, (GPU_QUEUE, ""): e.t_gpu - e.t_issue}
    return segment


def _axes(by_step, steps: list[int], events: list[CommEvent]) -> tuple[AxisTime, ...]:
    sums: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for s in steps:
        for (axis, rank), t in by_step[s].ranks.items() if s in by_step else ():
            sums[axis][rank][0] += t.inside
            sums[axis][rank][1] += t.waiting
    gpu: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.gpu_ms is not None and e.step in steps:
            gpu[e.axis][e.rank] += e.gpu_ms
    out = []
    for axis, ranks in sorted(sums.items()):
        n = len(steps) * len(ranks)
        timed = gpu.get(axis)
        out.append(AxisTime(axis, round(sum(v[0] for v in ranks.values()) * 1e3 / n, 3),
                            round(sum(v[1] for v in ranks.values()) * 1e3 / n, 3),
                            round(max(v[1] for v in ranks.values()) * 1e3 / len(steps), 3),
                            round(sum(timed.values()) / (len(steps) * len(timed)), 3) if timed else None))
    return tuple(out)


def _caused(by_step, steps: list[int]) -> tuple[tuple[int, int, float], ...]:
    out: dict[tuple[int, int], float] = defaultdict(float)
    for s in steps:
        for (_, rank), t in by_step[s].ranks.items() if s in by_step else ():
            out[(rank, s)] += t.caused
    return tuple((r, s, round(v * 1e3, 3)) for (r, s), v in sorted(out.items()))


def _error(common: dict[int, tuple[float, float]]) -> float | None:
    return round(max(error for _, error in common.values()) * 1e3, 4) if common else None


def _true_error(clocks: dict[int, Clock | None]) -> float | None:
    """The store estimate's largest error against the true offsets, where every rank shares one clock."""
    known = {r: c for r, c in clocks.items() if c is not None and c.offset is not None}
    true = truth(known)
    if not true:
        return None
    return round(max(abs(known[r].offset - true[r]) for r in known) * 1e3, 4)
