"""A script written for CUDA in a fake world on a machine without CUDA: every CUDA device is the CPU
(`trace.fake.devices`), torch.cuda and torch.accelerator answer as one GPU per local rank
(`trace.fake.cuda_api`) of the stand-in GPU (`trace.fake.gpu`), the ledger is what the script's own CPU
path issues, and what cannot be mapped is named in one line."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import meshscope
from meshscope.trace.fake import devices
from meshscope.trace.options import RankOptions

from .helpers import ROOT, cli_here, skip_unless_installed, trace_json

JOBS = ROOT / "tests" / "jobs"


def test_a_cuda_script_runs_mapped_to_the_cpu(tmp_path):
    """cuda_style.py takes its CUDA path (set_device, nccl with device_id, init_device_mesh("cuda"), .cuda(),
    DDP device_ids, FSDP2 on the mesh); per step it issues DDP's one bucket all-reduce and FSDP2's root
    all-gather and reduce-scatter, sized by hand from its two 32 x 32 fp32 weights over 4 ranks."""
    assert not torch.cuda.is_available()
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 4, "--ranks", "0,3", [JOBS / "cuda_style.py", "--steps", "2"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    note = next(n for n in doc["notes"] if "mapped every CUDA device to the CPU" in n)
    for call in ("torch.cuda.set_device", "DeviceMesh('cuda')", ".cuda()", "DDP device_ids", "device='cuda'"):
        assert call in note, note
    weight, world = 32 * 32 * 4, 4
    step = [("all_gather", "forward", weight // world, weight), ("all_reduce", "backward", weight, weight),
            ("reduce_scatter", "backward", weight, weight // world)]
    for rank in doc["per_rank"]:
        steps = {s["step"]: s["events"] for s in rank["steps"]}
        assert sorted(steps) == [0, 1]
        for events in steps.values():
            assert {(e["axis"], tuple(e["group"])) for e in events} == {("dp", (0, 1, 2, 3))}
            assert [(e["op"], e["phase"], e["bytes_in"], e["bytes_out"]) for e in events
                    if e["op"] != "broadcast" and e["phase"] != "other"] == step
        assert ("broadcast", weight) in [(e["op"], e["bytes_in"]) for e in steps[0] if e["phase"] == "other"]


def test_what_frameworks_ask_of_cuda_is_answered(tmp_path):
    """cuda_idioms.py on its accelerator path: the gate passes, every idiom is mapped (the note names it),
    the stand-in A100 answers its device queries with NVIDIA's figures (printed by the script), and the
    ledger is the docstring's hand count: DDP's set-up, then per step the custom Function's all-reduce of
    the 4 x 16 fp32 activation gradient (256 B) and DDP's bucket of the 16 x 16 weight (1,024 B)."""
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 4, "--ranks", "0,3", "--fake-device", "A100",
                           [JOBS / "cuda_idioms.py", "--steps", "2"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert "device: NVIDIA A100-SXM4-40GB 42298834944 8.0 108" in (tmp_path / "fake" / "logs" / "rank3.log").read_text()
    note = next(n for n in doc["notes"] if "mapped every CUDA device to the CPU" in n)
    for call in ("torch.accelerator.is_available", "torch.accelerator.device_count", ".to(ordinal)", "device=ordinal",
                 "torch.cuda.get_rng_state", "torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.Event",
                 "pin_memory", "torch.load to cuda", devices.COMPILED):
        assert call in note, note
    assert "torch.compile's regions ran on the CPU" in note
    device = doc["fake_world"]["device"]
    assert (device["key"], device["name"], device["total_memory"], device["major"], device["minor"],
            device["multi_processor_count"]) == ("A100", "NVIDIA A100-SXM4-40GB", 42298834944, 8, 0, 108)
    for call in ("get_device_name", "get_device_properties", "get_device_capability", "reset_peak_memory_stats",
                 "memory_stats", "max_memory_allocated"):
        assert f"torch.cuda.{call}" in device["answered"], device
    assert [r["device"] for r in doc["ranks"]] == ["A100", "A100"]
    assert any(n.startswith("stand-in GPU:") and "zeros" in n for n in doc["notes"]), doc["notes"]
    weight, activation = 16 * 16 * 4, 4 * 16 * 4
    for rank in doc["per_rank"]:
        steps = {s["step"]: [(e["op"], e["phase"], e["bytes_in"], e["bytes_out"]) for e in s["events"]]
                 for s in rank["steps"]}
        per_step = [("all_reduce", "backward", activation, activation), ("all_reduce", "backward", weight, weight)]
        assert steps == {0: [("all_gather", "other", 8, 32), ("broadcast", "other", 32, 32),
                             ("broadcast", "other", weight, weight), *per_step],
                         1: [("broadcast", "forward", 8, 8), ("broadcast", "forward", 4, 4), *per_step]}, steps


IDIOMS = r"""
import json, os, tempfile
os.environ.update(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
import torch
from torch import nn
from meshscope.trace.fake import patches
patches.apply({patches.CUDA_MAP})
gpu = torch.device("cuda", 1)  # torchtitan's and Lightning's device: cuda:LOCAL_RANK


class Gathered(torch.autograd.Function):  # Megatron-core 0.16.1's SP linear allocates its buffer in backward
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return torch.empty(grad.shape, device="cuda").copy_(grad)


def backward_on_cuda():
    x = torch.ones(3, device="cuda", requires_grad=True)
    Gathered.apply(x).sum().backward()
    return x.grad.device.type


def adam_on_cuda():
    model = nn.Linear(2, 2).to(gpu)
    opt = torch.optim.Adam(model.parameters())  # its step asks torch.cuda whether a graph is being captured
    model(torch.ones(1, 2, device=gpu)).sum().backward()
    opt.step()
    return model.weight.device.type


def load_to_cuda():
    path = os.path.join(tempfile.mkdtemp(), "snapshot.pt")
    torch.save({"w": torch.ones(2)}, path)
    return [torch.load(path, map_location=where)["w"].device.type for where in ("cuda:1", gpu)]


def record_stream():  # DeepSpeed 0.19.8 ZeRO-1/2's overlap_comm (stage_1_and_2.py:1531), ZeRO-3's parameter gather
    side = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    x.record_stream(side)
    x.record_stream(torch.cuda.current_stream())
    torch.ops.aten.record_stream(x, side)
    return x.device.type


def sharded_on_cuda():  # TorchRec 1.8.0's sharded tables: ShardedTensors of shards placed rank:R/cuda:L
    import torch.distributed as dist
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata, TensorProperties
    from torch.distributed._shard.sharded_tensor.utils import build_metadata_from_local_shards
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        placed = ["rank:0/cuda:0", "rank:1/cuda:1"]
        built = sharded_tensor.empty(ChunkShardingSpec(dim=0, placements=placed), 8, 4)  # its shard made on cuda:1
        shards = [ShardMetadata([0, 0], [4, 4], placed[0]), ShardMetadata([4, 0], [4, 4], placed[1])]
        local = [Shard(torch.zeros(4, 4, device=gpu), shards[1])]
        build_metadata_from_local_shards(local, torch.Size([8, 4]), 1, dist.group.WORLD)
        metadata = ShardedTensorMetadata(shards, torch.Size([8, 4]), TensorProperties(dtype=torch.float32))
        torchrec = ShardedTensor._init_from_local_shards_and_global_metadata(local, metadata)  # TorchRec's TBE
        return [[str(t.local_shards()[0].metadata.placement), t.local_shards()[0].tensor.device.type]
                for t in (built, torchrec)]
    finally:
        dist.destroy_process_group()


def half_matmuls_as_tensor_cores():  # every bf16 job's Linear layers: fp32 products and sums, one rounding
    from meshscope.trace.fake import devices

    torch.manual_seed(0)  # small integers: every sum exact in fp32, so the one rounding decides each value
    x, w = (torch.randint(-8, 9, shape, device=gpu).float() for shape in ((64, 512), (256, 512)))
    exact = x.double() @ w.double().T
    half = x.bfloat16().requires_grad_()
    y = nn.functional.linear(half, w.bfloat16())
    y.float().sum().backward()  # the input's gradient: ones(64, 256) @ w in bf16
    batched = torch.bmm(x.half().view(4, 16, 512), w.half().T.expand(4, 512, 256)).view(64, 256)
    return [y.device.type, y.dtype == torch.bfloat16, torch.equal(y, exact.bfloat16()),
            torch.equal(half.grad, w.bfloat16().double().sum(0).expand(64, 512).bfloat16()),
            torch.equal(batched, exact.half()), "bf16 and fp16 matmuls in fp32" in devices.used]


def sdpa_as_cudnn():  # torchtitan's grouped-query attention, bf16 and causal, against the CPU's in fp32
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, heads, 64, 32, device=gpu, dtype=torch.bfloat16, requires_grad=True)
               for heads in (8, 2, 2))
    y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    y.float().square().sum().backward()
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = nn.functional.scaled_dot_product_attention(ref[0], *(t.repeat_interleave(4, 1) for t in ref[1:]),
                                                       is_causal=True)
    want.square().sum().backward()
    errors = [((got.float() - exact).norm() / exact.norm()).item()
              for got, exact in ((y, want), *((t.grad, r.grad) for t, r in zip((q, k, v), ref)))]
    return [y.grad_fn.name(), y.device.type, k.grad.device.type, list(k.grad.shape), max(errors) < 0.01]


IDIOMS = {
    "bf16 and fp16 matmuls": half_matmuls_as_tensor_cores,
    "SDPA as cuDNN's": sdpa_as_cudnn,
    "accelerator gate": lambda: torch.accelerator.is_available() and torch.accelerator.device_count() >= 2,
    "model.to(local_rank)": lambda: nn.Linear(2, 2).to(1)(torch.ones(1, 2).to(1)).device.type,
    "device=current_device()": lambda: [torch.cuda.current_device(),
                                        torch.zeros(2, device=torch.cuda.current_device()).device.type],
    "torch.cuda.random.get_rng_state": lambda: torch.equal(torch.cuda.random.get_rng_state(), torch.get_rng_state()),
    "backward allocating on cuda": backward_on_cuda,
    "torch.load to cuda": load_to_cuda,
    "Adam step on cuda": adam_on_cuda,
    "get_device_capability": lambda: list(torch.cuda.get_device_capability(gpu)),
    "get_device_name": lambda: torch.cuda.get_device_name(gpu),
    "get_device_properties": lambda: torch.cuda.get_device_properties(gpu).total_memory,
    "reset_peak_memory_stats": lambda: torch.cuda.reset_peak_memory_stats(),
    "memory_stats": lambda: {k: torch.cuda.memory_stats(gpu)[k] for k in (  # what torchtitan reads of it
        "active_bytes.all.peak", "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms")},
    "record_stream": record_stream,
    "_shard placement on cuda": sharded_on_cuda,
}
answers = {}
for name, idiom in IDIOMS.items():
    try:
        answers[name] = ["answered", idiom()]
    except Exception as exc:  # noqa: BLE001 - each idiom fails alone, naming why
        answers[name] = ["failed", f"{type(exc).__name__}: {exc}".splitlines()[0]]
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def idioms():
    """What each idiom of `IDIOMS` got under the CUDA mapping alone, local rank 1 of 2 (one process)."""
    proc = subprocess.run([sys.executable, "-c", IDIOMS], check=False, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(Path(meshscope.__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


ANSWERS = [
    # every bf16 job's Linear layers, computed in fp32 and rounded once, as tensor cores sum (a CPU's own bf16
    # kernel took a hundred times fp32's time: 2 s a step of torchtitan's debug model)
    ("bf16 and fp16 matmuls", ["cuda", True, True, True, True, True]),
    # a Hopper GPU's choice, by the name torchtitan's selective checkpointing saves (its _op_sac_save_list), within
    # bf16's rounding of the CPU's fp32 attention, each key/value head's gradient summed over its 4 query heads
    ("SDPA as cuDNN's", ["ScaledDotProductCudnnAttentionBackward0", "cuda", "cuda", [2, 2, 64, 32], True]),
    ("accelerator gate", True),  # pytorch/examples' verify_min_gpu_count: both exit at once without it
    ("model.to(local_rank)", "cuda"),  # ddp-tutorial-series: model.to(self.gpu_id)
    ("device=current_device()", [1, "cuda"]),  # an int ordinal, 135 places in megatron-core 0.16.1
    ("torch.cuda.random.get_rng_state", True),  # Megatron's RNG tracker; the alias of torch.cuda.get_rng_state
    ("backward allocating on cuda", "cuda"),  # autograd's engine runs it, outside the script's frames
    ("torch.load to cuda", ["cuda", "cuda"]),  # pytorch/examples' snapshot, map_location="cuda:N"
    ("Adam step on cuda", "cuda"),  # torchtitan on a CUDA build of torch without a GPU (torch 2.15)
    ("get_device_capability", [9, 0]),  # Lightning's precision check, accelerator="cuda"
    ("get_device_name", "NVIDIA H100 80GB HBM3"),  # torchtitan's memory monitor (components/metrics.py:45-76)
    ("get_device_properties", 85_520_809_984),
    ("reset_peak_memory_stats", None),
    ("memory_stats", {"active_bytes.all.peak": 0, "reserved_bytes.all.peak": 0, "num_alloc_retries": 0, "num_ooms": 0}),
    ("record_stream", "cuda"),  # DeepSpeed ZeRO-1/2 with overlap_comm, ZeRO-3 (issue 42): a no-op, whatever the stream
    # ShardedTensor.__init__ and TorchRec's path: the placement as written, its shard a GPU's tensor (issue 42)
    ("_shard placement on cuda", [["rank:1/cuda:1", "cuda"], ["rank:1/cuda:1", "cuda"]]),
]
"""Each idiom of `IDIOMS` and its answer, with where a framework relies on it."""


@pytest.mark.parametrize("idiom, answer", ANSWERS, ids=[idiom for idiom, _ in ANSWERS])
def test_each_cuda_idiom_of_the_frameworks_is_answered_on_its_own(idioms, idiom, answer):
    """Issue 25's idioms (and issue 42's: record_stream, _shard placements) one by one, each with the answer a
    machine of one stand-in GPU (NVIDIA's H100, the default: capability 9.0, 85,520,809,984 B) per local rank
    gives, its tensors on the CPU: the whole-job test above stops at the first idiom that fails, these name each."""
    assert idioms[idiom] == ["answered", answer], idioms[idiom]


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch has the binding: the call runs")
def test_a_cuda_call_that_cannot_be_mapped_is_named(tmp_path):
    """torch.cuda.memory_snapshot reaches ``torch._C._cuda_memorySnapshot`` without torch.cuda's lazy init:
    a CPU build has no such binding (a raw AttributeError before); it is one line naming the call."""
    script = tmp_path / "unmapped.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('nccl')\n"
                      "x = torch.ones(4).cuda()\n"
                      "torch.cuda.memory_snapshot()\n")
    proc, doc = trace_json(tmp_path / "out", "--fake-world", 2, "--ranks", "0", [script])
    assert proc.returncode == 1 and not doc["passed"]
    error = next(r["error"] for r in doc["ranks"] if r["rank"] == 0)
    assert error.startswith("Unmapped: torch.cuda.memory_snapshot at unmapped.py:4 needs a CUDA device"), error


@pytest.mark.parametrize("args, needle", [
    (("--fake-world", 2, "--fake-device", "V100"), "--fake-device 'V100' is not a stand-in GPU: choose one of H200"),
    (("--fake-device", "H100"), "--fake-device needs --fake-world N"),
])
def test_a_bad_fake_device_is_one_line(args, needle, tmp_path):
    proc = cli_here("trace", *args, "--out", tmp_path / "x", "--", str(JOBS / "ddp.py"))
    assert proc.returncode == 2 and needle in proc.stderr and "H100 (NVIDIA H100 80GB HBM3, the default)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists(), proc.stderr


def test_the_stand_in_gpu_reaches_the_rank():
    options = RankOptions(run_dir=ROOT, target=("job.py",), fake=True, fake_device="H200")
    assert RankOptions.from_argv(options.to_argv()) == options


def test_dtensor_shards_the_cpu_flash_attention_as_cudas(tmp_path):
    """With CUDA mapped, F.scaled_dot_product_attention on DTensors picks the CPU's flash kernel; it is sharded
    by torch's rule for CUDA's flash kernel (torch 2.13 _matrix_ops.py:490-680: replicated, heads dim 1 or batch
    dim 0 for q, k, v, output, logsumexp), so inputs sharded on heads or batch stay so, forward and backward, with
    no collective, causal or not; a mask, which that rule does not cover, fails in one line."""
    script = tmp_path / "sdpa.py"
    script.write_text(SDPA)
    proc = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(Path(meshscope.__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["placements"] == [[d, causal, f"S({d})", f"S({d})", 0]
                                  for d in (1, 0) for causal in (False, True)], seen
    assert seen["mask"].startswith("DTensor (torch ") and "sdpa_kernel(SDPBackend.MATH)" in seen["mask"], seen


SDPA = '''
import json, os
os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
import torch, torch.distributed as dist, torch.nn.functional as F
from meshscope.trace.fake import patches
patches.apply({patches.CUDA_MAP})
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
from torch.distributed.tensor.debug import CommDebugMode
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
mesh = init_device_mesh("cuda", (2,))
seen = []
for dim in (1, 0):
    for causal in (False, True):
        q = distribute_tensor(torch.randn(2, 4, 8, 16, device="cuda"), mesh, [Shard(dim)]).requires_grad_()
        with CommDebugMode() as comms:
            out = F.scaled_dot_product_attention(q, q, q, is_causal=causal)
            out.sum().backward()
        seen.append([dim, causal, str(out.placements[0]), str(q.grad.placements[0]), comms.get_total_counts()])
mask = distribute_tensor(torch.zeros(8, 8, device="cuda"), mesh, [Replicate()])
try:
    F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    error = "no error"
except NotImplementedError as exc:
    from meshscope.trace.fake import attention
    error = attention.explain(exc, "sdpa.py:27")
print(json.dumps({"placements": seen, "mask": error}))
'''


def test_a_cuda_type_check_of_an_unmarked_tensor_is_explained(tmp_path):
    """Megatron-core's clip_grads.py:167 asserts ``param.grad.type() == 'torch.cuda.FloatTensor'``, which a marked
    tensor answers (tests/test_cuda_tensors.py); one the fake world could not mark (made in a thread the script
    started, or in C++ and handed over without a torch call) reads as the host's, and the rank's error says so in
    one line."""
    check = tmp_path / "clip_grads.py"
    check.write_text("def clip(grad):\n    assert grad.type() == 'torch.cuda.FloatTensor'\n")
    namespace = runpy.run_path(str(check))
    with pytest.raises(AssertionError) as raised:
        namespace["clip"](torch.ones(2))
    line = devices.explain(raised.value)
    assert line.startswith("the script checks for a CUDA tensor type at clip_grads.py:2 (assert grad.type() == "
                           "'torch.cuda.FloatTensor'), of a tensor the fake world could not tell stands for a CUDA "
                           "one"), line


def test_inductor_asks_triton_for_no_gpu_where_cuda_is_mapped(tmp_path):
    """With triton installed (torchtitan imports it; the test extra has it), the mapped CUDA made
    ``has_triton()`` true, and inductor's first compile asked triton's NVIDIA driver for its target
    ("libcuda.so cannot found!"): with CUDA mapped, torch.cuda is available and triton is not."""
    skip_unless_installed("triton")
    script = tmp_path / "triton_gate.py"
    script.write_text("import os\nos.environ.update(LOCAL_RANK='0', LOCAL_WORLD_SIZE='2')\nimport torch\n"
                      "from meshscope.trace.fake import patches\npatches.apply({patches.CUDA_MAP})\n"
                      "from torch.utils._triton import has_triton\nprint(torch.cuda.is_available(), has_triton())\n")
    proc = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(meshscope.__file__).parents[1])})
    assert proc.stdout.split() == ["True", "False"], proc.stderr[-3000:]


@pytest.mark.frameworks
def test_inductor_compiles_the_mapped_tensors_where_triton_is_installed(tmp_path):
    """The same, whole: compiled.py under inductor (its first compile, 20-25 s here with a cold cache)
    issues the 2 all-reduces a step of its docstring."""
    skip_unless_installed("triton")
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 2, "--ranks", "0",
                           [JOBS / "compiled.py", "--backend", "inductor", "--steps", "2"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert any("torch.compile's regions ran on the CPU" in n for n in doc["notes"]), doc["notes"]
    for step in doc["per_rank"][0]["steps"]:
        assert [(e["op"], e["phase"], e["bytes_in"]) for e in step["events"]] == [
            ("all_reduce", "forward", 256), ("all_reduce", "backward", 256)]


@pytest.mark.frameworks  # inductor compiles flex_attention (10 s warm, 30 s on a cold cache): bench_frameworks.py's
def test_compiled_code_flex_attention_and_cuda_graphs_where_cuda_is_mapped(tmp_path):
    """What torchtitan 0.3.0's llama3 asks of torch on torch 2.15 (a CUDA build without a GPU), in one process
    with CUDA mapped: Dynamo's current stream is the answered one (at 2.15 the compiled code fetched it from C++,
    which refused the CPU's: "cpu doesn't match the current accelerator cuda"); a compiled flex_attention runs
    forward and backward (torch refuses a CPU backward by the device alone, and inductor has none) with sdpa's
    causal values and gradients; ``torch.cuda.CUDAGraph()`` is one line naming it."""
    script = tmp_path / "flex.py"
    script.write_text(FLEX)
    proc = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(Path(meshscope.__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["stream"] == [True, True] and seen["out"] < 1e-5 and seen["grad"] < 1e-5, seen
    assert seen["graph"].startswith("torch.cuda.CUDAGraph at flex.py:"), seen
    assert "needs a CUDA device, which meshscope's fake world cannot map" in seen["graph"], seen


FLEX = '''
import json, os
os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
import torch, torch.nn.functional as F
from meshscope.trace.fake import patches
patches.apply({patches.CUDA_MAP})
from torch._dynamo import guards, utils
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

current = torch.accelerator.current_stream()
stream = [utils.get_current_stream(torch.device("cuda")) is current,
          guards.get_current_stream(torch.device("cuda")) is current]
mask = torch.compile(create_block_mask)(lambda b, h, q, kv: q >= kv, 1, None, 128, 128, device="cuda")
q = torch.randn(1, 2, 128, 16, device="cuda", requires_grad=True)
out = torch.compile(flex_attention)(q, q, q, block_mask=mask)
(grad,) = torch.autograd.grad(out.sum(), q)
ref = q.detach().requires_grad_()
expected = F.scaled_dot_product_attention(ref, ref, ref, is_causal=True)
(expected_grad,) = torch.autograd.grad(expected.sum(), ref)
try:
    torch.cuda.CUDAGraph()
    graph = "no error"
except RuntimeError as exc:
    graph = str(exc)
print(json.dumps({"stream": stream, "out": (out - expected).abs().max().item(),
                  "grad": (grad - expected_grad).abs().max().item(), "graph": graph}))
'''


def test_a_cuda_build_without_a_driver_is_explained(tmp_path):
    """torch 2.15+cu132 on a machine with no NVIDIA driver says "CUDA driver version is insufficient" where a
    call reaches the device: one line naming the script's line."""
    check = tmp_path / "graphs.py"
    check.write_text("def capture():\n    raise RuntimeError('CUDA error: CUDA driver version is insufficient for CUDA "
                     "runtime version')\n")
    namespace = runpy.run_path(str(check))
    with pytest.raises(RuntimeError) as raised:
        namespace["capture"]()
    line = devices.explain(raised.value)
    assert line.startswith("Unmapped: a CUDA call at graphs.py:2 needs a CUDA device"), line


@pytest.mark.parametrize("fake_tensors", [False, True], ids=["data", "fake_tensors"])
def test_flex_attention_trains_in_a_fake_world(fake_tensors, tmp_path):
    """A script's flex_attention on CUDA, forward and backward, then its input gradient all-reduced (hand
    count: one all_reduce of the 1 x 2 x 128 x 16 fp32 gradient, 16 KiB): with data, and under --fake-tensors,
    where the attention is a higher-order op that the recording dispatch mode passes through to FakeTensorMode."""
    script = tmp_path / "flex_job.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "from torch.nn.attention.flex_attention import create_block_mask, flex_attention\n"
                      "dist.init_process_group('nccl')\n"
                      "mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, None, 128, 128, device='cuda')\n"
                      "q = torch.randn(1, 2, 128, 16, device='cuda', requires_grad=True)\n"
                      "flex_attention(q, q, q, block_mask=mask).sum().backward()\n"
                      "dist.all_reduce(q.grad)\n")
    flags = ["--fake-tensors"] if fake_tensors else []
    proc, doc = trace_json(tmp_path / "out", "--fake-world", 2, "--ranks", "0", *flags, [script])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    events = [e for s in doc["per_rank"][0]["steps"] for e in s["events"]]
    assert [(e["op"], e["bytes_in"]) for e in events] == [("all_reduce", 4 * 2 * 128 * 16)], events
