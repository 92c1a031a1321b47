"""A budget's command as a template: ``{NAME}`` placeholders, the ``--vary`` grid, and a given command
matched back to the values it stands for.

``meshscope budget --vary layers=2,3,4 -- job.py --layers {layers}`` traces ``job.py --layers 2``,
``--layers 3`` and ``--layers 4``. Placeholders may stand anywhere in the job's arguments and in the
values of the trace options (``--fake-world {world}``); only ``--vary`` names are substituted, and
``{{`` / ``}}`` stand for a literal brace. Several ``--vary`` make a grid. Values are integers: they
become the variables of the budget's formulas. `match` reads the values back from a command given to
``meshscope check``: it must equal the template token for token except at placeholders.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from ..core.errors import UsageError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")
_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


@dataclass(frozen=True)
class Vary:
    """One ``--vary NAME=V1,V2,...``."""

    name: str
    values: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Vary:
        name, sep, values = text.partition("=")
        if not sep or not _NAME.match(name.strip()):
            raise UsageError(f"--vary {text!r}: give NAME=V1,V2,... with NAME an identifier (e.g. layers=2,3,4)")
        try:
            parsed = tuple(int(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise UsageError(f"--vary {text!r}: values must be integers (they are the variables of the formulas), "
                             f"e.g. {name.strip()}=2,3,4") from None
        if not parsed or len(set(parsed)) != len(parsed):
            raise UsageError(f"--vary {text!r}: give distinct integer values, e.g. {name.strip()}=2,3,4")
        return cls(name.strip(), parsed)


def grid(varies: list[Vary]) -> list[dict[str, int]]:
    """Every combination of the ``--vary`` values (one point without any)."""
    names = [v.name for v in varies]
    if len(set(names)) != len(names):
        raise UsageError(f"--vary names repeat: {', '.join(names)}; give each name once")
    return [dict(zip(names, combo)) for combo in itertools.product(*(v.values for v in varies))]


def point_name(values: dict[str, int]) -> str:
    """``layers=2,world=16``: a point's name and its subdirectory of ``--out``."""
    return ",".join(f"{k}={v}" for k, v in values.items()) or "point"


def _fields(token: str) -> list[str | None]:
    """The token as literal pieces and placeholder names (None marks where a piece is literal)."""
    out, pos = [], 0
    for m in _FIELD.finditer(token):
        out.append(token[pos:m.start()])
        text = m.group(0)
        if text in ("{{", "}}"):
            out.append(text[0])
        elif m.group(1) is None:
            raise UsageError(f"argument {token!r}: a lone {text!r}; write {text * 2!r} for a literal brace")
        else:
            out.append(("name", m.group(1)))
        pos = m.end()
    out.append(token[pos:])
    return out


def names_in(tokens: list[str]) -> set[str]:
    return {f[1] for t in tokens for f in _fields(t) if isinstance(f, tuple)}


def check_names(tokens: list[str], varies: list[Vary]) -> None:
    """Every placeholder names a ``--vary``; UsageError naming the first that does not."""
    known = {v.name for v in varies}
    for t in tokens:
        for f in _fields(t):
            if isinstance(f, tuple) and f[1] not in known:
                raise UsageError(f"argument {t!r}: placeholder {{{f[1]}}} names no --vary "
                                 f"(give --vary {f[1]}=V1,V2 or write {{{{ for a literal brace)")


def substitute(tokens: list[str], values: dict[str, int]) -> list[str]:
    out = []
    for t in tokens:
        pieces = []
        for f in _fields(t):
            if isinstance(f, tuple):
                if f[1] not in values:
                    raise UsageError(f"argument {t!r}: no value for {{{f[1]}}}")
                pieces.append(str(values[f[1]]))
            else:
                pieces.append(f)
        out.append("".join(pieces))
    return out


def match(template: list[str], given: list[str], what: str) -> dict[str, int]:
    """The placeholder values `given` holds where `template` has them; UsageError naming the first token
    that differs (`what`: "the job's arguments", "the trace options")."""
    if len(template) != len(given):
        raise UsageError(f"{what} {given} do not match the budget's {template}: {len(given)} tokens where it has "
                         f"{len(template)}")
    values: dict[str, int] = {}
    for t, g in zip(template, given):
        m = re.fullmatch(_pattern(_fields(t)), g)
        if m is None:
            raise UsageError(f"{what}: {g!r} does not match the budget's {t!r}")
        for name, value in m.groupdict().items():
            got = int(value)
            if values.setdefault(name, got) != got:
                raise UsageError(f"{what}: {{{name}}} is {values[name]} in one place and {got} in another")
    return values


def _pattern(fields: list) -> str:
    """A regular expression of a token's fields: a placeholder's first use captures an integer, a repeat
    must equal it."""
    seen: set[str] = set()
    parts = []
    for f in fields:
        if isinstance(f, tuple):
            parts.append(f"(?P={f[1]})" if f[1] in seen else f"(?P<{f[1]}>-?\\d+)")
            seen.add(f[1])
        else:
            parts.append(re.escape(f))
    return "".join(parts)
