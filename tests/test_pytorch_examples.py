"""pytorch/examples' distributed scripts, unmodified, from a checkout given by path
(``MESHSCOPE_PYTORCH_EXAMPLES``, the folder holding ``distributed/``; skipped without it; it is not
on the package index and its code is not copied here: benchmarks/bench_frameworks.py prints the
checkout's commit and each script's sha256). Each needs a GPU (its ``torch.accelerator`` gate, or
``torch.cuda.set_device``), so each runs in a fake world of 4 only. Oracle: the counts each script's
own code implies, by hand, in each test's docstring (read at pytorch/examples 77f55b9, torch 2.13)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from .helpers import trace_json

pytestmark = pytest.mark.frameworks

EXAMPLES = Path(os.environ.get("MESHSCOPE_PYTORCH_EXAMPLES", "/nonexistent")) / "distributed"


def trace_example(tmp_path: Path, script: str, *args) -> dict:
    """``meshscope trace --fake-world 4 -- EXAMPLES/script ARGS`` in an empty working directory; the
    document of a passed trace."""
    if not (EXAMPLES / script).is_file():
        pytest.skip(f"no pytorch/examples checkout (MESHSCOPE_PYTORCH_EXAMPLES): {EXAMPLES / script}")
    work = tmp_path / "work"
    work.mkdir()
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 4, [str(EXAMPLES / script), *map(str, args)], cwd=work)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    return doc


def counts(step: dict) -> Counter:
    return Counter((e["axis"], e["phase"], e["op"]) for e in step["events"])


def test_ddp_tutorial_multigpu_torchrun(tmp_path):
    """``multigpu_torchrun.py 2 1``: DDP of a Linear(20, 1) over 2,048 samples, batch 32, 2 epochs:
    2048 / 4 / 32 = 16 steps per epoch, 32 steps, each one bucket all_reduce (21 fp32 = 84 B); DDP's
    set-up (1 all_gather, 2 broadcasts) and its bucket rebuild at step 1 (2 broadcasts): 37 calls.
    Rank 0 saves ``snapshot.pt`` after every epoch; no rank resumes from it (each rank sees only its
    own files), and it is not left in the working directory."""
    doc = trace_example(tmp_path, "ddp-tutorial-series/multigpu_torchrun.py", 2, 1)
    for rank in doc["per_rank"]:
        steps = rank["steps"]
        assert len(steps) == 32 and sum(len(s["events"]) for s in steps) == 37, rank["rank"]
        assert all(counts(s)[("world", "backward", "all_reduce")] == 1 for s in steps)
        assert {e["bytes_in"] for s in steps for e in s["events"] if e["phase"] == "backward"} == {84}
    assert not (tmp_path / "work" / "snapshot.pt").exists()


def test_tensor_parallel_example(tmp_path):
    """``tensor_parallel_example.py``: ToyModel's in_proj ColwiseParallel, out_proj RowwiseParallel on a
    1-D mesh of the world, 10 iterations: set-up distributes in_proj's weight and bias and out_proj's
    weight (3 scatters) and out_proj's bias (1 broadcast); every iteration 1 all_reduce of out_proj's
    [20, 5] output forward; the input needs no gradient, so backward issues nothing."""
    doc = trace_example(tmp_path, "tensor_parallelism/tensor_parallel_example.py")
    for rank in doc["per_rank"]:
        steps = rank["steps"]
        assert len(steps) == 10
        assert counts(steps[0]) == {("world", "other", "scatter"): 3, ("world", "other", "broadcast"): 1,
                                    ("world", "forward", "all_reduce"): 1}
        assert all(counts(s) == {("world", "forward", "all_reduce"): 1} for s in steps[1:])
        assert steps[1]["events"][0]["bytes_in"] == 20 * 5 * 4 and steps[1]["events"][0]["region"] == "out_proj"


def test_sequence_parallel_example(tmp_path):
    """``sequence_parallel_example.py``: in_proj ColwiseParallel(input_layouts=Shard(0)), out_proj
    RowwiseParallel(output_layouts=Shard(0)): every iteration gathers the [20, 10] input shards (1
    all_gather, in_proj), reduce-scatters out_proj's [80, 5] output (1 reduce_scatter) and, backward,
    gathers its output gradient (1 all_gather); the input needs no gradient."""
    doc = trace_example(tmp_path, "tensor_parallelism/sequence_parallel_example.py")
    for rank in doc["per_rank"]:
        for step in rank["steps"][1:]:
            assert [(e["phase"], e["op"], e["bytes_in"], e["bytes_out"]) for e in step["events"]] == [
                ("forward", "all_gather", 800, 3200), ("forward", "reduce_scatter", 1600, 400),
                ("backward", "all_gather", 400, 1600)]


def test_fsdp_tp_example(tmp_path):
    """``fsdp_tp_example.py``: Llama2 (2 layers) with TP 2 + sequence parallel on "tp" and FSDP2 over
    "dp" (the whole model, one unit). Per layer its plan gathers the attention's and the feed-forward's
    inputs (2 AG) and reduce-scatters wo's and w2's outputs (2 RS); the root's tok_embeddings
    reduce-scatters (1 RS), output gathers its input and its output (2 AG); so forward 2L + 2 AG and
    2L + 1 RS, backward the mirror of each (2L + 1 AG, 2L + 1 RS; the output's gather mirrors to a
    split) and the norms' Partial gradients (2L + 1 AR); dp: 1 AG forward, 1 RS backward (the root is
    not resharded after forward). Set-up scatters the 16 sharded weights (7 per layer, embedding,
    output)."""
    layers = 2
    doc = trace_example(tmp_path, "tensor_parallelism/fsdp_tp_example.py")
    assert doc["layout"]["sizes"] == {"tp": 2, "dp": 2}
    for rank in doc["per_rank"]:
        steady = {("tp", "forward", "all_gather"): 2 * layers + 2, ("tp", "forward", "reduce_scatter"): 2 * layers + 1,
                  ("tp", "backward", "all_gather"): 2 * layers + 1, ("tp", "backward", "reduce_scatter"): 2 * layers + 1,
                  ("tp", "backward", "all_reduce"): 2 * layers + 1,
                  ("dp", "forward", "all_gather"): 1, ("dp", "backward", "reduce_scatter"): 1}
        steps = rank["steps"]
        assert len(steps) == 10 and counts(steps[0]) == {**steady, ("tp", "other", "scatter"): 16}
        assert all(counts(s) == steady for s in steps[1:]), rank["rank"]


def test_fsdp2_example(tmp_path):
    """``FSDP2/example.py``: fully_shard on each of its 10 layers and the root, 10 steps: forward 11
    all_gathers, backward 10 (the root is not resharded) and 11 reduce_scatters, 1 all_reduce of the
    gradient norm (clip_grad_norm_); then its checkpoint gathers every full tensor: the 125 parameters
    (12 per layer, 5 in the root) and Adam's two moments of each, 375 all_gathers. Rank 0's checkpoint
    is its own: no rank loads it (each issues the same), none is left behind."""
    doc = trace_example(tmp_path, "FSDP2/example.py")
    for rank in doc["per_rank"]:
        steps = rank["steps"]
        assert len(steps) == 11
        assert all(counts(s) == {("world", "forward", "all_gather"): 11, ("world", "backward", "all_gather"): 10,
                                 ("world", "backward", "reduce_scatter"): 11, ("world", "other", "all_reduce"): 1}
                   for s in steps[:10]), rank["rank"]
        assert counts(steps[10]) == {("world", "other", "all_gather"): 3 * 125}
    assert not (tmp_path / "work" / "checkpoints").exists()
