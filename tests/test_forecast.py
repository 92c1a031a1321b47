"""``meshscope forecast`` end to end on tests/jobs/ddp.py (DDP over 4 bias-free Linear(256, 256), batch 8, fp32,
one 256 KiB bucket per layer after the rebuild): the FLOPs of a step by hand from the layers' shapes, the
buckets of DDP's own layout (the job's docstring), and the bad inputs' one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

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
        assert cls["step_s"] == pytest.approx(cls["compute_s"] + cls["exposed_s"] + cls["waited_on_streams_s"])
    assert doc["step_s"] == max(c["step_s"] for c in doc["classes"])
    assert doc["tokens_per_s_per_gpu"] == pytest.approx(4 * B / doc["step_s"] / 4)
    assert doc["cluster"]["name"] == "h100-sxm" and "counted FLOPs" in doc["compute_source"]
    assert doc["figure"].endswith("figures/forecast-h100-sxm.png") and (traced[0] / "figures").is_dir()


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
    (("--cluster", "h100-sxm"), "--from-trace DIR"),
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


def test_fsdp2s_collectives_are_issued_on_its_own_streams(tmp_path):
    """tests/jobs/fsdp2.py (4 blocks + the root, one all-gather and one reduce-scatter per unit; the job's
    docstring): FSDP2 issues every all-gather and reduce-scatter on its all-gather and reduce-scatter streams,
    not the compute stream (torch 2.13 _fsdp_collectives.py foreach_all_gather and foreach_reduce, under
    ``device_handle.stream``), ordering them against it with wait_stream and events; the work log sees those
    streams, so a forecast can let the all-gathers run beside compute."""
    from meshscope.capture.work import WorkLog
    from meshscope.core.events import CommEvent

    proc = cli_here("trace", "--fake-world", 2, "--fake-tensors", "--work", "--out", tmp_path / "t",
                    "--json", "--", "tests/jobs/fsdp2.py", "--steps", 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = WorkLog.read(tmp_path / "t" / "work" / "rank0.json")
    ledger = [CommEvent.from_json(json.loads(line)) for line in
              (tmp_path / "t" / "ledgers" / "rank0.jsonl").read_text().splitlines()]
    streams = {item[1]: item[2] for item in log.items if item[0] == "i"}
    ops = {(ledger[i].op, ledger[i].step): s for i, s in streams.items()}
    side = [(e.op, s) for (e, s) in ((ledger[i], s) for i, s in streams.items()) if e.step == 2]
    assert sorted(op for op, _ in side) == ["all_gather"] * 9 + ["reduce_scatter"] * 5
    assert all(s != 0 for _, s in side), ops
    kinds = {item[0] for item in log.items}
    assert {"j", "e", "v"} <= kinds  # the orders between streams
    recorded = set()
    for item in log.items:  # every event waited for was recorded before (FSDP2 records some by themselves)
        if item[0] == "e":
            recorded.add(item[1])
        elif item[0] == "v":
            assert item[1] in recorded, item
    proc = cli_here("forecast", "--from-trace", tmp_path / "t", "--cluster", "h100-sxm", "--json")
    assert proc.returncode == 0, proc.stderr
    (axis,) = json.loads(proc.stdout)["classes"][0]["axes"]
    assert axis["exposed_s"] < axis["seconds"]  # some of it runs beside compute


@pytest.mark.parametrize("tensors", ["--real-tensors", "--fake-tensors"])
def test_a_call_is_needed_where_the_job_waits_for_it_or_else_where_it_reads_it(tmp_path, tensors):
    """tests/jobs/waits.py: five all-gathers a step, each followed by a matmul that does not read it, and a receive
    waited for after one. By c10d's semantics (the job's docstring) a call made without async_op, a coalesced one, and
    one waited for at once are needed before the matmul; one waited for after it, one only read after it, and the
    receive, after it. Until Work.wait was watched, the first three were needed at their first read, after the
    matmul: a forecast hid them behind it."""
    from meshscope.capture.work import WorkLog
    from meshscope.core.events import CommEvent

    proc = cli_here("forecast", "--fake-world", 2, tensors, "--cluster", "h100-sxm", "--out", tmp_path / "t",
                    "--json", "--", "tests/jobs/waits.py", "--steps", 3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    items = WorkLog.read(tmp_path / "t" / "work" / "rank0.json").items
    ledger = [CommEvent.from_json(json.loads(line)) for line in
              (tmp_path / "t" / "ledgers" / "rank0.jsonl").read_text().splitlines()]
    issued = [k for k, item in enumerate(items) if item[0] == "i" and ledger[item[1]].step == 2
              and ledger[item[1]].op == "all_gather"]
    assert len(issued) == 5
    before = []
    for k in issued:
        call = items[k][1]
        wait = next(j for j in range(k, len(items)) if items[j][:2] == ["w", call])
        matmul = next(j for j in range(k, len(items)) if items[j][0] == "c" and items[j][2])
        before.append(wait < matmul)
    assert before == [True, True, True, False, False]
    # rank 1 receives with irecv, runs a matmul, then waits: needed after it (the fake world's zeros in its receive
    # buffer, counted as the job's until 2026-12-08, read it at once)
    items = WorkLog.read(tmp_path / "t" / "work" / "rank1.json").items
    ledger = [CommEvent.from_json(json.loads(line)) for line in
              (tmp_path / "t" / "ledgers" / "rank1.jsonl").read_text().splitlines()]
    (k,) = [k for k, item in enumerate(items) if item[0] == "i" and ledger[item[1]].step == 2
            and ledger[item[1]].op == "recv"]
    wait = next(j for j in range(k, len(items)) if items[j][:2] == ["w", items[k][1]])
    matmul = next(j for j in range(k, len(items)) if items[j][0] == "c" and items[j][2])
    assert matmul < wait


def test_a_1f1b_pipeline_is_traced_stage_by_stage_and_its_stages_end_in_order(tmp_path):
    """tests/jobs/pipelining.py, 1F1B over 6 stages of the default group with 6 microbatches: a stage runs as many
    forwards before its first backward as there are stages after it (torch 2.13 pipelining/schedules.py
    Schedule1F1B), so inner stages of one parity, one class of a plain trace, issue their calls in other orders: a
    forecast traces each stage, and none of its calls is timed without its partner. The last backward reaches stage
    0 last: each stage ends no earlier than the one after it, and the last one first."""
    proc = cli_here("forecast", "--fake-world", 6, "--cluster", "h100-sxm", "--out", tmp_path / "t", "--json", "--",
                    "tests/jobs/pipelining.py", "--schedule", "1f1b", "--microbatches", 6, "--batch", 12, "--steps", 3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert [c["rank"] for c in doc["classes"]] == list(range(6))
    assert not [note for note in doc["notes"] if "without a partner" in note]
    ends = [c["step_s"] for c in doc["classes"]]
    assert all(a >= b for a, b in zip(ends, ends[1:])) and ends[0] > ends[-1], ends


@pytest.mark.parametrize("tensors", ["--real-tensors", "--fake-tensors"])
def test_a_moe_whose_routing_sizes_its_calls_is_forecast_at_its_tokens(tmp_path, tensors):
    """tests/jobs/moe_a2a.py at world 4 (one Linear(16, 16) expert per rank; every rank sends [14, 2, 2, 2]
    tokens, so expert 0 gets 56 and the others 8: the job's docstring): its routing counts tokens with
    ``bincount`` and reads the counts back to size its all-to-alls; each class's FLOPs are its expert's forward,
    input gradient and weight gradient at the tokens it received, 3 x 2 x tokens x 16 x 16. With fake tensors
    too: the routing follows from the job's own numbers (trace/fake/known.py), the counts' exchange from every
    member routing as this rank does, as every rank here does."""
    proc = cli_here("forecast", "--fake-world", 4, tensors, "--cluster", "h100-sxm", "--out", tmp_path / "t",
                    "--json", "--", "tests/jobs/moe_a2a.py", "--steps", 5)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    flops = {c["ranks"]: c["flops"] for c in doc["classes"]}
    assert flops == {1: {"float32": 3 * 2 * 56 * 16 * 16}, 3: {"float32": 3 * 2 * 8 * 16 * 16}}
    for cls in doc["classes"]:
        (axis,) = cls["axes"]
        assert axis["calls"] == 5  # counts, dispatch, combine, and the two backward all-to-alls
        # each call's larger side: the 4 int64 counts, then 4 token exchanges of 64 B a token, at the 56 tokens
        # rank 0 receives, or the 20 every other rank sends
        assert axis["bytes"] == 4 * 8 + 4 * 64 * (56 if cls["ranks"] == 1 else 20)
    proc = cli_here("forecast", "--fake-world", 4, "--real-tensors", "--fake-tensors", "--cluster", "h100-sxm",
                    "--", "tests/jobs/moe_a2a.py")
    assert proc.returncode == 2 and "--real-tensors" in proc.stderr and proc.stderr.count("\n") == 1


def test_grouped_query_attention_counts_each_query_head_over_its_groups_keys():
    """A GPU's SDPA kernel takes grouped-query attention as it is (key and value with 8 heads for the query's
    32: Llama 3 8B's, ``enable_gqa``), and torch's FLOP formula refuses those shapes (torch 2.11 on an H100
    under --measure-on cuda: "query/key/value shapes are incompatible"); the work counter's formula is torch's
    own on key and value repeated to the query's heads, forward and backward."""
    from meshscope.capture.work import _flop_formulas

    formulas, aten = _flop_formulas(), torch.ops.aten
    meta = {"device": "meta", "dtype": torch.bfloat16}
    q, k = torch.empty(1, 32, 1024, 128, **meta), torch.empty(1, 8, 1024, 128, **meta)
    repeated = torch.empty(1, 32, 1024, 128, **meta)
    forward = formulas[aten._scaled_dot_product_flash_attention.default]
    assert forward(q, k, k, 0.0, True, out_val=None) == forward(q, repeated, repeated, 0.0, True, out_val=None) > 0
    backward = formulas[aten._scaled_dot_product_efficient_attention_backward.default]
    args = (q, q, k, k, None, q, torch.empty(1, 32, 1024, **meta), None, None, 0.0, (True, True, True, False))
    same = (q, q, repeated, repeated, *args[4:])
    assert backward(*args, out_val=None) == backward(*same, out_val=None) > 0


# Real tensors at width 256: this CPU computes bf16 matmuls without bf16 units, 28 s a step at 1,024. (Fewer tokens
# would not do: the peak would move past backward, to where the gradients outweigh the activations.)
@pytest.mark.parametrize("tensors, dim", [("--fake-tensors", 1024), ("--real-tensors", 256)])
def test_rms_norm_keeps_what_cudas_fused_kernel_keeps(tmp_path, tensors, dim):
    """tests/jobs/norms.py: 4 blocks of RMSNorm(D) then Linear(D, D), bf16, 2,048 tokens. On a GPU ``rms_norm`` is
    one kernel (``_fused_rms_norm``) whose autograd node keeps its input and one fp32 reciprocal RMS per row, so a
    block keeps for backward its norm's input, the norm's output (the Linear's input) and 2,048 fp32: by hand
    4 x (2 x 2,048 x 2 D + 8 KiB), less the first block's input (made before forward); by the peak, early in
    backward, one activation may be gone. At D = 1,024 the CPU's composite kept 71.3 MB. With real tensors the CPU
    computes the fused op by torch's decompositions."""
    proc = cli_here("forecast", "--fake-world", 2, tensors, "--cluster", "h100-sxm", "--out", tmp_path / "t", "--json",
                    "--", "tests/jobs/norms.py", "--dim", dim)
    assert proc.returncode == 0, proc.stderr[-2000:]
    forward = json.loads(proc.stdout)["classes"][0]["peak_at"]["by_phase"]["forward"]
    activation, rstd = 2048 * dim * 2, 2048 * 4
    kept = 4 * (2 * activation + rstd) - activation
    assert kept - activation <= forward <= kept


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2s_gathered_parameters_count_until_it_frees_them(tmp_path, reshard):
    """tests/jobs/fsdp2.py, 8 blocks of Linear(2048, 4096) and Linear(4096, 2048) (16.8 M fp32 parameters, 67.1 MB
    gathered each) and a root unit of two Linear(2048, 2048) (33.6 MB): FSDP2 frees a block's gathered parameters
    after its forward by resizing their storage to 0 (unless told not to reshard), below every dispatch mode.
    Resharded, what forward made and the peak still holds is the root's parameters and a few activations (a batch
    of 8 x 2048 fp32 is 64 KiB); not resharded, every block's parameters too, at the last block's forward, and at
    most two blocks' all-gather outputs still held (FSDP2 frees a unit's when the next unit's gather is waited
    for, and the peak is at the last: its own and the one before)."""
    args = ["--hidden", 2048, "--blocks", 8, *([] if reshard else ["--no-reshard-after-forward"])]
    proc = cli_here("forecast", "--fake-world", 4, "--fake-tensors", "--cluster", "h100-sxm", "--out", tmp_path / "t",
                    "--json", "--", "tests/jobs/fsdp2.py", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    forward = json.loads(proc.stdout)["classes"][0]["peak_at"]["by_phase"]["forward"]
    block, root = 4 * (2 * 2048 * 4096 + 4096 + 2048), 4 * 2 * (2048 * 2048 + 2048)
    if reshard:
        assert root <= forward < root + 2**21
    else:
        assert 8 * block + root <= forward < 8 * block + root + 2 * block + 2**21


def test_fsdp2s_cpu_offload_keeps_its_sharded_state_off_the_gpu(tmp_path):
    """tests/jobs/fsdp2.py at world 4 (8 blocks of hidden 2048 and the root: 570.6 MB of fp32 parameters, a
    142.7 MB shard per rank) under AdamW, with and without fully_shard's CPUOffloadPolicy: offloaded, each rank's
    parameter shard (``.cpu()``, pinned), its gradients (copied to the host) and AdamW's two moments (made from
    the parameters) live in the host's memory, so the GPU's peak holds none of them: what the set-up made is the
    batch (two 8 x 2048 fp32 tensors, 128 KiB), what the optimizer made its step counts, and the peak is the plain
    job's less at least the parameters' and the moments' three shards. The optimizer step is the host's work:
    torch 2.13's single-tensor AdamW (optim/adam.py ``_single_tensor_adam``, what it runs on host tensors) reads and
    writes 84 bytes a parameter (weight decay's ``mul_`` 8, ``lerp_`` 12, ``mul_`` 8, ``addcmul_`` 16, ``sqrt``
    8, ``div`` 8, ``add_`` 8, ``addcdiv_`` 16), timed at the spec's host rate."""
    shard = 4 * (8 * (2 * 2048 * 4096 + 4096 + 2048) + 2 * (2048 * 2048 + 2048)) // 4
    peaks = {}
    for offload in (False, True):
        proc = cli_here("forecast", "--fake-world", 4, "--fake-tensors", "--cluster", "h100-sxm", "--out",
                        tmp_path / f"t{offload}", "--json", "--", "tests/jobs/fsdp2.py", "--hidden", 2048, "--blocks",
                        8, *(["--cpu-offload"] if offload else []))
        assert proc.returncode == 0, proc.stderr[-2000:]
        peaks[offload] = json.loads(proc.stdout)["classes"][0]
    plain, offloaded = peaks[False], peaks[True]
    assert plain["peak_at"]["by_phase"]["other"] >= shard
    assert plain["peak_at"]["by_phase"]["optimizer"] >= 2 * shard
    assert offloaded["peak_at"]["by_phase"]["other"] <= 2 * 8 * 2048 * 4 + 1024
    assert offloaded["peak_at"]["by_phase"].get("optimizer", 0) <= 1024
    assert offloaded["peak_bytes"] <= plain["peak_bytes"] - 3 * shard
    from meshscope.forecast.cluster import SHIPPED

    assert "host" not in plain["compute_by_kind"]
    host_s = offloaded["compute_by_kind"]["host"]
    assert host_s * SHIPPED["h100-sxm"].gpu.host_bandwidth == pytest.approx(84 * shard // 4, rel=1e-6)
    assert offloaded["compute_by_phase"]["optimizer"] == pytest.approx(host_s)
