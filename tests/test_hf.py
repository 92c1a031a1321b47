"""Hugging Face's stacks, unmodified: transformers' ``Trainer`` (tests/jobs/hf_trainer.py) and an accelerate
``Accelerator`` loop (tests/jobs/accelerate_loop.py). Oracles: the fake world against a real gloo trace of the
same script (`meshscope diff`, verdict same; the fake side takes the CUDA path, nccl and DDP with
``device_ids``), and each steady step against the counts and bytes their docstrings read from transformers',
accelerate's and torch's code. FSDP2 through ``Trainer`` needs CUDA (accelerate drops its FSDP plugin on a CPU),
so its oracle is the hand counts alone."""

from __future__ import annotations

import pytest

from .helpers import ROOT, fake_equals_real, only_with, skip_unless_installed, steady_calls, trace_json

skip_unless_installed("transformers", "accelerate")

TRAINER = ROOT / "tests" / "jobs" / "hf_trainer.py"
LOOP = ROOT / "tests" / "jobs" / "accelerate_loop.py"


def fsdp2_units(world: int) -> tuple[int, int, int]:
    """Bytes each rank sends in the all_gather of the embedding, a decoder layer and the tail [norm, lm_head]
    (hf_trainer.py's docstring): FSDP2 gives each rank ceil(rows / world) rows of every parameter."""
    def shard(*shapes):
        return 4 * sum(-(-rows // world) * cols for rows, cols in shapes)

    layer = shard((32, 32), (32, 32), (32, 32), (32, 32), (64, 32), (64, 32), (32, 64), (32, 1), (32, 1))
    return shard((128, 32)), layer, shard((32, 1), (128, 32))


@pytest.mark.frameworks  # 34-46 s of CI's 2 cores (four ranks importing transformers' Trainer); accelerate's stays
@only_with("transformers", "5.25.0")
def test_trainer_ddp_fake_world_equals_gloo(tmp_path):
    """Trainer with DDP at world 2: a steady step is the loss's and flops' log gathers and the next batch's
    label count (other), DDP's buffer broadcast (forward), its one bucket and its unused-parameter map
    (backward, ``find_unused_parameters=True``); the fake world (nccl, mapped CUDA) issues what gloo does."""
    doc = fake_equals_real(tmp_path, 2, [str(TRAINER)])
    for rank in (0, 1):
        assert steady_calls(doc, rank) == {("all_gather", "other", 4): 2, ("all_gather", "other", 8): 1,
                                     ("broadcast", "forward", 64): 1, ("all_reduce", "backward", 115328): 1,
                                     ("all_reduce", "backward", 84): 1}


@only_with("accelerate", "1.16.0")
def test_accelerate_loop_fake_world_equals_gloo(tmp_path):
    """The Accelerator loop at world 2, 4 steps: step 1 holds DDP's bucket rebuild, so the steady steps start
    at 2: the logged loss's all_reduce (other) and the one bucket (backward)."""
    doc = fake_equals_real(tmp_path, 2, [str(LOOP)])
    for rank in (0, 1):
        assert doc["steady"][str(rank)]["first"] == 2
        assert steady_calls(doc, rank) == {("all_reduce", "other", 4): 1, ("all_reduce", "backward", 16768): 1}


@pytest.mark.frameworks
@only_with("transformers", "5.25.0")
def test_trainer_fsdp2_in_a_fake_world_of_1024(tmp_path):
    """``--fsdp`` (FSDP2 via Trainer's fsdp_config, accelerate's fsdp2_prepare_model) at 1,024 ranks,
    ``--ranks auto``: per steady step L + 2 all_gathers forward, L + 1 backward, L + 2 reduce_scatters,
    the clip's all_reduce of the 21 gradients' norms, the log's and label count's gathers; each unit's
    bytes from its parameters' shapes."""
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 1024, "--ranks", "auto", [str(TRAINER), "--fsdp"])
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    embed, layer, tail = fsdp2_units(1024)
    assert (embed, layer, tail) == (128, 1032, 132)
    for rank in doc["fake_world"]["traced"]:
        assert steady_calls(doc, rank) == {
            ("all_gather", "other", 4): 2, ("all_gather", "other", 8): 1,
            ("all_gather", "forward", embed): 1, ("all_gather", "forward", layer): 2, ("all_gather", "forward", tail): 1,
            ("all_gather", "backward", layer): 2, ("all_gather", "backward", embed): 1,
            ("reduce_scatter", "backward", 1024 * tail): 1, ("reduce_scatter", "backward", 1024 * layer): 2,
            ("reduce_scatter", "backward", 1024 * embed): 1, ("all_reduce", "other", 84): 1}
