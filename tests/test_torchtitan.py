"""torchtitan, unmodified: ``-m torchtitan.train`` with its llama3 debug model in a fake world. 0.2.2
(the newest release that runs on torch 2.13: CI) and 0.3.0 (torch 2.15, Python 3.12: the compat venv,
benchmarks/bench_frameworks.py); each test runs only on the release it reads. The wheels ship no
tokenizer and no data, so the tests make a word-level tokenizer and a few thousand documents and point
the flags at them. torchtitan needs CUDA (it picks "cuda" when no accelerator is found), so there is no
gloo run to compare with. Oracle: per step, the FSDP units of its apply_fsdp
(models/llama3/infra/parallelize.py at 0.2.2; distributed/fsdp.py apply_fsdp_to_decoder at 0.3.0), its
TP plan, and the calls of its train_step (train.py at 0.2.2, trainer.py at 0.3.0), counted by hand, and
the layers' sizes from the debug model's shapes."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from .helpers import cli_here, only_with, skip_unless_installed, trace_json

# torchtitan.models.moe imports triton at import time, which torchtitan does not declare.
skip_unless_installed("torchtitan", "triton")

LAYERS, DIM, VOCAB, FFN = 6, 256, 2048, 768
"""llama3 "debugmodel": its feed-forward width is 2/3 of 4 x dim rounded up to a multiple of 256."""
WORDS = [f"w{i}" for i in range(200)]


def titan(steps: int = 3) -> list[str]:
    """The job as its users start it, on `make_assets`' tokenizer and documents in the working directory."""
    return ["-m", "torchtitan.train", "--model.hf_assets_path", "tokenizer", "--training.dataset", "c4_test",
            "--training.dataset_path", "c4", "--training.steps", str(steps), "--training.seq_len", "64",
            "--training.local_batch_size", "2", "--metrics.log_freq", "1"]


JOB = titan()


def make_assets(where):
    """A tokenizer (``tokenizer.json`` and ``tokenizer_config.json``: what torchtitan's
    HuggingFaceTokenizer reads from ``--model.hf_assets_path``) over 200 words, and 2,000 documents
    of them as JSON lines, which the ``c4_test`` dataset loads from ``--training.dataset_path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    special = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(special + WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (where / "tokenizer").mkdir()
    tokenizer.save(str(where / "tokenizer" / "tokenizer.json"))
    (where / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": special[1], "eos_token": special[2], "add_bos_token": True, "add_eos_token": True}))
    rng = random.Random(0)
    (where / "c4").mkdir()
    (where / "c4" / "train.json").write_text("".join(
        json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(20, 80)))}) + "\n" for _ in range(2000)))


@only_with("torchtitan", "0.2.2")
def test_torchtitan_fsdp_in_a_fake_world_of_4(tmp_path):
    """Ranks 0, 1 and 3 pass (the FSDP group's first, a middle and its last member; 3 traced after the
    first two, so that it shows what the fork server learned from them); a steady step issues, on the one
    group that is torchtitan's batch, fsdp and loss mesh: the token count's all_reduce, an all_gather
    per FSDP unit forward (embedding, each block, norm + output: LAYERS + 2), again in backward for the
    units resharded after forward (all but norm + output: LAYERS + 1), a reduce_scatter per unit, the
    gradient norm's all_reduce (one value per parameter) and the three logged metrics' all_reduces."""
    make_assets(tmp_path)
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 4, "--ranks", "0,1,3", JOB, cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["fake_world"]["traced"] == [0, 1, 3]
    # the fork server learned every module rank 0 imported, pandas' pyarrow included (its jemalloc
    # started no background thread), so later ranks import none of their own
    assert "starts a thread" not in (tmp_path / "t" / "logs" / "fork_server.log").read_text()
    assert json.loads((tmp_path / "t" / "imports" / "rank3.json").read_text()) == []
    dp = "batch/fsdp/loss_mesh"
    for rank in doc["per_rank"]:
        events = rank["steps"][2]["events"]
        assert Counter((e["axis"], e["phase"], e["op"]) for e in events) == {
            (dp, "other", "all_reduce"): 5, (dp, "forward", "all_gather"): LAYERS + 2,
            (dp, "backward", "all_gather"): LAYERS + 1, (dp, "backward", "reduce_scatter"): LAYERS + 2}, rank["rank"]
        block = 4 * DIM * DIM + 3 * DIM * FFN + 2 * DIM
        forward = [(e["region"], e["bytes_out"]) for e in events if e["phase"] == "forward"]
        # parameters gathered in bf16 (its mixed precision default), each unit whole
        assert forward == [("tok_embeddings", 2 * VOCAB * DIM)] + [(f"layers.{i}", 2 * block) for i in range(LAYERS)] \
            + [("norm", 2 * (DIM + VOCAB * DIM))]
        scattered = [e["bytes_in"] for e in events if e["op"] == "reduce_scatter"]
        # gradients reduced in fp32, last unit first
        assert scattered == [4 * (DIM + VOCAB * DIM)] + [4 * block] * LAYERS + [4 * VOCAB * DIM]
        (norm,) = [e for e in events if e["op"] == "all_reduce" and e["dtype"] == "float32" and e["bytes_in"] > 8]
        assert norm["bytes_in"] == 4 * (9 * LAYERS + 3)  # one per parameter: 9 per block, embedding, norm, output


@only_with("torchtitan", "0.2.2")
def test_torchtitan_context_parallel_runs_its_ring_attention_in_a_fake_world(tmp_path):
    """CP 2 x FSDP 2 with fake tensors: the CPU standing for an H100 runs SDPA as cuDNN's attention, which torch's
    context parallelism shards (torch 2.13 distributed/tensor/experimental/_context_parallel/_attention.py); as
    the CPU's flash kernel the sequence-sharded query met whole keys and the rank failed ("a and b must have
    same reduction dim"). By hand from that file, CP 2, per block and step on the cp axis: forward, one
    all_gather of its key and value (``_AllGatherRotater``: once per ring); backward, that gather again and
    the gradients' two all_to_all (``_AllToAllRotater.exchange_buffers`` at each of the 2 ring steps); and
    torchtitan's default selective checkpointing recomputes every second block (``selective_ac_option``
    "2"), whose forward gathers once more in backward. Rank 0 alone: the other member of its CP pair issues the
    same calls (a collective's members do), and one rank is half the CPU of two."""
    make_assets(tmp_path)
    job = [*JOB, "--parallelism.context_parallel_degree", "2"]
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 4, "--ranks", "0", "--fake-tensors", job, cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    for rank in doc["per_rank"]:
        cp = Counter((e["phase"], e["op"]) for e in rank["steps"][2]["events"] if e["axis"] == "cp")
        assert cp == {("forward", "all_gather"): LAYERS, ("backward", "all_gather"): LAYERS + LAYERS // 2,
                      ("backward", "all_to_all"): 2 * LAYERS}, rank["rank"]


@only_with("torchtitan", "0.2.2")
@pytest.mark.frameworks
@pytest.mark.timeout(1200)  # 4.5 min at load 1.7-3.4 on 2 cores with 27 classes, each running the whole job
def test_torchtitan_hsdp_tp_at_1024_ranks_with_fake_tensors(tmp_path):
    """HSDP 4 x 32 x TP 8 at 1,024 ranks, --ranks auto, --fake-tensors: 8 classes (its first member or not
    on each axis: no point-to-point call orders a group), all passed, every one
    the same steady step; the layout names HSDP as both its dims. By hand: on fsdp the FSDP units as
    above, on dp_replicate HSDP's all_reduce of each unit's gradient (LAYERS + 2); on tp, forward, its
    plan's gathers of each block's attention and feed-forward inputs and of the output layer's (2 LAYERS
    + 1 all_gather) and the reduce-scatters of wo, w2 and the embedding (2 LAYERS + 1); the token count
    on batch, the metrics on loss_mesh. Backward on tp: each forward all_gather's gradient is a
    reduce_scatter and each reduce_scatter's an all_gather (2 LAYERS + 1 of each), the norms' weight
    gradients under sequence parallelism are all-reduced (attention_norm and ffn_norm per block, the
    final norm: 2 LAYERS + 1), and its default activation checkpointing ("selective", option "2":
    every second block wrapped whole, distributed/activation_checkpoint.py, 0.2.2) recomputes the
    forward of LAYERS / 2 blocks in backward, each re-issuing its 2 all_gathers and 2 reduce_scatters."""
    make_assets(tmp_path)
    job = [*JOB, "--parallelism.data_parallel_replicate_degree", "4", "--parallelism.data_parallel_shard_degree",
           "32", "--parallelism.tensor_parallel_degree", "8"]
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 1024, "--nproc-per-node", 8, "--fake-tensors", job,
                           cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["layout"]["text"] == "tp 8 x fsdp 32 x dp_replicate 4 (order tp-fsdp-dp_replicate)"
    assert len(doc["fake_world"]["classes"]) == 8
    steps = tp_step_events(doc)
    assert all(s == steps[0] for s in steps)
    want = {("fsdp", "forward", "all_gather"): LAYERS + 2, ("fsdp", "backward", "all_gather"): LAYERS + 1,
            ("fsdp", "backward", "reduce_scatter"): LAYERS + 2, ("dp_replicate", "backward", "all_reduce"): LAYERS + 2,
            ("tp", "forward", "all_gather"): 2 * LAYERS + 1, ("tp", "forward", "reduce_scatter"): 2 * LAYERS + 1,
            ("batch", "other", "all_reduce"): 1, ("loss_mesh", "other", "all_reduce"): 3,
            ("tp", "backward", "all_gather"): 2 * LAYERS + 1 + 2 * (LAYERS // 2),
            ("tp", "backward", "reduce_scatter"): 2 * LAYERS + 1 + 2 * (LAYERS // 2),
            ("tp", "backward", "all_reduce"): 2 * LAYERS + 1}
    assert {k: steps[0][k] for k in want} == want


@only_with("torchtitan", "0.2.2")
@pytest.mark.frameworks
@pytest.mark.timeout(600)
def test_torchtitan_pp_fsdp_infers_its_stage_shapes_in_a_fake_world_of_8(tmp_path):
    """PP 2 x FSDP 4, torchtitan's default 1F1B with its stages' shapes inferred over P2P (it gives torch's
    PipelineStage none: the warm-up votes 'dynamic', then send_object_list / recv_object_list of each
    stage's metadata, delivered by the fake world as a real run would). By hand per steady step on
    every stage (local batch 2 in microbatches of 1, its default: M = 2): on pp, M activation sends and M
    gradient receives on stage 0, the mirror on stage 1, and the gradient norm's all_reduce
    (distributed/utils.py clip_grad_norm_ with a pp mesh, 0.2.2); on fsdp one forward all_gather per
    FSDP unit of the stage (stage 0: the embedding and 3 blocks; stage 1: 3 blocks and norm + output)
    and none in backward (its "default" reshard policy keeps parameters gathered under PP,
    models/llama3/infra/parallelize.py), one reduce_scatter per unit after the last microbatch, the
    norm's all_reduce; the token count on batch, the three metrics on loss_mesh."""
    make_assets(tmp_path)
    job = [*titan(steps=4), "--parallelism.pipeline_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "4"]
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 8, job, cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    units = 1 + LAYERS // 2
    want = {("pp", "other", "send"): 2, ("pp", "other", "recv"): 2, ("pp", "other", "all_reduce"): 1,
            ("fsdp", "forward", "all_gather"): units, ("fsdp", "other", "reduce_scatter"): units,
            ("fsdp", "other", "all_reduce"): 1, ("batch", "other", "all_reduce"): 1,
            ("loss_mesh", "other", "all_reduce"): 3}
    for rank in doc["per_rank"]:
        events = rank["steps"][2]["events"]
        assert Counter((e["axis"], e["phase"], e["op"]) for e in events) == want, rank["rank"]


JOB_030 = ["-m", "torchtitan.train", "--module", "llama3", "--config", "llama3_debugmodel", "--hf-assets-path", "tokenizer",
           "--dataloader.dataset", "c4_test", "--dataloader.dataset-path", "c4", "--training.steps", "4",
           "--training.seq-len", "64", "--training.local-batch-size", "2", "--metrics.log-freq", "1",
           "--training.disable-cuda-graphs"]
"""0.3.0's flags for the same job (a config by registry name, hyphens; 4 steps, so that steady steps are compared).
Its trainer captures each step in a CUDA graph by default (trainer.py wrap_with_cuda_graph), which no CPU can
replay (a fake world says so in one line): the job turns it off."""
CHUNKS = 8
"""ChunkedLossWrapper's default num_chunks (components/loss.py): the debug config's loss runs lm_head and the
cross entropy once per sequence chunk, outside the model's forward."""


def step_030(tp: int, replicate: int) -> Counter:
    """One steady step of one rank of torchtitan 0.3.0's llama3 debug model under FSDP x TP (x HSDP's
    replicas), per (axis, phase, op), read from its code:

    - FSDP (distributed/fsdp.py apply_fsdp_to_decoder): units tok_embeddings, each block, [norm, lm_head]
      (not resharded after forward), the root (no parameters of its own). Forward: a gather per unit as it
      runs (LAYERS + 2, the last at norm: the model's forward skips lm_head). The root's post-forward
      completes the [norm, lm_head] unit, whose lm_head never ran, and that reshards it (torch 2.15
      fsdp/_fully_shard/_fsdp_state.py _force_complete_incomplete_states), so ChunkedLossWrapper's explicit
      ``lm_head.unshard()`` gathers it again (other). Backward: the chunks' backward reduce-scatters lm_head's
      gradient at the last chunk, the wrapper reshards the unit, and the decoder's backward gathers every unit
      again (LAYERS + 2) and reduce-scatters the rest of [norm, lm_head] (norm), each block and the
      embedding: LAYERS + 3 reduce-scatters; with HSDP each of those is all-reduced on dp_replicate.
    - TP with sequence parallelism (models/llama3/sharding.py, on by default): forward, the embedding's
      reduce-scatter to sequence shards, per block the gathers of the attention's and feed-forward's inputs and
      the reduce-scatters of wo and w2, and the final norm's gather for lm_head: 2 LAYERS + 1 of each;
      _LossParallelCrossEntropy's three all-reduces per chunk (max, sum of exponentials, target logit).
    - trainer.py train_step: the token count's all-reduce on batch; the grad norm's DTensor reduced on each
      axis its parameters are sharded on (dp_shard and tp); after optimizer.step the three logged metrics'
      all-reduces on the loss mesh, which fall in the next step's ledger.
    """
    step = Counter({("batch", "other", "all_reduce"): 1, ("loss_mesh", "other", "all_reduce"): 3,
                    ("dp_shard", "forward", "all_gather"): LAYERS + 2, ("dp_shard", "other", "all_gather"): 1,
                    ("dp_shard", "backward", "all_gather"): LAYERS + 2,
                    ("dp_shard", "backward", "reduce_scatter"): LAYERS + 3, ("dp_shard", "other", "all_reduce"): 1,
                    ("tp", "forward", "all_gather"): 2 * LAYERS + 1, ("tp", "forward", "reduce_scatter"): 2 * LAYERS + 1,
                    ("tp", "other", "all_reduce"): 3 * CHUNKS + 1})
    if replicate > 1:
        step[("dp_replicate", "backward", "all_reduce")] = LAYERS + 3
    return step


def unit_sizes_030(tp: int) -> dict[str, int]:
    """Elements of each FSDP unit on one tp rank: the embedding and lm_head split over the vocabulary, the
    blocks' projections over heads or the feed-forward width (wqkv fused: 3 DIM x DIM), the norms whole."""
    return {"tok_embeddings": VOCAB * DIM // tp, "block": (4 * DIM * DIM + 3 * DIM * FFN) // tp + 2 * DIM,
            "norm": DIM, "lm_head": VOCAB * DIM // tp}


def tp_step_events(doc: dict, step: int = 2) -> list[Counter]:
    return [Counter((e["axis"], e["phase"], e["op"]) for e in r["steps"][step]["events"]) for r in doc["per_rank"]]


def only(counts: Counter, want: Counter) -> dict:
    """`counts` restricted to the keys of `want` (the TP backward, with selective AC's recomputation, is not
    counted by hand)."""
    return {k: counts[k] for k in want}


@only_with("torchtitan", "0.3.0")
@pytest.mark.frameworks
@pytest.mark.timeout(600)
def test_torchtitan_030_fsdp_tp_in_a_fake_world_of_4(tmp_path):
    """FSDP 2 x TP 2: every rank its own class, all passed, the steady steps equal; per step the counts of
    `step_030`, the FSDP units gathered in bf16 and reduced in fp32 at the sizes of `unit_sizes_030`."""
    make_assets(tmp_path)
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 4, [*JOB_030, "--parallelism.tensor-parallel-degree", "2"],
                           cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["fake_world"]["traced"] == [0, 1, 2, 3]
    assert doc["layout"]["text"] == "tp 2 x batch/dp/dp_shard/loss_mesh 2 (order tp-batch/dp/dp_shard/loss_mesh)"
    assert next(c for c in doc["checks"] if c["name"] == "steady steps repeat")["status"] == "passed"
    want = step_030(2, 1)
    assert all(only(s, want) == want for s in tp_step_events(doc)), tp_step_events(doc)[0]
    units = unit_sizes_030(2)
    events = doc["per_rank"][0]["steps"][2]["events"]
    gathered = [e["bytes_out"] for e in events if e["axis"] == "dp_shard" and e["op"] == "all_gather"]
    forward = [2 * units["tok_embeddings"]] + [2 * units["block"]] * LAYERS + [2 * (units["norm"] + units["lm_head"])]
    assert gathered == forward + forward[-1:] + forward[::-1]
    scattered = [e["bytes_in"] for e in events if e["axis"] == "dp_shard" and e["op"] == "reduce_scatter"]
    assert scattered == [4 * units["lm_head"], 4 * units["norm"]] + [4 * units["block"]] * LAYERS \
        + [4 * units["tok_embeddings"]]


@only_with("torchtitan", "0.3.0")
@pytest.mark.frameworks
@pytest.mark.timeout(600)
def test_torchtitan_030_hsdp_tp_in_a_fake_world_of_8(tmp_path):
    """HSDP 2 x 2 x TP 2: as above, and HSDP's all-reduce on dp_replicate of each reduce-scattered gradient
    shard (fp32, a unit's elements over tp and fsdp)."""
    make_assets(tmp_path)
    job = [*JOB_030, "--parallelism.data-parallel-replicate-degree", "2", "--parallelism.data-parallel-shard-degree",
           "2", "--parallelism.tensor-parallel-degree", "2"]
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 8, job, cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["layout"]["text"] == "tp 2 x dp_shard 2 x dp_replicate 2 (order tp-dp_shard-dp_replicate)"
    want = step_030(2, 2)
    assert all(only(s, want) == want for s in tp_step_events(doc)), tp_step_events(doc)[0]
    units = unit_sizes_030(2)
    replicated = [e["bytes_in"] for e in doc["per_rank"][0]["steps"][2]["events"] if e["axis"] == "dp_replicate"]
    assert replicated == [4 * units[u] // 2 for u in ("lm_head", "norm", *["block"] * LAYERS, "tok_embeddings")]


@only_with("torchtitan", "0.3.0")
@pytest.mark.frameworks
@pytest.mark.timeout(1200)
def test_torchtitan_030_hsdp_tp_at_1024_ranks_with_fake_tensors(tmp_path):
    """The issue's target: HSDP 4 x 32 x TP 8 at 1,024 ranks, --ranks auto, --fake-tensors: every class
    passed, every one the same steady step, with the counts of `step_030`."""
    make_assets(tmp_path)
    job = [*JOB_030, "--parallelism.data-parallel-replicate-degree", "4", "--parallelism.data-parallel-shard-degree",
           "32", "--parallelism.tensor-parallel-degree", "8"]
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 1024, "--nproc-per-node", 8, "--fake-tensors", job,
                           cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["layout"]["text"] == "tp 8 x dp_shard 32 x dp_replicate 4 (order tp-dp_shard-dp_replicate)"
    assert len(doc["fake_world"]["classes"]) == 8  # its first member or not on each axis
    steps = tp_step_events(doc)
    assert all(s == steps[0] for s in steps)
    want = step_030(8, 4)
    assert only(steps[0], want) == want, steps[0]


@only_with("torchtitan", "0.3.0")
@pytest.mark.frameworks
@pytest.mark.timeout(600)
def test_torchtitan_030_interleaved_pp_infers_its_stage_shapes_in_a_fake_world_of_8(tmp_path):
    """PP 2 x FSDP 4 with 0.3.0's default Interleaved1F1B: 2 stages per pp rank (4 in all), inferring their
    shapes over P2P, each rank's second stage waiting on the other rank's first (the fake world traces the
    ranks that failed for want of a later stage's shapes again). By hand per steady step on pp, M = 2
    microbatches (local batch 2, microbatches of 1): the first pp rank's stage 0 sends M activations and
    receives M gradients, its stage 2 receives and sends M of each; the second's stage 1 does the same as
    stage 2 and its last stage 3 receives M activations and sends M gradients: 3M sends and 3M receives on
    every rank.

    FSDP under it, by hand from 0.3.0's pipeline split (distributed/pipeline_parallel.py: stages
    [tok_embeddings, layers.0], [layers.1-2], [layers.3-4], [layers.5, norm, lm_head], looped: pp rank 0
    holds stages 0 and 2, pp rank 1 stages 1 and 3), its FSDP units (distributed/fsdp.py: each block,
    the embedding, norm + lm_head as one unit; reshard_after_forward False under PP) and torch 2.15's
    schedule (pipelining/stage.py: an UNSHARD of each stage at the step's start, gradient sync off per
    microbatch, one REDUCE_GRAD per stage after its last backward): 1 all-gather and 1 reduce-scatter per
    unit and step, outside any module (4 and 4 on either pp rank). The last stage's norm + lm_head unit
    more: the chunked loss (components/loss.py) unshards lm_head for each microbatch and reshards it after
    (M all-gathers more), its pre-backward gathers it again (M, in backward), and the loss's own backward
    reduce-scatters its gradient at its last chunk (M, in backward). On both: the gradient norm's
    all-reduce on dp_shard and on pp, the token count's on batch and the three logged metrics' on
    loss_mesh."""
    make_assets(tmp_path)
    job = [*JOB_030, "--parallelism.pipeline-parallel-degree", "2", "--parallelism.data-parallel-shard-degree", "4"]
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 8, job, cwd=tmp_path)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    for rank in doc["per_rank"]:
        for step in (2, 3):
            calls = Counter(e["op"] for e in rank["steps"][step]["events"] if e["axis"] == "pp")
            assert (calls["send"], calls["recv"]) == (6, 6), (rank["rank"], step, calls)
            others = Counter((e["axis"], e["phase"], e["op"]) for e in rank["steps"][step]["events"]
                             if e["op"] not in ("send", "recv"))
            last = rank["rank"] >= 4  # the mesh is [pp, dp_shard]: ranks 4-7 are pp rank 1
            want = {("dp_shard", "other", "all_gather"): 4 + 2 * last, ("dp_shard", "other", "reduce_scatter"): 4,
                    ("dp_shard", "other", "all_reduce"): 1, ("pp", "other", "all_reduce"): 1,
                    ("batch", "other", "all_reduce"): 1, ("loss_mesh", "other", "all_reduce"): 3}
            if last:
                want |= {("dp_shard", "backward", "all_gather"): 2, ("dp_shard", "backward", "reduce_scatter"): 2}
            assert others == want, (rank["rank"], step, others)


@only_with("torchtitan", "0.2.2")
@pytest.mark.frameworks
@pytest.mark.timeout(600)
def test_torchtitan_moe_expert_parallel_without_data_is_the_ledger_with_data(tmp_path):
    """qwen3 "debugmodel_moe" (8 MoE layers of 64 experts, top 8, dim 256) under expert parallelism 4 with
    torchtitan's balanced routing (``--debug.moe_force_load_balance``): its router counts tokens per expert with
    an integer ``histc``, reads the all-to-all's splits back and permutes its tokens with a triton kernel. With
    fake tensors those follow from the job's own numbers (trace/fake/known.py): the ledger and the counted FLOPs
    are those with real tensors. By hand, per MoE layer and step: forward, the counts' all-to-all (64 int64) and
    the dispatch and combine of 2 x 256 tokens x top 8 = 4,096 rows of 256 bf16 (2 MiB, 1,024 rows to and from
    each member); backward, the combine's and the dispatch's again."""
    make_assets(tmp_path)
    job = [*titan(4), "--model.name", "qwen3", "--model.flavor", "debugmodel_moe", "--parallelism.expert_parallel_degree",
           "4", "--parallelism.data_parallel_shard_degree", "4", "--debug.moe_force_load_balance",
           "--activation_checkpoint.mode", "none", "--training.seq_len", "256"]
    docs = {}
    for name, flags in (("real", []), ("fake", ["--fake-tensors"])):
        proc, docs[name] = trace_json(tmp_path / name, "--fake-world", 4, "--work", *flags, job, cwd=tmp_path)
        assert proc.returncode == 0 and docs[name]["passed"], proc.stderr[-3000:]
    same = cli_here("diff", tmp_path / "real", tmp_path / "fake", "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["same"], same.stdout[-3000:]
    for rank in docs["fake"]["per_rank"]:
        a2a = [e for e in rank["steps"][2]["events"] if e["op"] == "all_to_all"]
        assert Counter((e["phase"], e["bytes_in"], e["bytes_out"]) for e in a2a) == {
            ("forward", 512, 512): 8, ("forward", 2 << 20, 2 << 20): 16, ("backward", 2 << 20, 2 << 20): 16}
        assert all(e["input_splits"] == e["output_splits"] == [1024] * 4 for e in a2a if e["bytes_in"] == 2 << 20)
    flops = {name: [json.loads(p.read_text())["items"] for p in sorted((tmp_path / name / "work").glob("*.json"))]
             for name in docs}
    counted = {name: [sum(f for item in items if item[0] == "c" for f in item[2].values()) for items in per]
               for name, per in flops.items()}
    assert counted["fake"] == counted["real"] and all(counted["fake"])
