"""TorchRec 1.8.0's DistributedModelParallel, unmodified (tests/jobs/torchrec_dlrm.py: a DLRM whose tables it
shards, DDP with TorchRec's static graph over the rest, the tables' optimizer fused into backward): the steady
step against the counts its docstring reads from TorchRec's sharding and dist code, and the fake world against
a real gloo trace of the same script (`meshscope diff`, verdict same); on TorchRec's CUDA path, fbgemm's CUDA
tables as the fake world builds them (`trace.fake.fbgemm`), in-process and traced."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from .helpers import ROOT, fake_equals_real, skip_unless_installed, trace_json

skip_unless_installed("torchrec", "fbgemm_gpu")

JOB = ROOT / "tests" / "jobs" / "torchrec_dlrm.py"

def step_calls(doc: dict, rank: int, step: int) -> Counter:
    (mine,) = [r for r in doc["per_rank"] if r["rank"] == rank]
    (found,) = [s for s in mine["steps"] if s["step"] == step]
    return Counter((e["op"], e["phase"], e["dtype"], e["bytes_in"]) for e in found["events"])


def steady(doc: dict, rank: int) -> Counter:
    return step_calls(doc, rank, doc["steady"][str(rank)]["first"])


def by_hand(lengths: int, ids: int, pooled: tuple[str, int], dense: int = 4804, world: int = 2) -> Counter:
    """A steady step of the job's docstring: the KJT splits (3W int64: 48 B at W = 2), lengths and ids
    all-to-alls and the pooled embeddings' collective forward; the pooled gradient's (1,536 B) and DDP's one
    bucket backward."""
    backward = "all_gather" if pooled[0] == "reduce_scatter" else "all_to_all"
    return Counter({("all_to_all", "forward", "int64", 24 * world): 1, ("all_to_all", "forward", "int32", lengths): 1,
                    ("all_to_all", "forward", "int64", ids): 1, (pooled[0], "forward", "float32", pooled[1]): 1,
                    (backward, "backward", "float32", 1536): 1, ("all_reduce", "backward", "float32", dense): 1})


def test_table_wise_steady_step_by_hand_and_its_steps_are_the_combined_optimizers(tmp_path):
    """table_wise on 2 gloo ranks (t0, t2 on rank 0, t1 on rank 1): per steady step the KJT's three
    all-to-alls and the pooled embeddings' (2,048 B in on rank 0, which holds two tables, 1,024 B on rank 1)
    forward, its gradient's and DDP's bucket backward; DDP's static graph rebuilds its bucket in step 2 (two
    broadcasts, forward), so the steady steps start at 3. The step boundaries follow the CombinedOptimizer that
    steps, not the SGD objects apply_optimizer_in_backward made and fbgemm's fused update replaces; the note
    counts 6 steps of each class that stepped (the three nested CombinedOptimizer steps of one ``step()`` are
    one), and the regions are the model's own paths, the plan's key ``model.sparse_arch.embedding_bag_collection``
    without DistributedModelParallel's ``_dmp_wrapped_module``."""
    proc, doc = trace_json(tmp_path / "tw", "--nproc-per-node", 2, [str(JOB), "--steps", "6"])
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    assert [r["steps"] for r in doc["ranks"]] == [6, 6]
    (note,) = [n for n in doc["notes"] if "CombinedOptimizer" in n]
    stepped = dict(re.findall(r"(\w+) \((\d+) steps\)", note))
    assert stepped.keys() >= {"CombinedOptimizer", "Adam"} and set(stepped.values()) == {"6"}, note
    for rank, pooled in ((0, 2048), (1, 1024)):
        assert doc["steady"][str(rank)]["first"] == 3
        assert steady(doc, rank) == by_hand(96, 384, ("all_to_all", pooled))
        assert step_calls(doc, rank, 1) == steady(doc, rank)
        assert step_calls(doc, rank, 2) - steady(doc, rank) == {("broadcast", "forward", "int32", 36): 1,
                                                                ("broadcast", "forward", "int32", 4): 1}
    (rank0,) = [r for r in doc["per_rank"] if r["rank"] == 0]
    regions = {e["region"] for e in rank0["steps"][3]["events"] if e["phase"] == "forward"}
    assert "model.sparse_arch.embedding_bag_collection.TwPooledEmbeddingDist.PooledEmbeddingsAllToAll" in regions
    assert all(r.startswith("model.sparse_arch.embedding_bag_collection") for r in regions), regions


@pytest.mark.frameworks  # CI keeps table-wise by hand and row-wise's CUDA path fake == gloo; bench_frameworks.py runs this
def test_column_wise_fake_world_equals_gloo(tmp_path):
    """column_wise at world 2 (each rank 8 of every table's 16 columns, so every feature goes to both): the
    fake world of 2 issues what gloo does, call for call, and its steady step is the hand count (lengths 192
    B, ids 768 B, pooled 1,536 B). The CPU path; the CUDA path's fake world is row-wise's test below."""
    doc = fake_equals_real(tmp_path, 2, [str(JOB), "--sharding", "column_wise", "--steps", "6", "--cpu"])
    for rank in (0, 1):
        assert steady(doc, rank) == by_hand(192, 768, ("all_to_all", 1536))


@pytest.mark.frameworks
def test_row_wise_on_the_cpu_path_steady_step_by_hand(tmp_path):
    """row_wise on 2 gloo ranks, named by the plan (TorchRec offers it for compute device cuda only): the ids
    bucketized by row block (lengths 192 B, ids 384 B), the partial sums reduce-scattered forward (3,072 B)
    and their gradient all-gathered backward (1,536 B). Real gloo: the fake world's (CUDA path) is the test
    below."""
    proc, doc = trace_json(tmp_path / "rw", "--nproc-per-node", 2, [str(JOB), "--sharding", "row_wise", "--cpu"])
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    for rank in (0, 1):
        assert steady(doc, rank) == by_hand(192, 384, ("reduce_scatter", 3072))


def test_row_wise_on_the_cuda_path_fake_world_equals_gloo_and_the_hand_count(tmp_path):
    """row_wise on TorchRec's CUDA path (nccl, compute device cuda, so fbgemm's CUDA table-batched embeddings, which
    a fake world builds as the CPU's) in a fake world of 2 issues what real gloo issues on the CPU path, call for call
    (`meshscope diff`: same), and its steady step is the hand count: the ids bucketized by row block (lengths 192 B,
    ids 384 B), the partial sums reduce-scattered forward (3,072 B), their gradient all-gathered backward (1,536 B),
    DDP's bucket (4,804 B). The CPU path's calls are the CUDA path's: the plan is the same but for the shards'
    placement (torchrec 1.8.0 distributed/sharding_plan.py:561-650, the same row blocks; :349-386, the FUSED kernel
    for both), and TorchRec's code on the way branches on the device only for DDP's device_ids
    (model_parallel.py:185), a stream (comm_ops.py:166) and a copy to the host (dist_data.py:189), none a collective."""
    doc = fake_equals_real(tmp_path, 2, [str(JOB), "--sharding", "row_wise", "--cpu"],
                           fake_job=[str(JOB), "--sharding", "row_wise"])
    assert any("fbgemm's CUDA embedding tables" in n for n in doc["notes"]), doc["notes"]
    for rank in (0, 1):
        assert steady(doc, rank) == by_hand(192, 384, ("reduce_scatter", 3072))


@pytest.mark.parametrize("world, sharding, steady_step", [
    (2, "table_wise", by_hand(96, 384, ("all_to_all", 2048))),
    (4, "row_wise", by_hand(384, 384, ("reduce_scatter", 6144), world=4))])
def test_rank_0_alone_on_the_cuda_path_takes_its_own_chunks_for_its_peers(tmp_path, world, sharding, steady_step):
    """Rank 0 alone on TorchRec's CUDA path: no peer is traced, so every chunk of the KJT all-to-alls its peers
    send it is its own chunk to itself (`trace.fake.replay`), whose counts, lengths and ids agree. It used to
    be the fake backend's: the counts of its chunk to that peer and the lengths of its chunk to rank 0 (torch
    2.13 FakeProcessGroup.hpp ``alltoall_base``), and fbgemm's permute corrupted the heap (table-wise: SIGSEGV,
    or SIGABRT "free(): invalid pointer") or its bounds check aborted (row-wise at 4: "last element in offsets:
    55, indices size: 53"). Its steady step is the docstring's hand count (row-wise at W = 4: splits 3W int64,
    96 B; lengths W x 3B int32, 384 B; ids 6B int64, 384 B; the reduce-scatter's (W B, 48) fp32, 6,144 B);
    table-wise, what rank 1 sends it is what rank 1 would: f0's and f2's 16 lengths and 8 x (1 + 3) = 32 ids
    (assumed, and named)."""
    proc, doc = trace_json(tmp_path / sharding, "--fake-world", world, "--ranks", 0,
                           [str(JOB), "--sharding", sharding])
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    assert steady(doc, 0) == steady_step
    if sharding == "table_wise":
        (rank0,) = [r for r in doc["per_rank"] if r["rank"] == 0]
        lengths, ids = [e for e in rank0["steps"][3]["events"] if e["op"] == "all_to_all"][1:3]
        assert (lengths["output_splits"], ids["output_splits"]) == ([16, 16], [32, 32])
        assert "output_splits" in lengths["assumed"] and "output_splits" in ids["assumed"]
    assert any("rank 0: all_to_all on default_pg" in n and "not traced before it" in n for n in doc["notes"])


@pytest.fixture
def cpu_tables(monkeypatch):
    """fbgemm's TBE class with the fake world's row installed in this process, put back after the test."""
    from fbgemm_gpu import split_table_batched_embeddings_ops_training as tbe

    from meshscope.trace.fake import devices, fbgemm

    monkeypatch.setattr(tbe.SplitTableBatchedEmbeddingBagsCodegen, "__init__",
                        tbe.SplitTableBatchedEmbeddingBagsCodegen.__init__)
    used = devices.used[:]  # what this process mapped: the row marks what it builds
    fbgemm.cpu_tables(tbe)
    yield tbe
    devices.used[:] = used


def test_a_cuda_tbe_is_built_as_the_cpus_and_looks_up_on_the_cpu(cpu_tables):
    """Two tables of 10 x 4 asked for on CUDA (EmbeddingLocation.DEVICE, ComputeDevice.CUDA, as TorchRec asks for a
    cuda device) are the CPU's TBE: every table HOST, and a lookup of 2 samples pools (2, 8), each sample's sum of
    its rows (the weights set by hand: row r of table t holds 10 t + r)."""
    import torch

    tbe = cpu_tables.SplitTableBatchedEmbeddingBagsCodegen
    location, compute = cpu_tables.EmbeddingLocation, cpu_tables.ComputeDevice
    module = tbe([(10, 4, location.DEVICE, compute.CUDA)] * 2, device="cpu")
    assert module.use_cpu and {spec[2:] for spec in module.embedding_specs} == {(location.HOST, compute.CPU)}
    for t, weights in enumerate(module.split_embedding_weights()):
        weights.copy_((10 * t + torch.arange(10.0))[:, None].expand(10, 4))
    # features f0 (table 0) then f1 (table 1), 2 samples each: f0 [1, 2] and [3]; f1 [] and [4, 5]
    indices, offsets = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 3, 3, 5])
    pooled = module(indices, offsets)
    assert pooled.tolist() == [[3.0] * 4 + [0.0] * 4, [3.0] * 4 + [29.0] * 4]


def test_an_optimizer_without_a_cpu_kernel_is_one_line(cpu_tables):
    """Adam has CUDA kernels only in fbgemm 1.8.0: the fake world says so in one line, naming what the CPU has,
    before fbgemm's own assertion."""
    from meshscope.trace.fake.devices import Unmapped

    tbe = cpu_tables.SplitTableBatchedEmbeddingBagsCodegen
    spec = (10, 4, cpu_tables.EmbeddingLocation.DEVICE, cpu_tables.ComputeDevice.CUDA)
    with pytest.raises(Unmapped) as raised:
        tbe([spec], device="cpu", optimizer=cpu_tables.OptimType.ADAM)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(
        "fbgemm's table-batched embedding with optimizer ADAM (its CPU kernels: EXACT_SGD, EXACT_ADAGRAD, "
        "EXACT_ROWWISE_ADAGRAD, EMAINPLACE_ROWWISE_ADAGRAD) at test_torchrec.py:"), message
