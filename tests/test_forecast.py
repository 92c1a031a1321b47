"""``meshscope forecast`` end to end on tests/jobs/ddp.py (DDP over 4 bias-free Linear(256, 256), batch 8, fp32,
one 256 KiB bucket per layer after the rebuild): the FLOPs of a step by hand from the layers' shapes, the
buckets of DDP's own layout (the job's docstring), and the bad inputs' one-line errors."""

from __future__ import annotations

import json

import pytest

from .helpers import cli_here

B, HIDDEN, LAYERS = 8, 256, 4
MM = 2 * B * HIDDEN * HIDDEN  # one Linear's forward matmul


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("forecast") / "t"
    proc = cli_here("forecast", "--fake-world", 4, "--cluster", "h100-sxm", "--tokens", 4 * B, "--out", out, "--json",
                    "--", "tests/jobs/ddp.py", "--steps", 5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


def test_a_step_holds_the_flops_of_its_layers_and_ddps_buckets(traced):
    _, doc = traced
    assert doc["kind"] == "forecast" and doc["world"] == 4 and doc["step"] >= 2
    # rank 0 (the root of DDP's broadcasts) is a class of its own, ranks 1-3 another
    assert sorted(c["ranks"] for c in doc["classes"]) == [1, 3]
    for cls in doc["classes"]:
        # forward: LAYERS matmuls; backward: every weight's gradient and the inputs' of all layers but the first
        assert cls["flops"] == {"float32": (LAYERS + LAYERS + LAYERS - 1) * MM}
        (axis,) = cls["axes"]
        assert (axis["calls"], axis["bytes"]) == (LAYERS, LAYERS * HIDDEN * HIDDEN * 4)
        assert 0 <= axis["exposed_s"] <= axis["seconds"] + 1e-12
        assert cls["step_s"] == pytest.approx(cls["compute_s"] + cls["exposed_s"])
    assert doc["step_s"] == max(c["step_s"] for c in doc["classes"])
    assert doc["tokens_per_s_per_gpu"] == pytest.approx(4 * B / doc["step_s"] / 4)
    assert doc["cluster"]["name"] == "h100-sxm" and "counted FLOPs" in doc["compute_source"]


def test_the_same_trace_reads_again_on_another_cluster(traced):
    out, doc = traced
    proc = cli_here("forecast", "--from-trace", out, "--cluster", "a100-sxm", "--json")
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert [c["flops"] for c in again["classes"]] == [c["flops"] for c in doc["classes"]]
    assert again["classes"][0]["compute_s"] > doc["classes"][0]["compute_s"]  # fewer FLOP/s, less bandwidth
    text = cli_here("forecast", "--from-trace", out, "--cluster", "h100-sxm")
    assert text.returncode == 0 and "rank classes" in text.stdout and "exposed" in text.stdout


@pytest.mark.parametrize("args, words", [
    (("--cluster", "h900", "--fake-world", "2", "--", "tests/jobs/ddp.py"), "h900"),
    (("--cluster", "h100-sxm", "--", "tests/jobs/ddp.py"), "--fake-world"),
    (("--cluster", "h100-sxm", "--tokens", "0", "--fake-world", "2", "--", "tests/jobs/ddp.py"), "--tokens 0"),
    (("--cluster", "h100-sxm", "--gpus-per-node", "0", "--fake-world", "2", "--", "tests/jobs/ddp.py"),
     "--gpus-per-node 0"),
    (("--cluster", "h100-sxm", "--from-trace", "/nonexistent/trace"), "/nonexistent/trace"),
    (("--cluster", "h100-sxm", "--fake-world", "2", "--", "no/such/script.py"), "no/such/script.py"),
])
def test_bad_input_is_one_line(args, words):
    proc = cli_here("forecast", *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr and "Traceback" not in proc.stderr


def test_a_trace_without_work_is_refused_in_one_line(tmp_path):
    proc = cli_here("trace", "--fake-world", 2, "--out", tmp_path / "t", "--json", "--", "tests/jobs/ddp.py",
                    "--steps", 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = cli_here("forecast", "--from-trace", tmp_path / "t", "--cluster", "h100-sxm")
    assert proc.returncode == 2 and "--work" in proc.stderr and proc.stderr.count("\n") == 1
