"""Planted faults end within their timeout, exit non-zero where they should, and are named by the doctor."""

import json
import time

import pytest

from .helpers import cli


def _doctor(run_dir):
    proc = cli("doctor", run_dir, "--json")
    return json.loads(proc.stdout), proc.returncode


@pytest.mark.parametrize("experiment, kind, expect_kind, expect_text", [
    ("collectives", "group-order", "group-order", "new_group #0: rank 1 created"),
    ("collectives", "missing-collective", "mismatch", "rank 1 skipped that collective"),
    ("tp_ar_b32", "dp-wrong-group", "dp-wrong-group", "gradient of fc1.weight averaged over tp[0, 1]"),
])
def test_injected_fault_is_named(tmp_path, experiment, kind, expect_kind, expect_text):
    timeout = 10
    start = time.monotonic()
    proc = cli("run", experiment, "--inject", kind, "--timeout", timeout, "--out", tmp_path, "--json", timeout=200)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert elapsed < timeout + 60, elapsed  # start-up + the timeout + tear-down, never a hang
    assert f"meshscope doctor: [{expect_kind}]" in proc.stderr  # the launcher ran the doctor
    report, code = _doctor(tmp_path)
    assert code == 1 and not report["healthy"]
    first = report["findings"][0]
    assert first["kind"] == expect_kind and expect_text in first["summary"], report["findings"]


def test_healthy_run_has_no_findings(tmp_path):
    proc = cli("run", "collectives", "--world", 2, "--tp", 2, "--out", tmp_path, "--json", timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report, code = _doctor(tmp_path)
    assert code == 0 and report["healthy"] and report["findings"] == [] and report["ranks"] == [0, 1]


def test_doctor_on_missing_directory_is_a_usage_error(tmp_path):
    proc = cli("doctor", tmp_path / "nope")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = cli("run", "collectives", "--inject", "p2p-shape")
    assert proc.returncode == 2 and "not available for collectives" in proc.stderr
