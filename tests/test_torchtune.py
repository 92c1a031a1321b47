"""torchtune 0.6.1's ``full_finetune_distributed`` recipe, unmodified: the file ``tune run`` runs, on the tiny
Llama 2, tokenizer, documents and config that tests/jobs/torchtune_assets.py writes. The recipe cannot run on a
CPU device (it asks rank 0 for memory statistics, which torchtune refuses there: the job's docstring), so its
CUDA path runs in a fake world and the oracle is the counts and bytes the docstring reads from the recipe's
``shard_model`` and train loop."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from .helpers import ROOT, only_with, skip_unless_installed, steady_calls, trace_json

skip_unless_installed("torchtune", "torchao", "sentencepiece")

_spec = importlib.util.spec_from_file_location("torchtune_assets", ROOT / "tests" / "jobs" / "torchtune_assets.py")
torchtune_assets = importlib.util.module_from_spec(_spec)  # the job's writer: imports sentencepiece and torch only
_spec.loader.exec_module(torchtune_assets)

RECIPE = Path(importlib.util.find_spec("torchtune").origin).parents[1] / "recipes" / "full_finetune_distributed.py"
"""What ``tune run full_finetune_distributed`` runs: its ``recipes`` folder refuses to be imported, so not -m."""


def recipe(tmp_path, monkeypatch, **assets) -> list[str]:
    """The recipe's command line on assets written to `tmp_path`; datasets' cache there, offline."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    return [str(RECIPE), "--config", str(torchtune_assets.write(tmp_path / "assets", **assets))]


def fsdp_step(world: int) -> Counter:
    """A steady step with FSDP over `world` ranks (the docstring): L + 1 all_gathers forward and backward,
    L + 1 reduce_scatters, the token count's and the loss's all_reduces."""
    def shard(*shapes):
        return 4 * sum(-(-rows // world) * cols for rows, cols in shapes)

    root = shard((256, 32), (32, 1), (256, 32))
    layer = shard((32, 32), (16, 32), (16, 32), (32, 32), (64, 32), (32, 64), (64, 32), (32, 1), (32, 1))
    return Counter({("all_gather", "forward", root): 1, ("all_gather", "forward", layer): 2,
                    ("all_gather", "backward", root): 1, ("all_gather", "backward", layer): 2,
                    ("reduce_scatter", "backward", world * layer): 2, ("reduce_scatter", "backward", world * root): 1,
                    ("all_reduce", "other", 8): 1, ("all_reduce", "other", 4): 1})


@only_with("torchtune", "0.6.1")
def test_full_finetune_distributed_fsdp_in_a_fake_world_of_2(tmp_path, monkeypatch):
    """FSDP over 2 ranks: every rank's steady step is the docstring's, root 32,832 B and layer 18,560 B."""
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 2, "--ranks", "0,1", recipe(tmp_path, monkeypatch))
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    assert fsdp_step(2)[("all_gather", "forward", 32832)] == 1
    for rank in (0, 1):
        assert steady_calls(doc, rank) == fsdp_step(2)


@pytest.mark.frameworks
@only_with("torchtune", "0.6.1")
def test_full_finetune_distributed_fsdp_in_a_fake_world_of_1024(tmp_path, monkeypatch):
    """FSDP over 1,024 ranks, ``--ranks auto``: documents for 3 batches of 2 on every rank; each parameter
    padded to one row per rank (root 260 B, layer 1,032 B)."""
    job = recipe(tmp_path, monkeypatch, world=1024)
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 1024, "--ranks", "auto", job)
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    for rank in doc["fake_world"]["traced"]:
        assert steady_calls(doc, rank) == fsdp_step(1024)


@pytest.mark.frameworks
@only_with("torchtune", "0.6.1")
def test_full_finetune_distributed_tp_x_dp_in_a_fake_world_of_4(tmp_path, monkeypatch):
    """``tensor_parallel_dim: 2`` with torchtune's llama TP plan at world 4: layout tp 2 x dp 2; on dp the
    FSDP units of TP-sharded parameters (forward and backward all_gathers and reduce_scatters as at FSDP
    alone, L + 1 each). The TP calls' sizes follow each batch's padded length, so they are not counted
    here; the token count and the loss are all-reduced over the world."""
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 4, "--ranks", "0,1,2,3", recipe(tmp_path, monkeypatch, tp=2,
                                                                                         world=4))
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    assert doc["layout"]["text"].startswith("tp 2, dp 2")
    for mine in doc["per_rank"]:
        (step,) = [s for s in mine["steps"] if s["step"] == 1]
        calls = Counter((e["axis"], e["op"], e["phase"]) for e in step["events"] if e["axis"] != "tp")
        assert calls == {("dp", "all_gather", "forward"): 3, ("dp", "all_gather", "backward"): 3,
                         ("dp", "reduce_scatter", "backward"): 3, ("world", "all_reduce", "other"): 2}
