"""What a budget counts in one trace: each rank class's steady step, as entries.

- **A rank class** is a rank's place in each group it belongs to, axis by axis, as a fake world places
  it (`trace.fake.classes.place`): ``first`` member or ``other``; on an axis whose calls tell its
  members apart (a pipeline's sends and receives, a call rooted past the first member:
  `core.events.orders_members`), ``first``, ``middle 0`` / ``middle 1`` (by the parity of its
  position) or ``last``. Groups of one rank have no place and are left out. Not the group's size:
  every rank of ``tp`` but the first is ``other`` at tp 2 and at tp 8 alike, so a class exists at 16
  ranks and at 1,024, and a fake world's ``--ranks auto`` traces one rank of each. In a real trace
  every rank is traced and each class's lowest rank stands for it, after its other members were
  checked to issue the same.
- **An entry** is (class, axis, op, phase, dtype, module) with the module's integer path components
  replaced by ``*`` (``layers.*.attention``: depth is a variable, not new keys). Its calls in one
  steady step may differ in size (FSDP2's reduce-scatter of each block and of the root unit share an
  entry): they are kept as parts, one per distinct size, largest first, each with its count.
- **The steady step**: a budget needs at least two steady steps (`core.steady`) on every rank, all
  equal; an all-to-all whose sizes move between steps or ranks follows its routing, and its sizes
  are ``routed`` (its count is still held); sizes a fake world could not know are ``assumed``.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from ..core.errors import UsageError
from ..core.events import P2P, WORLD, CommEvent, orders_members
from ..core.trace_result import TraceResult
from ..core.steady import Steady
from ..trace.fake.classes import place

ROUTED = "routed"
ASSUMED = "assumed"

_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


def module_key(region: str) -> str:
    """``layers.3.attention`` -> ``layers.*.attention``; calls outside any module are ``-``."""
    return _INDEX.sub("*", region) if region else "-"


def rank_class(rank: int, axes: dict[str, list[list[int]]], ordered: frozenset[str] = frozenset()) -> str:
    """``dp=first, tp=other``: the rank's place in each axis's group it is in (groups of two or more), in
    order on the axes of `ordered` (``pp=middle 1``)."""
    places = []
    for axis, groups in sorted(axes.items()):
        group = next((g for g in groups if rank in g), None)
        if group is None or len(group) < 2:
            continue
        places.append(f"{axis}={place(group.index(rank), len(group), axis in ordered)}")
    return ", ".join(places) or "alone"


def rank_classes(result: TraceResult, axes: tuple[str, ...] | None = None) -> dict[str, list[int]]:
    """Class -> the traced ranks of `result` in it, by their places in `axes` (default: all of the job's);
    an axis is in order where any call on it tells its members apart (`core.events.orders_members`)."""
    placed = {a: g for a, g in _placing(result).items() if axes is None or a in axes}
    ordered = frozenset(e.axis for e in result.events if orders_members(e))
    classes: dict[str, list[int]] = defaultdict(list)
    for end in result.ranks:
        classes[rank_class(end.rank, placed, ordered)].append(end.rank)
    return dict(classes)


@dataclass(frozen=True)
class Key:
    """What an entry is about."""

    cls: str
    axis: str
    op: str
    phase: str
    dtype: str
    module: str

    def label(self) -> str:
        return f"[{self.cls}] {self.axis} {self.op} {self.phase} {self.dtype} {self.module}"


@dataclass(frozen=True)
class Part:
    """The calls of one size within an entry, in one steady step."""

    count: int
    bytes_in: int | str
    """Logical input bytes per call, or `ROUTED` / `ASSUMED`."""
    bytes_out: int | str


def _key(cls: str, e: CommEvent) -> Key:
    return Key(cls, e.axis, e.op, e.phase, e.dtype, module_key(e.region))


def _parts(calls: list[CommEvent]) -> list[tuple[int, int, bool, bool]]:
    """(bytes_in, bytes_out, in assumed, out assumed) per call."""
    return [(e.bytes_in, e.bytes_out, "bytes_in" in e.assumed, "bytes_out" in e.assumed) for e in calls]


def _step_entries(cls: str, calls: list[CommEvent]) -> dict[Key, Counter]:
    out: dict[Key, Counter] = defaultdict(Counter)
    for e in calls:
        out[_key(cls, e)][_parts([e])[0]] += 1
    return dict(out)


def _as_parts(sizes: Counter, routed: bool) -> tuple[Part, ...]:
    """An entry's calls as parts, largest first; a routed entry is one part of its total count."""
    if routed:
        return (Part(sum(sizes.values()), ROUTED, ROUTED),)
    parts = []
    for (b_in, b_out, a_in, a_out), n in sorted(sizes.items(), key=lambda kv: (-max(kv[0][:2]), kv[0])):
        parts.append(Part(n, ASSUMED if a_in else b_in, ASSUMED if a_out else b_out))
    merged: dict[tuple, int] = {}  # assumed sizes make parts that differ only in what is unknown one part
    for p in parts:
        merged[(p.bytes_in, p.bytes_out)] = merged.get((p.bytes_in, p.bytes_out), 0) + p.count
    return tuple(Part(n, b_in, b_out) for (b_in, b_out), n in merged.items())


@dataclass(frozen=True)
class Observed:
    """One trace as a budget reads it: each class's entries, the representative ranks, the variables."""

    classes: dict[str, list[int]]
    """Class -> its traced ranks (the first stands for it)."""
    entries: dict[Key, tuple[Part, ...]]
    steps: dict[int, list[int]]
    """Representative rank -> its steady steps."""
    calls: dict[str, list[CommEvent]]
    """Class -> its representative's last steady step, in issue order (to name a moved call)."""


def _placing(result: TraceResult) -> dict[str, list[list[int]]]:
    """The groups that place a rank: every axis's, and the default group where the job's point-to-point
    calls ran on it (`result.axes` leaves that out: a pipeline over the world, its stages the places)."""
    if WORLD in result.axes or not any(e.axis == WORLD and e.op in P2P for e in result.events):
        return result.axes
    return {**result.axes, WORLD: [list(range(result.world))]}


def class_axes(result: TraceResult) -> tuple[str, ...]:
    """The axes whose places make a rank class: every axis the job's groups have (`_placing`)."""
    return tuple(sorted(_placing(result)))


def observe(result: TraceResult, steady: int = 2, axes: tuple[str, ...] | None = None) -> Observed:
    """The steady entries of every rank class of `result`, the classes by the places in `axes` (default:
    `class_axes`); UsageError (one line, naming the rank and what it lacks) where a rank has fewer than
    `steady` steady steps or they differ."""
    by_rank: dict[int, dict[int, list[CommEvent]]] = defaultdict(lambda: defaultdict(list))
    for e in result.events:
        by_rank[e.rank][e.step or 0].append(e)
    classes = rank_classes(result, axes)
    entries: dict[Key, tuple[Part, ...]] = {}
    rep_steps: dict[int, list[int]] = {}
    last_calls: dict[str, list[CommEvent]] = {}
    ends = {r.rank: r for r in result.ranks}
    for cls, ranks in sorted(classes.items()):
        seen: dict[int, dict[Key, Counter]] = {}
        routed: set[Key] = set()
        for rank in ranks:
            steps = result.steady[rank].steps
            if len(steps) < steady:
                raise UsageError(f"rank {rank} completed {ends[rank].steps} step(s), {_steady_brief(result.steady[rank])}: "
                                 f"a budget needs {steady} steady steps, so trace at least "
                                 f"{result.steady[rank].needed(steady)} optimizer steps")
            per_step = [_step_entries(cls, by_rank[rank].get(s, [])) for s in steps]
            routed |= _steady_or_routed(rank, steps, per_step)
            seen[rank] = per_step[-1]
        first = ranks[0]
        for rank in ranks[1:]:  # the class rule: its members issue the same (a real trace holds them all)
            if _shape(seen[rank], routed) != _shape(seen[first], routed):
                raise UsageError(f"ranks {first} and {rank} are both [{cls}] but their steady steps differ "
                                 f"({_first_difference(seen[first], seen[rank], routed)}): the class rule does not hold "
                                 f"for this job, so no budget by class can be written")
        for key, sizes in seen[first].items():
            entries[key] = _as_parts(sizes, key in routed)
        rep_steps[first] = result.steady[first].steps
        last_calls[cls] = by_rank[first].get(rep_steps[first][-1], [])
    return Observed(classes, entries, rep_steps, last_calls)


def _steady_brief(s: Steady) -> str:
    return (f"steady from step {s.first}" if s.first is not None
            else "no two steps in a row after step 0 issuing the same calls")


def _shape(entries: dict[Key, Counter], routed: set[Key]) -> dict:
    """What two steps must share: every entry's sizes, or only its count where it is routed."""
    return {k: sum(v.values()) if k.op == "all_to_all" and k in routed else v for k, v in entries.items()}


def _steady_or_routed(rank: int, steps: list[int], per_step: list[dict[Key, Counter]]) -> set[Key]:
    """The all-to-all entries whose sizes moved between steady steps; UsageError where anything else did."""
    routed = {k for s in per_step for k in s if k.op == "all_to_all"
              and len({tuple(sorted(p.get(k, Counter()).items())) for p in per_step}) > 1}
    ref = _shape(per_step[0], routed)
    for step, entries in zip(steps[1:], per_step[1:]):
        if _shape(entries, routed) != ref:
            raise UsageError(f"rank {rank}: steady step {step} differs from step {steps[0]} "
                             f"({_first_difference(per_step[0], entries, routed)}): a budget holds only steps that "
                             f"repeat")
    return routed


def _first_difference(a: dict[Key, Counter], b: dict[Key, Counter], routed: set[Key]) -> str:
    sa, sb = _shape(a, routed), _shape(b, routed)
    for key in sorted(set(sa) | set(sb), key=lambda k: k.label()):
        if sa.get(key) != sb.get(key):
            return f"{key.label()}: {_brief(sa.get(key))} vs {_brief(sb.get(key))}"
    return "same entries"


def _brief(value) -> str:
    if value is None:
        return "no call"
    if isinstance(value, int):
        return f"{value} calls"
    return ", ".join(f"{n} x {b_in}->{b_out} B" for (b_in, b_out, _, _), n in sorted(value.items()))
