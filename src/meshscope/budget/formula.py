"""Formulas of a budget: a small safe grammar, exact evaluation, and fitting to observed points.

A budget states each entry's calls per step and bytes per call as formulas in the variables of its
points (the ``--vary`` names, the job's axis sizes, ``world``): ``2*layers + 2``, ``65536 / dp``,
``4 * ceil(262144 / (4 * dp))``. They are parsed here, never handed to ``eval``:

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | NAME | "(" expr ")" | "ceil" "(" expr ")" | "-" factor

and evaluated in exact fractions; a value that is not a whole number at some point is an error, not
a rounding.

Fitting (`fit_count`, `fit_bytes`) looks for the simplest form that reproduces every point exactly:

- counts: affine in each variable with integer coefficients (``c0 + c1*x + c2*y + c12*x*y``), the
  fewest terms first;
- bytes per call: a constant, or proportional to one variable or its inverse (``k*x``, ``k/x``), or
  the inverse rounded up to a granule (``m * ceil(k / (m*x))``: FSDP2 pads each parameter's dim 0 to a
  multiple of the mesh size, torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param.py, so a shard
  of r rows of w bytes is w * ceil(r / x)).

A form with as many parameters as points is "fitted, not verified": any such points fit it. More
points than parameters verify it. Where several forms of the same size fit (the points do not tell
``2*dp`` from ``world / 4`` when both grow together), every one is kept: the budget then serves a
point only where they all agree (`Fit.value`), so a dependence the points do not determine is never
guessed.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

from ..core.errors import UsageError

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9]*)|(.))")


class FormulaError(UsageError):
    """A formula that does not parse, names an unknown variable, or is not whole at a point."""


@dataclass(frozen=True)
class Formula:
    """A parsed formula: its text and its tree (nested tuples: ``("+", a, b)``, ``("n", 3)``, ``("v", "dp")``)."""

    text: str
    tree: tuple

    @classmethod
    def parse(cls, text: str) -> Formula:
        tokens = [(m.group(1), m.group(2), m.group(3)) for m in _TOKEN.finditer(text) if m.group(0).strip()]
        parser = _Parser(text, tokens)
        tree = parser.expr()
        if parser.i != len(tokens):
            raise FormulaError(f"formula {text!r}: unexpected {''.join(t for t in tokens[parser.i] if t)!r}")
        return cls(text, tree)

    @property
    def names(self) -> set[str]:
        out: set[str] = set()

        def walk(node):
            if node[0] == "v":
                out.add(node[1])
            elif node[0] not in ("n",):
                for child in node[1:]:
                    walk(child)
        walk(self.tree)
        return out

    def evaluate(self, values: dict[str, int]) -> int:
        """The formula's value at `values`; FormulaError if a name is missing or the value is not whole."""
        missing = sorted(self.names - set(values))
        if missing:
            raise FormulaError(f"formula {self.text!r} needs {', '.join(missing)}, which this point does not give")
        value = _eval(self.tree, values)
        if value.denominator != 1:
            raise FormulaError(f"formula {self.text!r} is {value} at {values}, not a whole number")
        return int(value)

    def __str__(self) -> str:
        return self.text


class _Parser:
    def __init__(self, text, tokens):
        self.text, self.tokens, self.i = text, tokens, 0

    def _peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None, None)

    def _take(self, op):
        if self._peek()[2] == op:
            self.i += 1
            return True
        return False

    def expr(self):
        node = self.term()
        while self._peek()[2] in ("+", "-"):
            op = self._peek()[2]
            self.i += 1
            node = (op, node, self.term())
        return node

    def term(self):
        node = self.factor()
        while self._peek()[2] in ("*", "/"):
            op = self._peek()[2]
            self.i += 1
            node = (op, node, self.factor())
        return node

    def factor(self):
        number, name, other = self._peek()
        if number is not None:
            self.i += 1
            return ("n", int(number))
        if name == "ceil":
            self.i += 1
            if not self._take("("):
                raise FormulaError(f"formula {self.text!r}: ceil needs '('")
            node = self.expr()
            if not self._take(")"):
                raise FormulaError(f"formula {self.text!r}: missing ')' after ceil(...")
            return ("ceil", node)
        if name is not None:
            self.i += 1
            return ("v", name)
        if other == "(":
            self.i += 1
            node = self.expr()
            if not self._take(")"):
                raise FormulaError(f"formula {self.text!r}: missing ')'")
            return node
        if other == "-":
            self.i += 1
            return ("neg", self.factor())
        got = other or "the end"
        raise FormulaError(f"formula {self.text!r}: expected a number, a name, '(' or ceil(...), got {got!r}")


def _eval(node, values) -> Fraction:
    kind = node[0]
    if kind == "n":
        return Fraction(node[1])
    if kind == "v":
        return Fraction(values[node[1]])
    if kind == "neg":
        return -_eval(node[1], values)
    if kind == "ceil":
        return Fraction(math.ceil(_eval(node[1], values)))
    a, b = _eval(node[1], values), _eval(node[2], values)
    if kind == "/":
        if b == 0:
            raise FormulaError(f"division by zero at {values}")
        return a / b
    return {"+": a + b, "-": a - b, "*": a * b}[kind]


# -- fitting ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fit:
    """The forms that reproduce every point, all of the fewest parameters, and whether points to spare
    verify them."""

    forms: tuple[Formula, ...]
    verified: bool

    @property
    def text(self) -> str:
        return self.forms[0].text

    def value(self, values: dict[str, int]) -> int:
        """The value every form gives at `values`; FormulaError where they disagree (the points did not
        determine which one holds)."""
        got = {f.text: f.evaluate(values) for f in self.forms}
        if len(set(got.values())) > 1:
            raise FormulaError("the fitted points do not determine this value here: " +
                               ", ".join(f"{t} = {v}" for t, v in got.items()))
        return next(iter(got.values()))


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction] | None:
    """The unique exact solution of the (possibly overdetermined) system, None if there is none or it is
    not unique."""
    n = len(rows[0])
    m = [list(r) + [b] for r, b in zip(rows, rhs)]
    pivots, r = [], 0
    for c in range(n):
        p = next((i for i in range(r, len(m)) if m[i][c] != 0), None)
        if p is None:
            return None  # a free column: not determined by the points
        m[r], m[p] = m[p], m[r]
        m[r] = [v / m[r][c] for v in m[r]]
        for i in range(len(m)):
            if i != r and m[i][c] != 0:
                f = m[i][c]
                m[i] = [a - f * b for a, b in zip(m[i], m[r])]
        pivots.append(c)
        r += 1
    if any(row[-1] != 0 for row in m[r:]):
        return None  # inconsistent: the points fit no such form
    return [m[i][-1] for i in range(n)]


def _monomial_text(names: tuple[str, ...]) -> str:
    return "*".join(names)


def _affine_text(terms: list[tuple[tuple[str, ...], int]]) -> str:
    """``2*layers + 2``: the variable terms first, by degree, the constant last."""
    parts = []
    for names, c in sorted(terms, key=lambda t: (len(t[0]) == 0, len(t[0]), t[0])):
        if c == 0:
            continue
        body = _monomial_text(names)
        magnitude = abs(c)
        piece = str(magnitude) if not names else (body if magnitude == 1 else f"{magnitude}*{body}")
        parts.append(("-" if c < 0 else "+", piece))
    if not parts:
        return "0"
    text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    for sign, piece in parts[1:]:
        text += f" {sign} {piece}"
    return text


def fit_count(points: list[tuple[dict[str, int], int]], varying: list[str]) -> Fit:
    """The fewest-term multi-affine forms with integer coefficients that give every point's count."""
    monomials = [()] + [combo for k in range(1, len(varying) + 1) for combo in itertools.combinations(varying, k)]
    for size in range(1, len(monomials) + 1):
        found = []
        for chosen in itertools.combinations(monomials, size):
            if () not in chosen:  # the constant term is always allowed and always first
                continue
            rows = [[Fraction(math.prod(v[n] for n in mono)) for mono in chosen] for v, _ in points]
            solution = _solve(rows, [Fraction(c) for _, c in points])
            if solution is None or any(s.denominator != 1 for s in solution):
                continue
            if size > 1 and any(s == 0 for s in solution[1:]):
                continue  # a smaller form holds it
            found.append(Formula.parse(_affine_text(list(zip(chosen, map(int, solution))))))
        if found:
            return Fit(tuple(found), verified=len(points) > size)
        if size >= len(points):
            break
    raise FormulaError("no count form with integer coefficients fits " +
                       ", ".join(f"{c} at {v}" for v, c in points))


def fit_bytes(points: list[tuple[dict[str, int], int]], varying: list[str]) -> Fit:
    """The simplest bytes-per-call forms that give every point's bytes (module docstring)."""
    sizes = [b for _, b in points]
    if len(set(sizes)) == 1:
        return Fit((Formula.parse(str(sizes[0])),), verified=len(points) > 1)
    found: list[Formula] = []
    for x in varying:
        ratios = {Fraction(b, v[x]) for v, b in points}
        if len(ratios) == 1:
            k = ratios.pop()
            found.append(Formula.parse(f"{k.numerator}*{x}" if k.denominator == 1 else f"{k.numerator}*{x} / {k.denominator}"))
        products = {b * v[x] for v, b in points}
        if len(products) == 1:
            found.append(Formula.parse(f"{products.pop()} / {x}"))
    if found:
        return Fit(tuple(found), verified=len(points) > 2)
    granule = math.gcd(*sizes)
    for x in varying:
        # m * ceil(k / (m * x)) == b  <=>  (b/m - 1) * m * x < k <= b * x
        lo = max((b // granule - 1) * granule * v[x] + 1 for v, b in points)
        hi = min(b * v[x] for v, b in points)
        if lo <= hi:
            found += [Formula.parse(f"{granule} * ceil({k} / ({granule} * {x}))") for k in dict.fromkeys((lo, hi))]
    if found:
        return Fit(tuple(found), verified=len(points) > 3)
    raise FormulaError("no bytes form (constant, k*x, k/x, a padded k/x) fits " +
                       ", ".join(f"{b} B at {v}" for v, b in points))
