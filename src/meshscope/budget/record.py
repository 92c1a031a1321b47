"""A budget file: the typed `Budget`, written as human-readable TOML by `write` and read back by `read`.

The fields (docs/budget.md documents them for users):

``[budget]``: ``meshscope`` and ``torch`` (the versions that fitted it; another torch warns at
check), ``command`` (the job's template, ``{NAME}`` placeholders), ``trace`` (the trace options'
template), ``steady`` (steady steps each point needed, all equal), ``creation`` (the kinds of
process group rank 0 created, in order, consecutive repeats once: the order is part of the
budget), ``class_axes`` (the axes whose places make a rank class), ``classes`` (every class the
points had).

``[variables]``: ``vary`` (the ``--vary`` names and their values), ``varying`` (the names the formulas
may use), ``pinned`` (names constant at every point: the budget serves only those values).

``[[point]]`` per trace it was fitted from: ``name``, ``values`` (every variable there), ``dir``.

``[[entry]]`` per rank class and (axis, op, phase, dtype, module), one per part (a distinct size,
largest first): ``count`` (calls per steady step) and ``bytes_in`` / ``bytes_out`` (logical bytes per
call) as formulas, or ``"routed"`` / ``"assumed"`` for sizes that follow the routing or that a fake
world could not know; ``fit`` (``verified``, or ``fitted, not verified`` where the points left no
spare to test the form); ``count_also`` / ``bytes_in_also`` / ``bytes_out_also`` (other forms the
points could not tell apart: the budget serves a point only where all agree).

TOML: Python 3.11's ``tomllib`` reads it (``tomli`` on 3.10, the package's dependency there); the
standard library writes none, so `write` writes this fixed layout itself (strings as JSON escapes
them, which TOML's basic strings accept).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError
from ..core.rundir import write_atomic
from .formula import Fit, Formula, FormulaError
from .ledger import ASSUMED, ROUTED, Key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

VERIFIED, FITTED = "verified", "fitted, not verified"


@dataclass(frozen=True)
class Size:
    """A part's bytes per call: a fitted formula, or `ROUTED` / `ASSUMED`."""

    fit: Fit | None = None
    marker: str = ""

    def value(self, values: dict[str, int]) -> int | str:
        return self.marker if self.fit is None else self.fit.value(values)

    def text(self) -> str:
        return self.marker if self.fit is None else self.fit.text


@dataclass(frozen=True)
class Entry:
    key: Key
    part: int
    """Which part of the entry's calls (a distinct size), largest first."""
    count: Fit
    bytes_in: Size
    bytes_out: Size

    @property
    def verified(self) -> bool:
        return all(f.verified for f in (self.count, self.bytes_in.fit, self.bytes_out.fit) if f is not None)


@dataclass(frozen=True)
class Point:
    name: str
    values: dict[str, int]
    dir: str


@dataclass
class Budget:
    meshscope: str
    torch: str
    command: tuple[str, ...]
    trace: tuple[str, ...]
    steady: int
    creation: tuple[str, ...]
    vary: dict[str, list[int]]
    """The ``--vary`` names and their values: the grid the points span."""
    class_axes: tuple[str, ...] = ()
    """The axes whose places make a rank class (a call on another axis is an entry of the same class)."""
    classes: tuple[str, ...] = ()
    """Every rank class the points had, entries or not."""
    varying: tuple[str, ...] = ()
    pinned: dict[str, int] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)


def _s(value) -> str:
    return json.dumps(value)


def _inline(values: dict) -> str:
    """An inline table of integers or lists of integers."""
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items()) + " }" if values else "{}"


def _strings(values) -> str:
    return "[" + ", ".join(_s(v) for v in values) + "]"


def write(budget: Budget, path: Path) -> None:
    """The budget as TOML at `path`, whole or not at all."""
    lines = ["# meshscope communication budget. `meshscope check THIS_FILE` re-traces the job and holds every",
             "# entry below; docs/budget.md says what each field means.", "",
             "[budget]", f"meshscope = {_s(budget.meshscope)}", f"torch = {_s(budget.torch)}",
             f"command = {_strings(budget.command)}", f"trace = {_strings(budget.trace)}",
             f"steady = {budget.steady}", f"creation = {_strings(budget.creation)}",
             f"class_axes = {_strings(budget.class_axes)}", f"classes = {_strings(budget.classes)}", "",
             "[variables]", f"vary = {_inline(budget.vary)}", f"varying = {_strings(budget.varying)}",
             f"pinned = {_inline(budget.pinned)}", ""]
    for p in budget.points:
        lines += ["[[point]]", f"name = {_s(p.name)}", f"values = {_inline(p.values)}", f"dir = {_s(p.dir)}", ""]
    for e in budget.entries:
        k = e.key
        lines += ["[[entry]]", f"class = {_s(k.cls)}", f"axis = {_s(k.axis)}", f"op = {_s(k.op)}",
                  f"phase = {_s(k.phase)}", f"dtype = {_s(k.dtype)}", f"module = {_s(k.module)}", f"part = {e.part}",
                  f"count = {_s(e.count.text)}", f"bytes_in = {_s(e.bytes_in.text())}",
                  f"bytes_out = {_s(e.bytes_out.text())}", f"fit = {_s(VERIFIED if e.verified else FITTED)}"]
        for name, fit in (("count", e.count), ("bytes_in", e.bytes_in.fit), ("bytes_out", e.bytes_out.fit)):
            if fit is not None and len(fit.forms) > 1:
                lines.append(f"{name}_also = {_strings(f.text for f in fit.forms[1:])}")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "\n".join(lines))


def _fit(doc: dict, name: str, verified: bool) -> Fit:
    return Fit(tuple(Formula.parse(t) for t in [doc[name], *doc.get(f"{name}_also", [])]), verified)


def _size(doc: dict, name: str, verified: bool) -> Size:
    return Size(marker=doc[name]) if doc[name] in (ROUTED, ASSUMED) else Size(_fit(doc, name, verified))


def read(path: Path) -> Budget:
    """The budget at `path`; UsageError (one line) if it cannot be read as one."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"budget {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"budget {path} is not valid TOML ({exc})") from None
    try:
        head, variables = doc["budget"], doc["variables"]
        budget = Budget(head["meshscope"], head["torch"], tuple(head["command"]), tuple(head["trace"]),
                        int(head["steady"]), tuple(head["creation"]),
                        {k: list(v) for k, v in variables["vary"].items()}, tuple(head["class_axes"]),
                        tuple(head["classes"]), tuple(variables["varying"]), dict(variables["pinned"]))
        budget.points = [Point(p["name"], dict(p["values"]), p["dir"]) for p in doc.get("point", [])]
        for e in doc.get("entry", []):
            verified = e.get("fit", VERIFIED) == VERIFIED
            key = Key(e["class"], e["axis"], e["op"], e["phase"], e["dtype"], e["module"])
            budget.entries.append(Entry(key, int(e["part"]), _fit(e, "count", verified),
                                        _size(e, "bytes_in", verified), _size(e, "bytes_out", verified)))
    except KeyError as exc:
        raise UsageError(f"budget {path} lacks the field {exc.args[0]!r} (docs/budget.md lists the fields)") from None
    except FormulaError as exc:
        raise UsageError(f"budget {path}: {exc}") from None
    return budget
