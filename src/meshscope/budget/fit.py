"""From traced points to a `Budget`: every entry's count and bytes as the simplest formulas that hold
at every point (`formula.fit_count`, `formula.fit_bytes`).

A variable that takes one value at every point is pinned: no formula may use it, and the budget serves
only that value. An entry is fitted from the points where its rank class exists (a ``middle`` class
needs an axis of three or more); where the class exists but the entry has no call, its count there
is 0. Each entry's parts (distinct sizes, largest first) must be as many at every point it has
calls; where they are not, the module key is too coarse for a budget and the entry is named.
"""

from __future__ import annotations

from ..core.errors import UsageError
from .formula import FormulaError, fit_bytes, fit_count
from .ledger import ASSUMED, ROUTED, Key, Observed, Part
from .record import Budget, Entry, Point, Size
from .template import point_name


def _size(points: list[tuple[dict[str, int], int | str]], varying: list[str], what: str) -> Size:
    markers = {b for _, b in points if isinstance(b, str)}
    if markers:
        return Size(marker=ASSUMED if ASSUMED in markers else ROUTED)
    try:
        return Size(fit_bytes(points, varying))
    except FormulaError as exc:
        raise UsageError(f"{what}: {exc}") from None


def fit(head: Budget, observed: list[tuple[dict[str, int], Observed, str]]) -> Budget:
    """`head` (the budget's header fields) with its points and entries filled in from `observed`:
    (the point's variables, what it observed, its directory) per point."""
    names = sorted(set.intersection(*(set(v) for v, _, _ in observed)))
    varying = [n for n in names if len({v[n] for v, _, _ in observed}) > 1]
    head.varying = tuple(varying)
    head.pinned = {n: observed[0][0][n] for n in names if n not in varying}
    head.points = [Point(point_name({k: v[k] for k in head.vary}), v, d) for v, _, d in observed]
    head.classes = tuple(sorted({c for _, o, _ in observed for c in o.classes}))
    keys = sorted({k for _, o, _ in observed for k in o.entries}, key=lambda k: k.label())
    for key in keys:
        present = [(v, o.entries.get(key, ())) for v, o, _ in observed if key.cls in o.classes]
        parts = {len(p) for _, p in present if p}
        if len(parts) > 1:
            raise UsageError(f"entry {key.label()}: {sorted(parts)} distinct call sizes at different points; the "
                             f"module key cannot tell its calls apart, so no budget of per-call sizes can be fitted")
        for i in range(parts.pop()):
            at = [(v, p[i] if p else Part(0, 0, 0)) for v, p in present]
            what = f"entry {key.label()} part {i}"
            try:
                count = fit_count([(v, part.count) for v, part in at], varying)
            except FormulaError as exc:
                raise UsageError(f"{what}: {exc}") from None
            sized = [(v, part) for v, part in at if part.count]
            head.entries.append(Entry(key, i, count, _size([(v, p.bytes_in) for v, p in sized], varying, what),
                                      _size([(v, p.bytes_out) for v, p in sized], varying, what)))
    return head


def moved(old: Budget, new: Budget) -> list[str]:
    """What `--update` changed, one line per entry: added, removed, or a formula that moved."""
    def index(b: Budget) -> dict[tuple[Key, int], Entry]:
        return {(e.key, e.part): e for e in b.entries}

    was, now = index(old), index(new)
    lines = []
    for k in sorted(set(was) | set(now), key=lambda k: (k[0].label(), k[1])):
        label = f"{k[0].label()} part {k[1]}"
        if k not in now:
            lines.append(f"removed {label}")
        elif k not in was:
            lines.append(f"added {label}: count {now[k].count.text}, bytes {now[k].bytes_in.text()} -> "
                         f"{now[k].bytes_out.text()}")
        else:
            a, b = was[k], now[k]
            for field, x, y in (("count", a.count.text, b.count.text), ("bytes_in", a.bytes_in.text(), b.bytes_in.text()),
                                ("bytes_out", a.bytes_out.text(), b.bytes_out.text())):
                if x != y:
                    lines.append(f"moved {label}: {field} {x} -> {y}")
    if old.creation != new.creation:
        lines.append(f"moved group creation order: {list(old.creation)} -> {list(new.creation)}")
    return lines

