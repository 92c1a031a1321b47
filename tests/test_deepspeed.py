"""DeepSpeed 0.19.8's ZeRO, unmodified (tests/jobs/deepspeed_zero.py: ``deepspeed.initialize``, its own
``engine.backward`` and ``engine.step``): the steady step against the counts its docstring reads from
DeepSpeed's ZeRO code, and the fake world against a real gloo trace of the same script (`meshscope diff`,
verdict same)."""

from __future__ import annotations

import pytest

from .helpers import ROOT, fake_equals_real, skip_unless_installed, steady_calls, trace_json

skip_unless_installed("deepspeed")

JOB = ROOT / "tests" / "jobs" / "deepspeed_zero.py"


@pytest.mark.frameworks  # the three DeepSpeed cases are bench_frameworks.py's (below: its op's compilation)
def test_zero_2_steady_step_and_its_step_is_the_optimizers(tmp_path):
    """ZeRO-2 on 2 gloo ranks: per step the gradients' one all_reduce (808 fp32, 3,232 B), then inside
    ``engine.step()`` the overflow flag's all_reduce and, after the inner Adam's step, the all-gather of
    the updated partitions (404 per rank, 1,616 B): phase optimizer of the step it ends, not other of the
    next (DeepSpeedEngine.step is one outer optimizer step, `capture.steppers`)."""
    proc, doc = trace_json(tmp_path / "z2", "--nproc-per-node", 2, [str(JOB), "--stage", "2", "--steps", "4"])
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    for rank in (0, 1):
        assert steady_calls(doc, rank) == {("all_reduce", "other", 3232): 1, ("all_reduce", "optimizer", 4): 1,
                                     ("all_gather", "optimizer", 1616): 1}
    assert [r["steps"] for r in doc["ranks"]] == [4, 4]  # one boundary per engine.step(), through its Adam


@pytest.mark.frameworks
def test_zero_2_with_overlap_comm_fake_world_equals_gloo(tmp_path):
    """``overlap_comm: true`` (a common config) records each reduced bucket's stream on the CPU tensor that
    stands for a CUDA one (``Tensor.record_stream``, stage_1_and_2.py:1531): the fake world of 2 issues what
    gloo does, call for call."""
    doc = fake_equals_real(tmp_path, 2, [str(JOB), "--stage", "2", "--overlap-comm", "--steps", "4"])
    assert doc["outcome"] == "passed" and steady_calls(doc, 1)[("all_gather", "optimizer", 1616)] == 1


@pytest.mark.frameworks  # DeepSpeed compiles its CPU shared-memory op (csrc/cpu/comm) on a machine's first run: 48 s
# here, past the 300 s timeout on CI's first run beside the other worker (2026-12-06); bench_frameworks.py runs it
def test_zero_3_fake_world_equals_gloo(tmp_path):
    """ZeRO-3 checks at its first forwards that each rank's module trace is rank 0's: broadcasts of rank 0's
    length and list, which every other rank compares with its own (``assert_ints_same_as_other_ranks``,
    runtime/zero/utils.py). In a fake world rank 1 receives what rank 0 sent (`trace.fake.replay`), where the
    fake backend alone left it its own -1 and it failed ("Detected a disagreement on list length", the doctor's
    root cause script-error): the fake world of 2 issues what gloo does, call for call, rank 1's with none
    assumed, and step 1's forward holds the six broadcasts of the three checks."""
    doc = fake_equals_real(tmp_path, 2, [str(JOB), "--stage", "3", "--steps", "3"])
    (rank1,) = [r for r in doc["per_rank"] if r["rank"] == 1]
    assert not any(e["assumed"] for s in rank1["steps"] for e in s["events"])
    (step1,) = [s for s in rank1["steps"] if s["step"] == 1]
    assert sum(1 for e in step1["events"] if (e["op"], e["phase"]) == ("broadcast", "forward")) == 6
