"""meshscope in a user's own tests: trace a script, ask its ledger questions, hold it to a budget.

    from meshscope.testing import trace

    def test_tp_all_reduces_grow_with_depth(tmp_path):
        for layers in (2, 3):
            job = trace("train.py", "--layers", str(layers), fake_world=8, steps=4, out=tmp_path / str(layers))
            assert job.count(axis="tp", op="all_reduce", phase="forward") == 2 * layers + 2

`trace` runs `meshscope trace` (a real gloo job with ``nproc_per_node``, or ranks of a fake world
with ``fake_world``) and returns a `Traced`: the typed `core.trace_result.TraceResult` (its outcome,
checks, fake-world classes, error and doctor's findings) with queries over a steady step (`count`,
`bytes`, `calls`) by rank class, step, axis, op, phase, dtype and module. `check` holds a re-trace to
a budget file (`meshscope budget` writes them) and returns the typed `budget.check.BudgetCheck`. A
trace that does not pass raises `TraceFailed` unless ``allow`` names its outcome, so a test never
counts the calls of a job that failed.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

from ..budget.check import BudgetCheck
from ..budget.ledger import module_key, rank_classes
from ..budget.make import check as check_budget
from ..core.events import CommEvent
from ..core.trace_result import Outcome, TraceResult
from ..trace.launch import TraceOptions
from ..trace.launch import trace as run_trace

__all__ = ["Traced", "TraceFailed", "check", "trace"]


class TraceFailed(AssertionError):
    """The traced job did not pass (an AssertionError, so that pytest shows it as a failed test)."""


@dataclass(frozen=True)
class Traced:
    """A traced job and its ledger's queries."""

    result: TraceResult

    @property
    def outcome(self) -> str:
        return self.result.outcome

    @property
    def classes(self) -> dict[str, list[int]]:
        """Rank class (each rank's place in each axis, as budgets key them) -> its traced ranks."""
        return rank_classes(self.result)

    @property
    def steady_step(self) -> int:
        """The last steady step every traced rank completed (`core.steady`); ValueError if none did."""
        last = min(((self.result.steady[r.rank].steps if r.rank in self.result.steady else []) or [-1])[-1]
                   for r in self.result.ranks)
        if last < 0:
            raise ValueError("no steady step (no two steps in a row after step 0 issued the same calls): trace more "
                             "optimizer steps")
        return last

    def calls(self, *, step: int | None = None, rank: int | None = None, cls: str | None = None,
              axis: str | None = None, op: str | None = None, phase: str | None = None, dtype: str | None = None,
              module: str | None = None) -> list[CommEvent]:
        """The calls of one rank in one step (default: the lowest traced rank, or the class's, and the
        steady step), filtered; `module` is a pattern: ``layers.*`` (a budget's key) or a glob."""
        step = self.steady_step if step is None else step
        if rank is None:
            ranks = self.classes[cls] if cls is not None else [min(r.rank for r in self.result.ranks)]
            rank = ranks[0]
        out = []
        for e in self.result.steps_of(rank).get(step, []):
            if axis is not None and e.axis != axis or op is not None and e.op != op or \
                    phase is not None and e.phase != phase or dtype is not None and e.dtype != dtype:
                continue
            if module is not None and not (module_key(e.region) == module or fnmatch.fnmatchcase(e.region, module)):
                continue
            out.append(e)
        return out

    def count(self, **filters) -> int:
        """How many calls `calls` selects."""
        return len(self.calls(**filters))

    def bytes(self, **filters) -> int:
        """Their logical bytes, the larger of in and out per call (an all-gather's output, a
        reduce-scatter's input)."""
        return sum(max(e.bytes_in, e.bytes_out) for e in self.calls(**filters))


def trace(script: str, *args: str, nproc_per_node: int | None = None, fake_world: int | None = None,
          ranks: str = "auto", fake_tensors: bool = False, steps: int | None = None, timeout: float | None = None,
          out: Path | None = None, allow: tuple[str, ...] = (), quiet: bool = True, **options) -> Traced:
    """Trace ``script args...`` (``-m`` as the script traces a module); `options` are `TraceOptions`'s
    other fields. Raises `TraceFailed` unless the outcome is ``passed`` or in `allow`."""
    target = (script, *map(str, args))
    result = run_trace(TraceOptions(target=target, nproc_per_node=nproc_per_node, fake_world=fake_world,
                                    ranks=ranks, fake_tensors=fake_tensors, steps=steps, timeout=timeout, out=out,
                                    **options),
                       echo=(lambda line: None) if quiet else (lambda line: sys.stderr.write(line)))
    if result.outcome != Outcome.PASSED and result.outcome not in allow:
        raise TraceFailed(f"{' '.join(target)}: the trace is {result.outcome}"
                          + (f": {result.error.line()}" if result.error else "") + f" ({result.run_dir})")
    return Traced(result)


def check(budget: Path | str, *job: str, trace_options: list[str] | None = None, out: Path | None = None,
          quiet: bool = True) -> BudgetCheck:
    """Hold a re-trace to the budget file (its stored points, or ``job`` with the values its arguments
    give the placeholders); the `BudgetCheck`'s ``verdict`` is ``holds``, ``violated`` or ``not_passed``."""
    out = Path(out) if out is not None else Path(budget).with_suffix("").with_name(Path(budget).stem + "-check")
    return check_budget(Path(budget), trace_options, list(job) or None, out,
                        echo=(lambda line: None) if quiet else None)
