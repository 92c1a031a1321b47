"""What a fake world cannot know is marked, not invented: an uneven MoE all-to-all's sizes in a fake world
of 2 come back `assumed`, a real gloo trace's do not, and `meshscope diff` compares the rest and says
what it left out."""

from __future__ import annotations

import argparse
import json

from meshscope.cli.trace_command import cmd_diff
from meshscope.core.trace_result import TraceResult

from .helpers import ROOT, cli

JOB = [str(ROOT / "tests" / "jobs" / "moe_a2a.py"), "--steps", "2"]
DISPATCH = ("input_splits", "output_splits", "bytes_in", "bytes_out")


def test_fake_world_all_to_all_sizes_are_assumed(tmp_path, capsys):
    real = cli("trace", "--nproc-per-node", 2, "--out", tmp_path / "real", "--json", "--", *JOB, timeout=240)
    fake = cli("trace", "--fake-world", 2, "--ranks", "0,1", "--out", tmp_path / "fake", "--json", "--", *JOB,
               timeout=240)
    assert real.returncode == 0 and fake.returncode == 0, fake.stderr[-3000:]
    real_doc, fake_doc = json.loads(real.stdout), json.loads(fake.stdout)
    assert fake_doc["passed"]
    # the job's docstring: per step 5 all_to_alls, the even int64 count exchange first, then 4 uneven ones
    for rank in (0, 1):
        for step in TraceResult.from_json(fake_doc).steps_of(rank).values():
            assert [e.assumed for e in step] == [("output_splits", "bytes_out")] + [DISPATCH] * 4
    real_result = TraceResult.from_json(real_doc)
    assert real_result.events and not any(e.assumed for e in real_result.events)
    # rank 1 really receives [2, 2] in the dispatch; the fake backend mirrors its own [14, 2]
    dispatch = [e for e in real_result.events if e.rank == 1 and e.step == 0][1]
    assert dispatch.output_splits == (2, 2)
    fake_dispatch = [e for e in TraceResult.from_json(fake_doc).events if e.rank == 1 and e.step == 0][1]
    assert fake_dispatch.output_splits == (14, 2)
    mirror = next(c for c in fake_doc["checks"] if c["name"] == "all-to-all splits mirror")
    assert mirror["passed"] and "not checked: their splits are assumed" in mirror["detail"]
    report = (tmp_path / "fake" / "report.md").read_text()
    assert "\\* assumed: a fake world cannot know" in report and "KiB\\* |" in report

    args = argparse.Namespace(dir_a=tmp_path / "real", dir_b=tmp_path / "fake", json=True)
    assert cmd_diff(args) == 0  # in this process: a CLI start costs seconds on a loaded box
    doc = json.loads(capsys.readouterr().out)
    assert doc["same"] and not doc["rows"], doc
    assert doc["assumed"]["calls"] == {"a": 0, "b": 20} and doc["assumed"]["fields"] == sorted(DISPATCH)
    assert [t["step"] for t in doc["assumed"]["totals"]] == [0, 1]
    assert cmd_diff(argparse.Namespace(**{**vars(args), "json": False})) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "not compared: bytes_in, bytes_out, input_splits, output_splits" in text and "same ledgers" in text
