"""`meshscope diff DIR_A DIR_B`: what a change did to a job's communication, said only when it can be said.

Either directory may be a trace (`meshscope trace`) or a run (`meshscope run`, whose captured
ledger is one step, step 0). Per step, axis and op, the calls and logical bytes of A and B (summed
over the ranks both hold), and per rank the first call where the two ledgers diverge (op, group,
phase, dtype, bytes, splits or peer), so that a reader sees where, not only how much.

The verdict (`Verdict`): ``same`` (every compared rank's ledgers agree), ``differ``, or
``not_comparable`` when a side cannot stand for its job: a rank that failed, did not finish or is
missing on either side (named), worlds of different sizes, or no rank traced on both sides. A rank a
side left out by design (a fake world traces one rank per class; a node's directory holds its own
ranks) is "not traced": the comparison runs on the ranks both traced and says which.

Axes are matched by their groups first (the same member lists under two names are one axis:
torchtitan's ``dp_shard`` and ``fsdp``), then by name (the same name over other groups); what is
left shows as A-only or B-only. Rows and divergences carry both names.

Fields a side marks as assumed (`CommEvent.assumed`: a fake world's all-to-all sizes, its object collectives'
stand-in sizes) are not compared:
two calls agree when every field neither side assumed agrees, and a step/axis/op total whose calls
carry assumed bytes is compared by its count only. The document's ``assumed`` says which calls and
fields were left out, so that "same" never hides what a fake world invented.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..core.errors import UsageError
from ..core.events import CommEvent, Word, compared
from ..core.result import RunResult
from ..core.rundir import RunDir
from .assemble import load

class Verdict(Word):
    SAME = "same"
    DIFFER = "differ"
    NOT_COMPARABLE = "not_comparable"


EXIT_CODES = {Verdict.SAME: 0, Verdict.DIFFER: 1, Verdict.NOT_COMPARABLE: 3}


@dataclass
class Side:
    """One directory as a diff reads it: its kind, world, the ranks it holds and how each ended."""

    path: Path
    kind: str
    """``trace`` or ``run``."""
    world: int
    events: list[CommEvent]
    status: dict[int, str]
    """Rank -> how it ended (`core.rank_end.RankEnd.status`; a finished run's ranks are ``ok``)."""

    @property
    def held(self) -> set[int]:
        return set(self.status)


def load_side(path: Path) -> Side:
    """A trace or run directory as one side of a diff; UsageError for anything else."""
    run_dir = RunDir(path)
    if not run_dir.path.is_dir():
        raise UsageError(f"{path} is not a directory; give two trace or run directories")
    kind = run_dir.kind()
    if kind == "trace":
        result = load(run_dir)
        return Side(run_dir.path, "trace", result.world, result.events, {r.rank: r.status for r in result.ranks})
    doc = run_dir.read_result()
    if doc is None:
        raise UsageError(f"{path} holds neither a trace nor a finished run (no result.json)")
    if doc.get("kind") == "suite" or "experiment" not in doc:
        raise UsageError(f"{path} is a {doc.get('kind', 'different')} directory; diff compares traces and runs")
    result = RunResult.from_json(doc)
    events = [e if e.step is not None else replace(e, step=0) for e in result.captured]
    return Side(run_dir.path, "run", result.world, events, {r: "ok" for r in range(result.world)})


@dataclass
class AxisMatch:
    """An axis of A, of B, or of both, and how the two were matched."""

    a: str | None
    b: str | None
    by: str | None
    """``members`` (the same groups), ``name`` (the same name, other groups), None (one side only)."""

    @property
    def label(self) -> str:
        if self.a == self.b or self.b is None:
            return self.a or ""
        return self.b if self.a is None else f"{self.a}={self.b}"

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "matched_by": self.by}


def match_axes(a: dict[str, set], b: dict[str, set]) -> list[AxisMatch]:
    """Axis name -> its groups on each side, matched: same name and groups, then same groups, then same
    name; the rest one-sided."""
    out, left_a, left_b = [], dict(a), dict(b)
    for rule in ("both", "members", "name"):
        for name_a, groups_a in sorted(left_a.items()):
            candidates = sorted(n for n, g in left_b.items()
                                if (rule == "both" and n == name_a and g == groups_a)
                                or (rule == "members" and g == groups_a) or (rule == "name" and n == name_a))
            if len(candidates) == 1 or (candidates and rule == "both"):
                name_b = candidates[0]
                out.append(AxisMatch(name_a, name_b, "name" if rule == "name" else "members"))
                del left_a[name_a], left_b[name_b]
    out += [AxisMatch(n, None, None) for n in sorted(left_a)] + [AxisMatch(None, n, None) for n in sorted(left_b)]
    return sorted(out, key=lambda m: m.label)


@dataclass
class Diff:
    """The ``diff --json`` document (docs/design.md, "Stable interfaces")."""

    a: Side
    b: Side
    verdict: Verdict
    ranks: list[int]
    """The ranks compared: those both sides traced."""
    reasons: list[str] = field(default_factory=list)
    """Why the two cannot be compared (``not_comparable``)."""
    not_traced: dict[str, list[int]] = field(default_factory=dict)
    axes: list[AxisMatch] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    first_divergence: dict[int, dict] = field(default_factory=dict)
    assumed: dict = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return self.verdict == Verdict.SAME

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict:
        return {"kind": "diff", "a": str(self.a.path), "b": str(self.b.path), "kinds": [self.a.kind, self.b.kind],
                "verdict": self.verdict, "same": self.same, "ranks": self.ranks, "not_comparable": self.reasons,
                "not_traced": self.not_traced, "axes": [m.to_json() for m in self.axes], "rows": self.rows,
                "first_divergence": self.first_divergence, "assumed": self.assumed}


SIGNATURE = ("step", "op", "axis", "group", "phase", "region", "dtype", "bytes_in", "bytes_out", "input_splits",
             "output_splits", "peer")
"""The fields two calls at the same place of a rank's ledgers must share (the axis by its match)."""


def _same(x: CommEvent, y: CommEvent) -> bool:
    return all(getattr(x, f) == getattr(y, f) for f in compared(x, y, SIGNATURE))


def _brief(e: CommEvent | None, axis: str | None = None) -> str:
    if e is None:
        return "nothing"
    splits = f" splits {list(e.input_splits)}" if e.input_splits else ""
    return (f"step {e.step} {e.op} {axis or e.axis}{list(e.group)} {e.phase} {e.dtype} {e.bytes_in}->{e.bytes_out} "
            f"B{splits}")


def _unfit(side: Side, name: str) -> list[str]:
    bad = sorted(r for r, s in side.status.items() if s not in ("ok", "stopped"))
    if not bad:
        return []
    kinds = sorted({side.status[r] for r in bad})
    return [f"{name} ({side.path}): ranks {bad} {'/'.join(kinds)}: a rank that did not end cannot stand for the job"]


def diff(dir_a: Path, dir_b: Path) -> Diff:
    a, b = load_side(dir_a), load_side(dir_b)
    reasons = _unfit(a, "A") + _unfit(b, "B")
    if a.world != b.world:
        reasons.append(f"A is a world of {a.world} ranks and B of {b.world}: the same job at two sizes has other "
                       f"ledgers")
    ranks = sorted(a.held & b.held)
    if not ranks:
        reasons.append(f"no rank is traced on both sides (A holds {sorted(a.held)}, B {sorted(b.held)})")
    not_traced = {"a": sorted(b.held - a.held), "b": sorted(a.held - b.held)}
    result = Diff(a, b, Verdict.NOT_COMPARABLE if reasons else Verdict.SAME, ranks, reasons, not_traced)
    if reasons:
        return result
    xs = [e for e in a.events if e.rank in ranks]
    ys = [e for e in b.events if e.rank in ranks]
    groups_a, groups_b = defaultdict(set), defaultdict(set)
    for events, groups in ((xs, groups_a), (ys, groups_b)):
        for e in events:
            groups[e.axis].add(e.group)
    result.axes = match_axes(dict(groups_a), dict(groups_b))
    # B's calls under A's axis names, so that a matched axis compares as one
    rename = {m.b: m.a for m in result.axes if m.a is not None and m.b is not None}
    ys = [replace(e, axis=rename[e.axis]) if e.axis in rename else e for e in ys]
    label = {m.a if m.a is not None else m.b: m for m in result.axes}
    result.rows, result.assumed = _totals(xs, ys, label, ranks)
    result.first_divergence = _divergences(xs, ys, label, ranks)
    result.verdict = Verdict.SAME if not result.rows and not result.first_divergence else Verdict.DIFFER
    return result


def _totals(xs, ys, label: dict[str, AxisMatch], ranks) -> tuple[list[dict], dict]:
    totals: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    guessed: dict[tuple, int] = defaultdict(int)  # (step, axis, op) -> calls with assumed bytes, both sides
    fields: set[str] = set()
    for side, events in ((0, xs), (1, ys)):
        for e in events:
            key = (e.step or 0, e.axis, e.op)
            slot = totals[key]
            slot[side] += 1
            slot[2 + side] += max(e.bytes_in, e.bytes_out)
            if e.assumed:
                fields.update(e.assumed)
                guessed[key] += "bytes_in" in e.assumed or "bytes_out" in e.assumed
    rows = [{"step": s, "axis": label[ax].label, "axis_a": label[ax].a, "axis_b": label[ax].b, "op": op,
             "count_a": ca, "count_b": cb, "bytes_a": ba, "bytes_b": bb, "bytes_assumed": bool(guessed[(s, ax, op)])}
            for (s, ax, op), (ca, cb, ba, bb) in sorted(totals.items())
            if ca != cb or (ba != bb and not guessed[(s, ax, op)])]
    assumed = {"calls": {"a": sum(1 for e in xs if e.assumed), "b": sum(1 for e in ys if e.assumed)},
               "fields": sorted(fields),
               "totals": [{"step": s, "axis": label[ax].label, "op": op} for (s, ax, op), n in sorted(guessed.items()) if n]}
    return rows, assumed


def _divergences(xs, ys, label: dict[str, AxisMatch], ranks) -> dict[int, dict]:
    first = {}
    for r in ranks:
        mine = sorted((e for e in xs if e.rank == r), key=lambda e: (e.step or 0, e.t_issue or 0, e.seq))
        theirs = sorted((e for e in ys if e.rank == r), key=lambda e: (e.step or 0, e.t_issue or 0, e.seq))
        for i in range(max(len(mine), len(theirs))):
            x, y = (mine[i] if i < len(mine) else None), (theirs[i] if i < len(theirs) else None)
            if x is None or y is None or not _same(x, y):
                axis_b = label[y.axis].b if y is not None and y.axis in label else None
                first[r] = {"index": i, "a": _brief(x), "b": _brief(y, axis_b),
                            "axis_a": x.axis if x is not None else None, "axis_b": axis_b}
                break
    return first
