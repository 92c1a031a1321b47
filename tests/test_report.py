"""What the terminal shows: every table of every printer, at 80 and 60 columns, keeps each op, axis,
phase, region, group and configuration name whole (no ellipsis, no cut, nothing past the edge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from meshscope import experiments
from meshscope.core.mesh import Layout
from meshscope.core.result import SuiteResult
from meshscope.report.suite import print_terminal
from meshscope.report.terminal import print_layout, print_prediction, print_result

from .helpers import ROOT

WIDTHS = (80, 60)
GPU_SUITE = ROOT / "docs/results/h200x2/graph/suite_graph_20/result.json"
"""A saved suite with every table there is (NCCL kernels, communication time, graph replay)."""


def _render(width: int, printer, *args) -> str:
    console = Console(width=width, record=True, highlight=False)
    printer(*args, console)
    return console.export_text()


def _assert_whole(text: str, width: int, names) -> None:
    assert "…" not in text
    assert max(map(len, text.splitlines())) <= width  # nothing cropped at the right edge
    missing = sorted({n for n in names if n and n not in text})
    assert not missing, f"cut or folded at {width} columns: {missing}\n{text}"


def _suite() -> SuiteResult:
    return SuiteResult.from_json(json.loads(GPU_SUITE.read_text()))


def _event_names(events):
    return [x for e in events for x in (e.op, e.axis, e.phase, e.region, str(list(e.group)))]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name, overrides", [*((n, {}) for n in experiments.names()), ("nd_mlp", {"moe": True})])
def test_prediction_tables_keep_every_name_whole(width, name, overrides):
    exp = experiments.get(name)
    cfg = exp.config(overrides)
    events = exp.predict(cfg)
    text = _render(width, print_prediction, exp, cfg, events)
    _assert_whole(text, width, _event_names(e for e in events if e.rank == 0) + [e.op for e in events])


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("layout, extra", [
    (Layout(4, tp=2), ["tp_rank=1", "dp_rank=1", "rank3"]),  # two dense axes: the matrix too
    (Layout(16, tp=2, cp=2, ep=2, etp=2, pp=2), ["etp", "edp"]),
], ids=["tp2", "tp2-cp2-ep2-etp2-pp2"])
def test_layout_tables_keep_every_axis_whole(width, layout, extra):
    text = _render(width, print_layout, layout)
    _assert_whole(text, width, [a for a, n in layout.sizes.items() if n > 1] + extra)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("label", ["tp_sp_b128_replicated", "pp_1f1b_mb8", "ep_skewed"])
def test_run_result_tables_keep_every_name_whole(width, label):
    result = _suite().results[label]
    text = _render(width, print_result, result, "runs/x")
    _assert_whole(text, width, [e.op for e in result.captured] + [result.experiment])


@pytest.mark.parametrize("width", WIDTHS)
def test_suite_tables_keep_every_name_whole(width):
    doc = _suite()
    text = _render(width, print_terminal, doc)
    names = [*doc.results, *(f for r in doc.results.values() for e in r.captured
                             for f in (e.op, r.axis_labels.get(e.axis, e.axis), e.phase))]
    _assert_whole(text, width, names + ["PERF_UNSTABLE", "ReduceScatter"])


def test_cli_at_80_columns_shows_whole_names():
    """The reported case, through the command line: ``COLUMNS=80 meshscope predict tp_sp_b128``."""
    proc = subprocess.run([sys.executable, "-m", "meshscope", "predict", "tp_sp_b128"], check=False, capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    _assert_whole(proc.stdout, 80, ["all_reduce", "reduce_scatter", "all_gather", "forward", "backward",
                                    "optimizer", "dp.grad_sync:fc1.weight", "sp.scatter", "[0, 2]"])


def test_a_table_too_wide_for_the_terminal_continues_in_parts_that_repeat_its_key():
    from meshscope.report.table import print_table

    console = Console(width=50, record=True)
    print_table(console, "t (detail)", ["config", "op", "phase", "region"],
                [["pp_1f1b_mb8", "reduce_scatter", "optimizer", "dp.grad_sync:fc1.weight"]])
    text = console.export_text()
    assert text.count("pp_1f1b_mb8") == 2 and "t (continued, 2 of 2)" in text
    _assert_whole(text, 50, ["reduce_scatter", "optimizer", "dp.grad_sync:fc1.weight"])
