"""``meshscope budget`` and ``meshscope check``: trace the points, fit or hold the budget.

`make` traces every point of the ``--vary`` grid (one trace each, in its own subdirectory of
``--out``), requires each to pass with enough equal steady steps, fits the entries (`fit.fit`) and
writes the TOML (`record.write`). `check` re-traces either the command given (whose tokens must
match the budget's templates except at placeholders, which give the values) or every stored point,
and holds each re-trace to the budget (`check.compare`); with ``update`` it fits the budget anew
from the re-traces, writes it, and says what moved.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .. import __version__
from ..core.errors import UsageError
from ..core.trace_result import Outcome
from .check import BudgetCheck, PointCheck, Verdict, compare
from .fit import fit, moved
from .ledger import class_axes, observe
from .points import creation_order, parse_trace_options, trace_point, variables
from .record import Budget, read, write
from .template import Vary, check_names, grid, match, point_name, substitute

STEADY = 2
"""Steady steps every point needs (all equal; `core.steady` finds where they start)."""


def _torch_version() -> str:
    from ..capture.native_build import torch_version

    return torch_version()


def _say(echo):
    return echo or (lambda line: sys.stderr.write(line))


def make(trace_tokens: list[str], command: list[str], varies: list[Vary], out: Path, path: Path,
         echo=None) -> Budget:
    """Trace every point, fit and write the budget at `path`; UsageError where a point does not pass."""
    say = _say(echo)
    check_names(list(trace_tokens) + list(command), varies)
    points = grid(varies)
    for values in points:  # every point's options are valid before the first trace starts
        parse_trace_options(substitute(trace_tokens, values))
    head = Budget(__version__, _torch_version(), tuple(command), tuple(trace_tokens), STEADY, (),
                  {v.name: list(v.values) for v in varies})
    observed = []
    for i, values in enumerate(points, 1):
        say(f"meshscope budget: point {i}/{len(points)} {point_name(values)}\n")
        result = trace_point(trace_tokens, command, values, out, echo)
        if result.outcome != Outcome.PASSED:
            raise UsageError(f"point {point_name(values)}: the trace is {result.outcome} "
                             f"({result.error.line() if result.error else 'see its report'}; {result.run_dir}): a "
                             f"budget is fitted from passed traces only")
        order = creation_order(result)
        if head.creation and order != head.creation:
            raise UsageError(f"point {point_name(values)} creates its groups in another order than the first point "
                             f"({list(order)} vs {list(head.creation)})")
        head.creation = order
        axes = class_axes(result)
        if head.class_axes and axes != head.class_axes:
            raise UsageError(f"point {point_name(values)} has the axes {list(axes)} and the first point "
                             f"{list(head.class_axes)}: a budget's rank classes need the same axes at every point")
        head.class_axes = axes
        observed.append((variables(result, values), observe(result, STEADY, axes), result.run_dir))
    budget = fit(head, observed)
    write(budget, path)
    return budget


def check(path: Path, trace_tokens: list[str] | None, command: list[str] | None, out: Path, update: bool = False,
          echo=None) -> BudgetCheck:
    """Re-trace and hold the budget at `path` (module docstring)."""
    say = _say(echo)
    budget = read(path)
    result = BudgetCheck(str(path))
    torch = _torch_version()
    if torch != budget.torch:
        result.warnings.append(f"the budget was fitted on torch {budget.torch} and this is torch {torch}: "
                               f"collectives may move with torch itself")
    trace_template, job_template = list(budget.trace), list(budget.command)
    given = match(trace_template, list(trace_tokens), "the trace options") if trace_tokens is not None else {}
    if command and not update:
        given.update(match(job_template, list(command), "the job's arguments"))
    if not update and (command or given and set(budget.vary) <= set(given)):
        missing = sorted(set(budget.vary) - set(given))
        if missing:
            raise UsageError(f"no value for {{{missing[0]}}}: give it in the job's arguments or the trace options, "
                             f"as the budget's templates {job_template} and {trace_template} have it")
        runs = [given]
    else:  # every stored point (--update re-fits from all of them), with the values given
        runs = list({point_name(r): r for r in ({**{k: p.values[k] for k in budget.vary}, **given}
                                                for p in budget.points)}.values())
    for values in runs:
        parse_trace_options(substitute(trace_template, values))
    observed = []
    for i, values in enumerate(runs, 1):
        say(f"meshscope check: point {i}/{len(runs)} {point_name(values)}\n")
        traced = trace_point(trace_template, job_template, values, out, echo)
        point = compare(budget, traced, values, point_name(values)) if not update or traced.outcome != Outcome.PASSED \
            else PointCheck(point_name(values), values, traced.run_dir, traced.outcome)
        result.points.append(point)
        if update and traced.outcome == Outcome.PASSED:
            observed.append((variables(traced, values), observe(traced, budget.steady, budget.class_axes),
                             traced.run_dir, creation_order(traced)))
    if update and result.verdict != Verdict.NOT_PASSED:
        head = Budget(__version__, torch, budget.command, budget.trace, budget.steady, observed[0][3], budget.vary,
                      budget.class_axes)
        fresh = fit(head, [o[:3] for o in observed])
        for line in moved(budget, fresh) or ["nothing moved"]:
            say(f"meshscope check --update: {line}\n")
        write(fresh, path)
    return result

