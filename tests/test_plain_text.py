"""Text that came from a job prints as it is, never as rich markup or emoji: a rank's error, the lines it
printed, its mesh dim and module names and its run directory, through every console print of a failed
`meshscope trace`, `report`, `doctor`, `diff` and `check` (issue 42: gloo's ``[/__w/pytorch/.../pair.cc:553]
Connection closed by peer`` ended `meshscope trace` in rich's ``MarkupError``, where the verdict was due).

The oracle is the job's own text (tests/jobs/markup_text.py), which each output must hold letter for letter;
an exception that escapes a command fails the test (`helpers.cli_here`). One 2-rank gloo trace serves all."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from meshscope.core.result import Check

from .helpers import ROOT, cli_here

JOB = ROOT / "tests" / "jobs" / "markup_text.py"

_spec = importlib.util.spec_from_file_location("markup_text", JOB)
job = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(job)  # its constants only: main() runs under __main__ alone

COLUMNS = "200"
"""Wide enough for gloo's 72-character source location on one line: a narrower console folds it inside the
word (`report.table`), where a search for the literal text would miss it."""


def _words(text: str) -> str:
    """`text` with its line breaks and runs of spaces as one space: a console wraps a long line between words."""
    return " ".join(text.split())


def _assert_holds(output: str, *texts: str) -> None:
    missing = [t for t in texts if t not in _words(output)]
    assert not missing, f"not printed as it is: {missing}\n{output}"


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", COLUMNS)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """(run directory, what `meshscope trace` printed, or the exception that escaped it): the job traced on 2
    gloo ranks, printed on the console (not --json), into a directory whose path reads as markup too (it holds
    ``[bold]``, ``[link=http:/x]`` and ``[/x]``)."""
    run_dir = tmp_path_factory.mktemp("markup") / "[bold]" / "[link=http:" / "x]" / "[" / "x]" / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", COLUMNS)
        try:
            outcome = cli_here("trace", "--nproc-per-node", 2, "--timeout", 30, "--out", run_dir, "--", JOB)
        except Exception as exc:  # the trace's test reports it; the others read the directory it wrote first
            outcome = exc
    return run_dir, outcome


def test_a_failed_trace_prints_the_jobs_text_as_it_is(traced):
    """The layout, the module table, each rank's error, the verdict, and the lines the failed rank printed."""
    run_dir, proc = traced
    if isinstance(proc, Exception):
        pytest.fail(f"meshscope trace raised {type(proc).__name__}: {proc}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    _assert_holds(proc.stdout, f"layout: {job.AXIS} 2", f"│ {job.MIX} ", f"rank 1: error: RuntimeError: {job.MESSAGE}",
                  f"; rank 1: RuntimeError: {job.MESSAGE} (its output: {run_dir}",
                  f"| {job.PRINTED}", f"| RuntimeError: {job.MESSAGE}")


def test_report_prints_the_jobs_text_as_it_is(traced):
    run_dir, _ = traced
    proc = cli_here("report", run_dir)
    assert proc.returncode == 1, proc.stderr[-3000:]
    _assert_holds(proc.stdout, f"layout: {job.AXIS} 2", f"│ {job.MIX} ", f"rank 1: error: RuntimeError: {job.MESSAGE}",
                  f"| {job.PRINTED}", f"written: {run_dir}/report.md")


def test_doctor_prints_the_jobs_text_as_it_is(traced):
    run_dir, _ = traced
    proc = cli_here("doctor", run_dir)
    assert proc.returncode == 1, proc.stderr[-3000:]
    _assert_holds(proc.stdout, f"rank 1 failed: RuntimeError: {job.MESSAGE}", f"in {job.MIX} on {job.AXIS}[0, 1]")


def test_diff_says_why_a_failed_trace_is_not_comparable_in_its_own_words(traced):
    run_dir, _ = traced
    proc = cli_here("diff", run_dir, run_dir)
    assert proc.returncode == 3, proc.stderr[-3000:]
    _assert_holds(proc.stdout, f"not comparable: {run_dir} (trace) and {run_dir} (trace)", f"A ({run_dir}): ranks [0, 1]")


def test_diff_prints_axes_rows_and_divergences_as_they_are(traced, monkeypatch):
    """Every other line of `diff`, from the trace's own ledgers: a failed trace is not comparable, and a second
    trace would double this module's time, so both sides here are the trace as if its ranks had ended, B with
    the axis named ``[link=http://x]`` and without rank 0's last call (the barrier)."""
    import meshscope.trace.diff as diff_module

    run_dir, _ = traced
    read = diff_module.load_side

    def load_side(path: Path):
        side = replace(read(run_dir), status=dict.fromkeys(read(run_dir).status, "ok"))
        if path.name == "b":
            last = max((e for e in side.events if e.rank == 0), key=lambda e: e.seq)
            side = replace(side, events=[replace(e, axis=job.LINEAR) for e in side.events if e is not last])
        return side

    monkeypatch.setattr(diff_module, "load_side", load_side)
    proc = cli_here("diff", run_dir / "a", run_dir / "b")
    assert proc.returncode == 1, proc.stderr[-3000:]
    _assert_holds(proc.stdout, f"axes matched by their groups: {job.AXIS} (A) = {job.LINEAR} (B)",
                  f"│ {job.AXIS}={job.LINEAR} │ barrier │", f"barrier {job.AXIS}[0, 1]")


def test_check_prints_budget_entries_and_points_as_they_are(traced, monkeypatch):
    """`check`'s table and lines, with an entry of this trace: a rank class, axis and module that read as
    markup (the class ``[[bold]dp=first]`` in brackets, as every entry has it)."""
    import meshscope.budget.make as make
    from meshscope.budget.check import BudgetCheck, PointCheck, Violation
    from meshscope.budget.ledger import Key, module_key, rank_classes
    from meshscope.trace.assemble import load

    run_dir, _ = traced
    result = load(run_dir)
    cls = next(c for c, ranks in rank_classes(result).items() if 0 in ranks)
    e = next(e for e in result.events if e.rank == 0 and e.op == "all_reduce")
    entry = Key(cls, e.axis, e.op, e.phase, e.dtype, module_key(e.region)).label()
    moved = PointCheck(f"steps={job.LINEAR}", {}, str(run_dir), "passed",
                       [Violation(entry, 0, "count", "1", "2", f"#0 in {job.MIX}, forward")])
    failed = PointCheck("steps=[bold]", {}, str(run_dir), "failed")
    monkeypatch.setattr(make, "check", lambda *args, **kw: BudgetCheck("[bold]budget.toml", [moved, failed]))
    proc = cli_here("check", "[bold]budget.toml")
    assert proc.returncode == 3, proc.stderr[-3000:]
    _assert_holds(proc.stdout, f"[{cls}] {job.AXIS} all_reduce forward float32 {job.MIX}",
                  f"steps={job.LINEAR}: what moved ({run_dir})", f"#0 in {job.MIX}, forward",
                  f"steps=[bold]: the re-trace is failed ({run_dir})", "NOT PASSED: [bold]budget.toml")


def test_run_and_suite_printers_print_details_as_they_are_and_colour_their_verdicts(capsys):
    """A run's and a suite's failed check whose detail is the job's error (a saved suite: no launch), on the
    console the commands print on; the verdicts they colour keep their colour as a style, not as markup."""
    import json

    from meshscope.core.result import SuiteResult
    from meshscope.report.suite import print_terminal
    from meshscope.report.table import make_console
    from meshscope.report.terminal import print_result

    doc = SuiteResult.from_json(json.loads((ROOT / "docs/results/h200x2/graph/suite_graph_20/result.json").read_text()))
    label, run = next(iter(doc.results.items()))
    run.checks[0] = Check(job.AXIS, False, job.MESSAGE)
    for printer, args in ((print_result, (run, "runs/[bold]")), (print_terminal, (doc,))):
        printer(*args, make_console())
        text = capsys.readouterr().out
        assert "[red]" not in text and "[green]" not in text
        _assert_holds(text, *((f"│ {job.AXIS} │ NO │ {job.MESSAGE}", "run directory: runs/[bold]")
                              if printer is print_result else (f"FAILED {label}: {job.AXIS}: {job.MESSAGE}",)))


def test_a_table_prints_its_title_head_and_cells_as_they_are_on_any_console():
    """`print_table` on a console made elsewhere, markup on: titles, heads and cells are Text, never parsed."""
    from meshscope.report.table import print_table

    console = Console(width=int(COLUMNS), record=True)
    print_table(console, f"modules of {job.AXIS}", [job.MIX], [[job.MESSAGE], [job.PRINTED]])
    _assert_holds(console.export_text(), f"modules of {job.AXIS}", f"┃ {job.MIX}", job.MESSAGE, job.PRINTED)
