"""Lightning 2.6.6's Trainer, unmodified (tests/jobs/lightning_ddp.py): its fake world against a real
gloo trace of the same script (`meshscope diff`, verdict same), and the steady step against the
counts its docstring reads from Lightning's loops and torch's DDP."""

from __future__ import annotations

from collections import Counter

import pytest

from .helpers import ROOT, fake_equals_real, skip_unless_installed

skip_unless_installed("lightning")

JOB = ROOT / "tests" / "jobs" / "lightning_ddp.py"


def steady(doc: dict, rank: int) -> Counter:
    (last,) = [s for s in doc["per_rank"] if s["rank"] == rank]
    return Counter((e["axis"], e["phase"], e["op"]) for e in last["steps"][2]["events"])


def test_trainer_with_ddp_fake_world_equals_gloo(tmp_path):
    """strategy="ddp" at world 2: the log directory's broadcast_object_list gives every rank rank 0's
    object, so the fake world issues what gloo does; a steady step is the SIGTERM flag's broadcast,
    the logged loss's barrier and all_reduce (in the closure's forward) and DDP's one bucket."""
    doc = fake_equals_real(tmp_path, 2, [str(JOB)])
    for rank in (0, 1):
        assert steady(doc, rank) == {("world", "other", "broadcast"): 1, ("world", "forward", "barrier"): 1,
                                     ("world", "forward", "all_reduce"): 1, ("world", "backward", "all_reduce"): 1}


@pytest.mark.frameworks
def test_trainer_on_cuda_in_a_fake_world_equals_gloo_on_the_cpu(tmp_path):
    """accelerator="cuda" (nccl, DDP with device_ids, its stream, the precision check's
    get_device_capability) in a fake world of 2 issues what accelerator="cpu" does on gloo."""
    doc = fake_equals_real(tmp_path, 2, [str(JOB)], [str(JOB), "--accelerator", "cuda"])
    assert any("mapped every CUDA device to the CPU" in n for n in doc["notes"]), doc["notes"]


@pytest.mark.frameworks
def test_trainer_with_model_parallel_strategy_fake_world_equals_gloo(tmp_path):
    """ModelParallelStrategy at world 4 (tensor_parallel 2 x data_parallel 2): TP on the two layers
    (1 all_reduce of fc2's output; the input needs no gradient, so backward has none on tp), FSDP2
    over data_parallel (1 all_gather forward, 1 reduce_scatter backward: one unit), the logged loss."""
    doc = fake_equals_real(tmp_path, 4, [str(JOB), "--strategy", "model_parallel"])
    assert doc["layout"]["text"].startswith("tensor_parallel 2 x data_parallel 2")
    for rank in range(4):
        assert steady(doc, rank) == {
            ("world", "other", "broadcast"): 1, ("world", "other", "barrier"): 1, ("world", "other", "all_reduce"): 1,
            ("tensor_parallel", "forward", "all_reduce"): 1, ("data_parallel", "forward", "all_gather"): 1,
            ("data_parallel", "backward", "reduce_scatter"): 1}
