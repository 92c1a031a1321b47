"""Megatron-core's GPTModel, unmodified, with its DDP, optimizer and RNG tracker, in a fake world
(tests/jobs/megatron_gpt.py: it needs CUDA, so no gloo run exists to compare with): 0.16.1 (CI, Python
3.11) and 0.19.2 (Python 3.12: the compat venv, benchmarks/bench_frameworks.py), each test only on the
release it reads. Oracle: the per-step counts its docstring reads from megatron-core's tensor_parallel
layers and mappings, as functions of the number of layers (read at 0.16.1; at 0.19.2 the same calls on
these paths: mappings.py, layers.py and cross_entropy.py differ in the expert and generalized-TP paths
only), and the gradient buffer's bytes counted by hand; at 0.19.2, every group its parallel_state.py
creates has its axis."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from .helpers import ROOT, cli, only_with, skip_unless_installed, trace_json
from .test_trace_rules import MEGATRON_CORE_0_19_2

skip_unless_installed("megatron.core")

JOB = ROOT / "tests" / "jobs" / "megatron_gpt.py"
L, H, HEADS, V, S, B = 2, 64, 4, 128, 16, 2
"""The job's defaults: layers, hidden, heads, vocab, sequence, micro batch."""


def params_per_rank(tp: int) -> int:
    """What one tp rank holds of GPTModel's parameters (the local spec: learned positions, untied
    output layer), counted from the layers' shapes: embedding V/tp x H, positions S x H; per layer a
    norm (2H), qkv (3H/tp x H + 3H/tp), proj (H x H/tp + H), a norm (2H), fc1 (4H/tp x H + 4H/tp),
    fc2 (H x 4H/tp + H); the final norm 2H; the output layer V/tp x H."""
    layer = 2 * H + (3 * H // tp) * (H + 1) + H * (H // tp) + H + 2 * H + (4 * H // tp) * (H + 1) + H * (4 * H // tp) + H
    return V // tp * H + S * H + L * layer + 2 * H + V // tp * H


def expected(tp: int, sp: bool) -> Counter:
    """One steady step of one rank, per (axis, phase, op): the job's docstring."""
    if sp:
        tp_calls = {("forward", "all_reduce"): 4, ("forward", "all_gather"): 2 * L + 1,
                    ("forward", "reduce_scatter"): 2 * L, ("backward", "all_gather"): 4 * L + 2,
                    ("backward", "reduce_scatter"): 2 * L + 1, ("other", "all_reduce"): 1}
    else:
        tp_calls = {("forward", "all_reduce"): 2 * L + 4, ("backward", "all_reduce"): 2 * L + 1}
    # DDP's one bucket on megatron's dp group with cp ("dp-cp"); ChainedOptimizer.step's grad norm
    # over the model-parallel group ("tp-pp"), clipping or not.
    return Counter({**{("tp", *k): n for k, n in tp_calls.items()},
                    ("dp-cp", "other", "all_reduce"): 1, ("tp-pp", "other", "all_reduce"): 1})


def steady_counts(doc: dict) -> dict[int, list[Counter]]:
    return {r["rank"]: [Counter((e["axis"], e["phase"], e["op"]) for e in s["events"]) for s in r["steps"][1:]]
            for r in doc["per_rank"]}


# sequence parallel is the frameworks subset's (bench_frameworks.py): CI keeps one Megatron case, plain TP
@pytest.mark.parametrize("sp", [False, pytest.param(True, marks=pytest.mark.frameworks)], ids=["tp", "tp_sp"])
@pytest.mark.parametrize("release", [
    pytest.param("0.16.1", marks=only_with("megatron-core", "0.16.1")),
    pytest.param("0.19.2", marks=[only_with("megatron-core", "0.19.2"), pytest.mark.frameworks])])
def test_gpt_model_in_a_fake_world_of_4(release, sp, tmp_path):
    """TP 2 x DP 2 with megatron-core's defaults (the _GLOO twins, its DDP and optimizer): every class
    (all 4 ranks) passes, and each steady step issues the counts of megatron's TP / SP rules."""
    flags = ["--sequence-parallel"] if sp else []
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 4, [str(JOB), *flags])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["fake_world"]["traced"] == [0, 1, 2, 3] and doc["layout"]["sizes"]["tp"] == 2
    for rank, steps in steady_counts(doc).items():
        assert steps == [expected(2, sp)] * 2, rank
    step = doc["per_rank"][0]["steps"][1]["events"]
    grads = [e for e in step if e["axis"] == "dp-cp"]
    assert [e["bytes_in"] for e in grads] == [4 * params_per_rank(2)]
    tp_forward = [e["bytes_in"] for e in step if e["axis"] == "tp" and e["phase"] == "forward"]
    # activations [S, B, H] fp32, a sequence shard of them under SP; the cross entropy's [S, B]
    full, shard, ce = 4 * S * B * H, 4 * S * B * H // 2, 4 * S * B
    if sp:
        assert tp_forward == [full] + [shard, full] * (2 * L) + [shard] + [ce] * 3
    else:
        assert tp_forward == [full] * (2 * L + 1) + [ce] * 3


JOB_1024 = [str(JOB), "--tp", 8, "--sequence-parallel", "--heads", 8, "--steps", 2]
"""TP 8 + SP at 1,024 ranks (dp 128): megatron needs as many heads as tp ranks."""


@pytest.fixture(scope="module")
def traced_1024(tmp_path_factory):
    """``trace(flags)``: the run directory and document of JOB_1024 at 1,024 ranks, --ranks auto, traced
    once per module; each trace is the setup time of the first test that asks for it (--durations)."""
    done = {}

    def trace(*flags):
        if flags not in done:
            out = tmp_path_factory.mktemp("megatron_1024")
            proc, doc = trace_json(out / "t", "--fake-world", 1024, "--nproc-per-node", 8, *flags, JOB_1024)
            assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
            done[flags] = out / "t", doc
        return done[flags]

    return trace


@pytest.fixture
def real_1024(traced_1024):
    return traced_1024()


@pytest.fixture
def fake_tensors_1024(traced_1024):
    return traced_1024("--fake-tensors")


@pytest.mark.frameworks
@pytest.mark.parametrize("release", [pytest.param("0.16.1", marks=only_with("megatron-core", "0.16.1")),
                                     pytest.param("0.19.2", marks=only_with("megatron-core", "0.19.2"))])
def test_gpt_model_at_1024_ranks(release, real_1024):
    """Real tensors: every class passes with the counts above at tp 8 (the target: at most 30 s)."""
    _, doc = real_1024
    assert doc["layout"]["sizes"]["tp"] == 8 and doc["layout"]["sizes"]["dp"] == 128
    assert len(doc["fake_world"]["classes"]) == 4  # its first member or not, on tp and on dp
    for rank, steps in steady_counts(doc).items():
        assert steps == [expected(8, True)], rank


@pytest.mark.frameworks
@pytest.mark.parametrize("release", [pytest.param("0.16.1", marks=only_with("megatron-core", "0.16.1")),
                                     pytest.param("0.19.2", marks=only_with("megatron-core", "0.19.2"))])
def test_gpt_model_at_1024_ranks_with_fake_tensors(release, real_1024, fake_tensors_1024):
    """--fake-tensors gives the real-tensor fake world's ledgers (meshscope diff: same; the bytes of the
    optimizer's all_gather_object left out on both sides, as stand-ins)."""
    same = cli("diff", real_1024[0], fake_tensors_1024[0], "--json")
    assert json.loads(same.stdout)["verdict"] == "same", same.stdout[-3000:]


OPTIONAL_0_19_2 = ("INTRA_PARTIAL_", "HIERARCHICAL_", "HYBRID_DP_CP_", "_GTP_REMAT", "_AG")
"""Parts of the group_desc of 0.19.2's groups behind an option the job leaves off, read from its
parallel_state.py's create_group calls (INTRA_PARTIAL_* needs num_distributed_optimizer_instances > 1,
*_GTP_REMAT a gtp_remat size > 1, HIERARCHICAL_* hierarchical context parallelism, HYBRID_DP_CP_* hybrid
dp-cp, *_AG a separate all-gather group)."""
CREATED_0_19_2 = {desc: axis for desc, axis in MEGATRON_CORE_0_19_2.items() if not any(p in desc for p in OPTIONAL_0_19_2)}
"""What initialize_model_parallel (megatron/core/parallel_state.py, 0.19.2) creates with the job's arguments."""


@only_with("megatron-core", "0.19.2")
@pytest.mark.frameworks
def test_every_group_0_19_2_creates_gets_its_axis(tmp_path):
    """The groups rank 0 saw created (every rank's, a global protocol) are those read from parallel_state.py,
    and each is labelled with the axis of the RankGenerator token it is built from."""
    from meshscope.core.axes import axis_of
    from meshscope.core.rundir import RunDir
    from meshscope.trace.assemble import created_groups

    proc, doc = trace_json(tmp_path / "t", "--fake-world", 4, "--ranks", "0", [str(JOB), "--steps", 1])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    descs = {desc for desc, _ in created_groups(RunDir(tmp_path / "t"))} - {"default_pg"}
    assert {desc: axis_of(desc) for desc in descs} == CREATED_0_19_2


def test_the_benchmarks_fused_kernel_stand_ins_compute_what_megatron_cores_torch_path_computes(monkeypatch):
    """benchmarks/megatron_fused_kernels.py stands one operator in for each of Megatron-LM's softmax and
    gradient-accumulation kernels (forecast_megatron_gpt.py's rows run them, as Megatron-LM does): through
    megatron-core's own FusedScaleMaskSoftmax, the fused path's probabilities and input gradients equal its torch
    path's (cast, scale, causal mask, softmax, cast back; autograd through them), and the GEMM's accumulation
    equals main_grad + grad_output^T @ input by hand."""
    import importlib.util
    import sys

    import torch
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType

    spec = importlib.util.spec_from_file_location("megatron_fused_kernels",
                                                  ROOT / "benchmarks" / "megatron_fused_kernels.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    names = ["scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda", "fused_weight_gradient_mlp_cuda"]
    for name in names:  # each stand-in leaves with the test
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    assert kernels.install() == names
    softmax = FusedScaleMaskSoftmax(input_in_fp16=False, input_in_bf16=True, attn_mask_type=AttnMaskType.causal,
                                    scaled_masked_softmax_fusion=True, mask_func=lambda x, m: x.masked_fill(m, -1e4),
                                    softmax_in_fp32=True, scale=0.125)
    seeded = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 8, 32, 32, dtype=torch.bfloat16, generator=seeded)
    # a block holds 8 rows of 32 keys (4 warps, two rows each): 8 heads fill it, 4 do not
    assert softmax.is_kernel_available(None, 1, 8, 32, 32) and not softmax.is_kernel_available(None, 1, 4, 32, 32)
    grad = torch.randn(scores.shape, dtype=torch.bfloat16, generator=seeded)
    fused_in, torch_in = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    future = torch.ones(32, 32, dtype=torch.bool).triu(1)  # get_default_causal_mask's, made on the CPU
    fused, unfused = softmax.forward_fused_softmax(fused_in, None), softmax.forward_torch_softmax(torch_in, future)
    (fused * grad).sum().backward()
    (unfused * grad).sum().backward()
    torch.testing.assert_close(fused, unfused)
    # the kernel differentiates from its saved bf16 output, autograd from the fp32 softmax's: a bf16 step apart
    torch.testing.assert_close(fused_in.grad, torch_in.grad, atol=2e-4, rtol=1.6e-2)

    g, x = torch.randn(16, 8, dtype=torch.bfloat16), torch.randn(16, 4, dtype=torch.bfloat16)
    main_grad = torch.randn(8, 4)
    by_hand = main_grad + g.float().t() @ x.float()
    sys.modules["fused_weight_gradient_mlp_cuda"].wgrad_gemm_accum_fp32(x, g, main_grad)
    torch.testing.assert_close(main_grad, by_hand)
