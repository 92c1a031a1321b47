"""``meshscope check``: a re-trace held to a budget, entry by entry.

Each entry's formulas are evaluated at the re-trace's variables and compared with what its rank class
issued in a steady step: the count, and each part's bytes per call in and out (``routed`` and
``assumed`` sizes are not compared). A call kind the budget does not list is a violation; so is an
entry with no call, and a change in the order of group creation. The verdict (`Verdict`):

- ``holds``: every entry held at every point re-traced (exit 0);
- ``violated``: a table of what moved (exit 1): the entry, expected, got, and the first call of that
  entry in the step (its module and phase);
- ``not_passed``: a re-trace that was empty, failed or incomplete (exit 3): never a pass.

A point the budget cannot serve (a pinned variable at another value, a rank class it never saw, forms
that disagree there) is bad input (`UsageError`, exit 2), said before any verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import UsageError
from ..core.events import CommEvent, Word, human_bytes
from ..core.trace_result import Outcome, TraceResult
from ..trace.fake.classes import OTHER
from .formula import FormulaError
from .ledger import ASSUMED, ROUTED, Key, Observed, Part, module_key, observe
from .points import creation_order, variables
from .record import Budget, Entry

class Verdict(Word):
    HOLDS = "holds"
    VIOLATED = "violated"
    NOT_PASSED = "not_passed"


EXIT_CODES = {Verdict.HOLDS: 0, Verdict.VIOLATED: 1, Verdict.NOT_PASSED: 3}


@dataclass(frozen=True)
class Violation:
    """One entry that moved."""

    entry: str
    part: int
    field: str
    """``count``, ``bytes_in``, ``bytes_out``, ``unlisted`` (a call kind the budget has not) or ``creation``."""
    expected: str
    got: str
    first_call: str
    """The entry's first call in the re-traced step: its position, module and phase ('' where none)."""

    def to_json(self) -> dict:
        return {"entry": self.entry, "part": self.part, "field": self.field, "expected": self.expected,
                "got": self.got, "first_call": self.first_call}


@dataclass
class PointCheck:
    name: str
    values: dict[str, int]
    run_dir: str
    outcome: str
    """The re-trace's outcome (`core.trace_result.Outcome`)."""
    violations: list[Violation] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "values": self.values, "run_dir": self.run_dir, "outcome": self.outcome,
                "violations": [v.to_json() for v in self.violations]}


@dataclass
class BudgetCheck:
    """The ``check --json`` document (docs/design.md, "Stable interfaces")."""

    budget: str
    points: list[PointCheck] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        if any(p.outcome != Outcome.PASSED for p in self.points):
            return Verdict.NOT_PASSED
        return Verdict.VIOLATED if any(p.violations for p in self.points) else Verdict.HOLDS

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict:
        return {"kind": "check", "budget": self.budget, "verdict": self.verdict,
                "points": [p.to_json() for p in self.points], "warnings": self.warnings}


def servable(budget: Budget, values: dict[str, int]) -> None:
    """UsageError when the budget's formulas cannot serve a point with these variables."""
    for name, value in budget.pinned.items():
        if name in values and values[name] != value:
            raise UsageError(f"the budget was fitted at {name} = {value} only, and this trace has {name} = "
                             f"{values[name]}: fit it at two or more values of {name} (--vary) to check others")
    missing = sorted(set(budget.varying) - set(values))
    if missing:
        raise UsageError(f"the budget's formulas use {', '.join(missing)}, which this trace does not give "
                         f"(give --vary values through the job's arguments as the budget's command has them)")


def _expected(entry: Entry, values: dict[str, int]) -> Part:
    try:
        return Part(entry.count.value(values), entry.bytes_in.value(values), entry.bytes_out.value(values))
    except FormulaError as exc:
        raise UsageError(f"entry {entry.key.label()} part {entry.part}: {exc}") from None


def _first_call(calls: list[CommEvent], key: Key) -> str:
    for i, e in enumerate(calls):
        if (e.axis, e.op, e.phase, e.dtype, module_key(e.region)) == (key.axis, key.op, key.phase, key.dtype,
                                                                      key.module):
            return (f"step {e.step} call #{i}: {e.op} on {e.axis}{list(e.group)} in {e.phase}"
                    f"{', module ' + e.region if e.region else ', no module'}, {human_bytes(e.bytes_in)} -> "
                    f"{human_bytes(e.bytes_out)}")
    return ""


def _text(value: int | str) -> str:
    return value if isinstance(value, str) else str(value)


def _older_places(listed, observed) -> bool:
    """A budget fitted before rank classes were a fake world's places (`ledger.rank_class`): none of its
    classes has an ``other`` member where this trace's do."""
    other = f"={OTHER}"
    return any(other in c for c in observed) and not any(other in c for c in listed)


def compare(budget: Budget, result: TraceResult, values: dict[str, int], name: str) -> PointCheck:
    """One re-trace held to the budget (`values`: the point's ``--vary`` values, its variables are
    added from the trace)."""
    point = PointCheck(name, values, result.run_dir, result.outcome)
    if result.outcome != Outcome.PASSED:
        return point
    seen = variables(result, values)
    point.values = seen
    servable(budget, seen)
    observed: Observed = observe(result, budget.steady, budget.class_axes)
    unknown = sorted(set(observed.classes) - set(budget.classes))
    if unknown and _older_places(budget.classes, observed.classes):
        shown = ", ".join(f"[{c}]" for c in budget.classes[:3]) + (", ..." if len(budget.classes) > 3 else "")
        raise UsageError(f"rank class [{unknown[0]}] of this trace is not in the budget, whose classes "
                         f"({shown}) place ranks first, middle or last on every axis, as an older "
                         f"meshscope did (a member after the first is '{OTHER}' now): re-fit it with "
                         f"`meshscope check FILE --update`")
    if unknown:
        raise UsageError(f"rank class [{unknown[0]}] of this trace is not in the budget (its points never had it: "
                         f"fit the budget at a world that has it)")
    listed: dict[Key, list[Entry]] = {}
    for e in budget.entries:
        listed.setdefault(e.key, []).append(e)
    for key in sorted(set(listed) | set(observed.entries), key=lambda k: k.label()):
        if key.cls not in observed.classes:
            continue  # a class this world has none of
        got = observed.entries.get(key, ())
        calls = observed.calls[key.cls]
        if key not in listed:
            for i, part in enumerate(got):
                point.violations.append(Violation(key.label(), i, "unlisted", "no such call",
                                                  f"{part.count} x {_text(part.bytes_in)} -> {_text(part.bytes_out)} B",
                                                  _first_call(calls, key)))
            continue
        entries = sorted(listed[key], key=lambda e: e.part)
        for entry in entries:
            want = _expected(entry, seen)
            have = got[entry.part] if entry.part < len(got) else Part(0, 0, 0)
            for field_, w, h in (("count", want.count, have.count), ("bytes_in", want.bytes_in, have.bytes_in),
                                 ("bytes_out", want.bytes_out, have.bytes_out)):
                if field_ != "count" and (not want.count or not have.count or w in (ROUTED, ASSUMED)
                                          or h in (ROUTED, ASSUMED)):
                    continue  # no calls on one side, or a size the budget does not hold
                if w != h:
                    point.violations.append(Violation(key.label(), entry.part, field_, _text(w), _text(h),
                                                      _first_call(calls, key)))
        for i, part in enumerate(got[len(entries):], start=len(entries)):
            point.violations.append(Violation(key.label(), i, "unlisted", "no call of this size",
                                              f"{part.count} x {_text(part.bytes_in)} -> {_text(part.bytes_out)} B",
                                              _first_call(calls, key)))
    order = creation_order(result)
    if order != budget.creation:
        point.violations.append(Violation("group creation order", 0, "creation", " -> ".join(budget.creation),
                                          " -> ".join(order), ""))
    return point
