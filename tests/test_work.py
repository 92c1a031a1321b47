"""What a ``--work`` rank counts (`capture.work`), in-process on a two-layer MLP under FakeTensorMode: FLOPs by
hand from the layers' shapes, the first use of an all-reduced gradient, the step marks, and the memory held."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from meshscope.capture.dispatch import ModeRecorder
from meshscope.capture.job_context import JobContext
from meshscope.capture.work import WorkCounter

B, D, H, O = 16, 64, 128, 32


@pytest.fixture
def fake_pg():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield
    dist.destroy_process_group()


def _train(steps: int, meta_first: bool = False):
    """Two steps of Linear(D, H) -> ReLU -> Linear(H, O) (no biases, fp32), the first layer's gradient all-reduced
    after backward, SGD: returns the counter's log. With `meta_first`, a model of 64 MiB is built on the meta
    device first and kept alive throughout (torchtitan builds its model there, then shards it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    context = JobContext()
    context.install()
    calls = []

    def sink(*call):
        calls.append(call[0])
        return len(calls) - 1

    counter = WorkCounter(0, context)
    try:
        with FakeTensorMode(), ModeRecorder(sink, None, counter):
            if meta_first:
                with torch.device("meta"):
                    on_meta = torch.nn.Linear(4096, 4096, bias=False)
                    on_meta(torch.empty(8, 4096))  # and runs on it
            model = torch.nn.Sequential(torch.nn.Linear(D, H, bias=False), torch.nn.ReLU(),
                                        torch.nn.Linear(H, O, bias=False))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(steps):
                model(torch.randn(B, D)).sum().backward()
                dist.all_reduce(model[0].weight.grad)
                opt.step()
                opt.zero_grad()
            torch.randn(1)  # an op after the last step: its mark is written when the next op runs
    finally:
        context.remove()
    return counter.finish(), calls


def test_a_step_counts_the_matmul_flops_of_its_shapes_and_marks_its_end(fake_pg):
    log, calls = _train(2)
    assert calls == ["all_reduce", "all_reduce"]
    assert [item[1] for item in log.items if item[0] == "s"] == [0, 1]
    first = log.items[: next(i for i, item in enumerate(log.items) if item[0] == "s")]
    flops = sum(f for item in first if item[0] == "c" for f in item[2].values())
    forward = 2 * B * D * H + 2 * B * H * O
    # backward: layer 2's input and weight gradients, layer 1's weight gradient (its input needs none)
    backward = 2 * B * O * H + 2 * O * B * H + 2 * H * B * D
    assert flops == forward + backward
    phases = {item[1] for item in first if item[0] == "c" and item[2]}
    assert phases == {"forward", "backward"}


def test_the_all_reduced_gradient_is_first_needed_by_the_optimizer(fake_pg):
    log, _ = _train(1)
    kinds = [item[0] if item[0] != "c" else f"c:{item[1]}" for item in log.items]
    issue, wait = kinds.index("i"), kinds.index("w")
    assert log.items[issue][1] == log.items[wait][1] == 0
    # between the issue and the wait nothing reads the gradient; the wait comes right before the optimizer's work
    assert issue < wait and kinds[wait + 1] == "c:optimizer"


def test_the_peak_holds_parameters_gradients_and_a_steps_activations(fake_pg):
    log, _ = _train(2)
    params = 4 * (D * H + H * O)
    activations = 4 * (B * D + 2 * B * H + B * O)  # the input, the hidden layer and its ReLU, the output
    assert 2 * params <= log.peak_bytes <= 2 * params + activations + 4 * (B * H + B * O)
    # made outside any module's forward: the model, and each step's input and loss (a few bytes)
    assert 0 <= log.peak_at["by_phase"]["other"] - params - 4 * B * D < 64


def test_a_model_built_on_the_meta_device_holds_and_moves_nothing(fake_pg):
    plain, _ = _train(2)
    log, _ = _train(2, meta_first=True)
    assert log.peak_bytes == plain.peak_bytes
    assert log.peak_at["by_phase"] == plain.peak_at["by_phase"]
    assert [item for item in log.items if item[0] == "c"] == [item for item in plain.items if item[0] == "c"]


def test_what_an_op_writes_in_place_is_read_from_its_schema():
    """A coalesced all-reduce returns only a Work (Megatron's DDP buckets): the tensors it writes come from its
    schema (``Tensor(a!)[] tensors``); a foreach op returns nothing, and still writes its list."""
    from meshscope.capture.work import written_positions

    assert written_positions(torch.ops.c10d.allreduce_coalesced_.default) == (0,)
    assert written_positions(torch.ops.c10d.alltoall_base_.default) == (0,)
    assert written_positions(torch.ops.aten._foreach_add_.Scalar) == (0,)
    assert written_positions(torch.ops.aten.add.Tensor) == () and written_positions(torch.ops.c10d.send.default) == ()


def test_a_foreach_update_counts_what_it_reads_and_writes_and_a_sparse_tensor_counts_its_parts():
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Context:
        step, phase, region = 0, staticmethod(lambda: "optimizer"), staticmethod(lambda: "")

    counter = WorkCounter(0, Context())
    with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
        params = [torch.zeros(256) for _ in range(4)]  # 1 KiB each
        counter._close()
        counter.log.items.clear()
        torch._foreach_add_(params, 1.0)
    (segment,) = [item for item in counter.finish().items if item[0] == "c"]
    assert segment[4] == 2 * 4 * 1024  # read and written
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,), check_invariants=True)
    from meshscope.capture.work import _tensors

    assert sum(t.nbytes for t in _tensors(sparse)) == 2 * 8 + 2 * 4  # int64 indices, float32 values


def test_a_bf16_gemm_accumulating_into_fp32_counts_its_flops_at_bf16():
    """Megatron's gradient-accumulation fusion adds grad_output^T @ input into the fp32 ``main_grad`` in the
    GEMM (``addmm`` with ``out_dtype``, torch 2.8 on; the ``mm.dtype`` overload too): torch's formula is called with
    the default overload's operands (their ``out_dtype`` had landed on ``out_shape``: a TypeError that stopped the
    rank), the FLOPs are bf16's (the operands', not the fp32 accumulator's), and the accumulator is read and
    written. By hand: 2 x 64 x 32 x 128 FLOPs; bytes 2 x 128 x 64 x 2 read, 64 x 32 x 4 read and written."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Context:
        step, phase, region = 0, staticmethod(lambda: "backward"), staticmethod(lambda: "")

    counter = WorkCounter(0, Context())
    with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
        grad_out, inputs = torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(128, 32, dtype=torch.bfloat16)
        main_grad = torch.zeros(64, 32)
        counter._close()
        counter.log.items.clear()
        torch.addmm(main_grad, grad_out.t(), inputs, out_dtype=torch.float32, out=main_grad)
        torch.mm(grad_out.t(), inputs, out_dtype=torch.float32)
    (segment,) = [item for item in counter.finish().items if item[0] == "c"]
    assert segment[2] == {"bfloat16": 2 * 2 * 64 * 32 * 128}
    operands = 128 * 64 * 2 + 128 * 32 * 2
    assert segment[3] == (operands + 2 * 64 * 32 * 4) + (operands + 64 * 32 * 4)
    assert segment[4] == 0


def test_an_overloads_flops_read_its_operands_by_name():
    """fp8 flash attention (``_scaled_dot_product_flash_attention.quantized``, torch 2.11 on) takes three descale
    tensors between value and ``dropout_p``, so its ``is_causal`` is the 8th operand where the default overload's
    is the 5th: a causal call counts half the FLOPs of a full one, as the default overload's does (by hand:
    4 x 8 heads x 1,024^2 x 128 for the forward, halved), and a full call does not read a descale as its flag."""
    from meshscope.capture.work import _flop_formulas

    formulas, aten = _flop_formulas(), torch.ops.aten
    if not hasattr(aten._scaled_dot_product_flash_attention, "quantized"):
        pytest.skip("this torch has no fp8 flash attention")
    q = torch.empty(1, 8, 1024, 128, device="meta", dtype=torch.float8_e4m3fn)
    descale = torch.ones(1, device="meta")
    fp8 = formulas[aten._scaled_dot_product_flash_attention.quantized]
    full = 4 * 8 * 1024 * 1024 * 128
    assert fp8(q, q, q, descale, descale, descale, 0.0, True, out_val=None) == full // 2
    assert fp8(q, q, q, descale, descale, descale, 0.0, False, out_val=None) == full
    assert fp8(q, q, q, descale, descale, descale, is_causal=True, out_val=None) == full // 2
    assert formulas[aten._scaled_dot_product_flash_attention.default](q, q, q, 0.0, True, out_val=None) == full // 2


def test_a_compiled_functions_elementwise_ops_count_as_one_fused_kernel():
    """Megatron's bias-GeLU (megatron/core/fusions/fused_bias_gelu.py, under its jit_fuser, torch.compile) run
    eagerly as a fake world runs compiled code: nine elementwise passes, counted as the one kernel inductor makes
    of them (`run_compiled`): its input and bias read, its result written. A matmul inside a region is a kernel of
    its own: what it reads is written out, and its result read back. A tensor from before the region updated in
    place counts as written. By hand, on 256 x 64 fp32 (64 KiB) and a 64-float bias (256 B)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshscope.capture.work import run_compiled

    class Context:
        step, phase, region = 0, staticmethod(lambda: "forward"), staticmethod(lambda: "")

    def bias_gelu(bias, y):
        x = bias + y
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    def project_then_scale(y, w, out):
        h = (y * 2) @ w  # the scaled input is written for the matmul, its result read back
        out.add_(h)  # and an outer tensor updated in place
        return h * 3

    def other_bytes(run) -> int:
        counter = WorkCounter(0, Context())
        with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
            y, bias, w, out = torch.zeros(256, 64), torch.zeros(64), torch.zeros(64, 64), torch.zeros(256, 64)
            counter._close()
            counter.log.items.clear()
            run(y, bias, w, out)
        return sum(item[4] for item in counter.finish().items if item[0] == "c")

    tensor, vector = 256 * 64 * 4, 64 * 4
    assert other_bytes(lambda y, b, w, out: run_compiled(bias_gelu, b, y)) == tensor + vector + tensor
    assert other_bytes(lambda y, b, w, out: bias_gelu(b, y)) > 9 * 2 * tensor  # eager: each pass reads and writes
    # y read and y * 2 written; h read once (its two consumers fuse); out read and written; h * 3 written
    assert other_bytes(lambda y, b, w, out: run_compiled(project_then_scale, y, w, out)) == 6 * tensor

    def saved(y, b, w, out):  # h is saved for backward (h * h's gradient), so written: y read, h and h * h written
        return run_compiled(lambda y: (lambda h: h * h)(y * 2), y.requires_grad_())

    assert other_bytes(saved) == 3 * tensor
    # a result in a dict is a result; a bare allocation moves nothing
    assert other_bytes(lambda y, b, w, out: run_compiled(lambda y: {"out": y + 1}, y)) == 2 * tensor
    assert other_bytes(lambda y, b, w, out: run_compiled(torch.empty_like, y)) == 0


def test_a_compiled_calls_backward_counts_as_its_fused_kernels():
    """AOTAutograd compiles a compiled call's backward as one graph too; a fake world runs it node by node. The
    ops of one call's nodes count as one fused kernel: (y * 2).exp()'s backward reads the incoming gradient and the
    saved result once and writes y's gradient, 3 tensors (256 x 64 fp32), where eagerly its two nodes move 5 (the
    product with the result written and read again). A node of anything else between two calls ends one region
    and is counted as it runs (the eager * 3: 2 tensors), and two calls in a row are two regions (each reads the
    gradient the other wrote)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshscope.capture.work import _next_node, run_compiled

    if _next_node is None:
        pytest.skip("this torch does not number autograd nodes (before 2.2)")

    class Context:
        step, phase, region = 0, staticmethod(lambda: "backward"), staticmethod(lambda: "")

    def tensors_moved(run) -> float:
        counter = WorkCounter(0, Context())
        with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
            y, grad = torch.zeros(256, 64, requires_grad=True), torch.zeros(256, 64)
            out = run(y)
            counter._close()
            counter.log.items.clear()
            out.backward(grad)
        return sum(item[4] for item in counter.finish().items if item[0] == "c") / (256 * 64 * 4)

    def f(y):
        return (y * 2).exp()

    assert tensors_moved(f) == 5
    assert tensors_moved(lambda y: run_compiled(f, y)) == 3
    assert tensors_moved(lambda y: run_compiled(f, run_compiled(f, y) * 3)) == 3 + 2 + 3
    assert tensors_moved(lambda y: run_compiled(f, run_compiled(f, y))) == 3 + 3

    # A parameter's gradient accumulates as soon as it is ready, between the call's nodes (AccumulateGrad, from the
    # second microbatch an add: its gradient and .grad read, .grad written): eager work beside the region, which
    # stays one. (y * w).exp(), w a parameter: the region reads the gradient, the saved result and y, and writes
    # w's gradient (4); eagerly its nodes move 6.
    def microbatches(run) -> list[float]:
        counter = WorkCounter(0, Context())
        moved = []
        with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
            y, grad = torch.zeros(256, 64), torch.zeros(256, 64)
            w, v = torch.zeros(256, 64, requires_grad=True), torch.zeros(256, 64, requires_grad=True)
            for _ in range(2):
                out = run(y, w, v)
                counter._close()
                counter.log.items.clear()
                out.backward(grad)
                counter._close()
                moved.append(sum(item[4] for item in counter.log.items if item[0] == "c") / (256 * 64 * 4))
        return moved

    def g(y, w, v):
        return (y * w).exp()

    assert microbatches(g) == [6, 6 + 3]
    assert microbatches(lambda *a: run_compiled(g, *a)) == [4, 4 + 3]

    # with a parameter whose gradient is ready between the call's nodes (v's, before w's), the second microbatch's
    # accumulation costs the fused backward no more than the eager one (the same adds): its region is not cut there
    def g2(y, w, v):
        return ((y * w).exp() * v).sin()

    eager, fused = microbatches(g2), microbatches(lambda *a: run_compiled(g2, *a))
    assert fused[0] < eager[0] and fused[1] - fused[0] <= eager[1] - eager[0]


def test_a_collective_in_compiled_code_splits_its_fused_kernels(fake_pg):
    """A collective inside a compiled function (tests/jobs/compiled.py all-reduces in its compiled forward) ends
    the segment before it, and the fused ops so far with it: x read and x * 2 written before the call, its result
    read and written after (256 x 64 fp32 each, 64 KiB)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshscope.capture.work import run_compiled

    class Context:
        step, phase, region = 0, staticmethod(lambda: "forward"), staticmethod(lambda: "")

    def reduced(x):
        h = x * 2
        dist.all_reduce(h)
        return h + 1

    counter = WorkCounter(0, Context())
    with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
        x = torch.zeros(256, 64)
        counter._close()
        counter.log.items.clear()
        run_compiled(reduced, x)
    segments = [item[4] for item in counter.finish().items if item[0] == "c"]
    assert segments == [2 * 256 * 64 * 4, 2 * 256 * 64 * 4]


def test_attention_kernels_flops_are_kept_apart_and_timed_at_attentions_rate():
    """A GPU's fused attention reaches about half the bf16 peak where a large matmul reaches 0.8
    (GpuSpec.attention_efficiency's source): the counter keys an SDPA kernel's FLOPs ``"bfloat16 attention"``,
    and the roofline times each key at its own rate. By hand: causal attention over 1 x 4 heads x 256 x 64 is
    2 matmuls of 2 x 4 x 256^2 x 64 FLOPs, halved; the projection 2 x 256 x 256 x 256."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshscope.forecast.cluster import SHIPPED
    from meshscope.forecast.compute import segment_seconds

    class Context:
        step, phase, region = 0, staticmethod(lambda: "forward"), staticmethod(lambda: "")

    counter = WorkCounter(0, Context())
    with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
        q = torch.zeros(1, 4, 256, 64, dtype=torch.bfloat16)
        x, w = torch.zeros(256, 256, dtype=torch.bfloat16), torch.zeros(256, 256, dtype=torch.bfloat16)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        x @ w
    (segment,) = [item for item in counter.finish().items if item[0] == "c"]
    attention, matmul = 2 * 2 * 4 * 256 * 256 * 64 // 2, 2 * 256 ** 3
    assert segment[2] == {"bfloat16 attention": attention, "bfloat16": matmul}
    gpu = SHIPPED["h100-sxm"].gpu
    assert (gpu.attention_efficiency, gpu.matmul_efficiency, gpu.memory_efficiency) == (0.45, 0.72, 0.78)
    flops_s = attention / (gpu.bf16_flops * 0.45) + matmul / (gpu.bf16_flops * 0.72)
    moved_s = segment[4] / (gpu.hbm_bandwidth * 0.78)
    assert segment_seconds(segment, gpu) == pytest.approx(max(flops_s, segment[3] / (gpu.hbm_bandwidth * 0.78)) + moved_s)


def test_a_segments_seconds_split_by_what_bounds_them():
    """`segment_terms` splits a segment's time into the classes a GPU profile's kernels fall in (matmul,
    attention, memory-bound), summing to `segment_seconds`; where the matmuls' bytes take longer than their
    FLOPs, the bytes' time is shared as the FLOPs' was. By hand, on a GPU of round figures."""
    from meshscope.forecast.cluster import GpuSpec
    from meshscope.forecast.compute import segment_seconds, segment_terms

    gpu = GpuSpec(name="round", bf16_flops=1e15, tf32_flops=5e14, fp32_flops=5e13, hbm_bandwidth=2e12,
                  hbm_bytes=80 << 30, matmul_efficiency=0.5, attention_efficiency=0.25, memory_efficiency=0.5)
    flops = {"bfloat16": 10**12, "bfloat16 attention": 10**12}  # 2 ms at 0.5 of 1e15, 4 ms at 0.25
    compute_bound = ["c", "forward", flops, 10**9, 3 * 10**9, 0]  # matmul bytes 1 ms at 1e12; others 3 ms
    assert segment_terms(compute_bound, gpu) == pytest.approx({"matmul": 2e-3, "attention": 4e-3,
                                                                "memory-bound": 3e-3})
    bytes_bound = ["c", "forward", flops, 12 * 10**9, 0, 0]  # 12 ms of bytes against 6 of FLOPs: twice each
    assert segment_terms(bytes_bound, gpu) == pytest.approx({"matmul": 4e-3, "attention": 8e-3})
    assert segment_seconds(bytes_bound, gpu) == pytest.approx(12e-3)
    assert segment_terms(["c", "backward", {}, 0, 0, 0, 7e-3], gpu) == {"measured": 7e-3}
    host = GpuSpec(name="round", bf16_flops=1e15, tf32_flops=5e14, fp32_flops=5e13, hbm_bandwidth=2e12,
                   hbm_bytes=80 << 30, host_bandwidth=2e9)
    assert segment_seconds(["h", "optimizer", 6 * 10**9], host) == pytest.approx(3.0)  # 6 GB at 2 GB/s


def test_ops_on_the_hosts_storages_are_the_hosts_work_and_hold_no_gpu_memory():
    """A job's host storages (CPU offload's; `on_host` names them) count no memory, and an op that writes only those
    is the host's work: a segment of its own kind (``"h"``), in program order with the GPU's, by hand. A 1 KiB fp32
    tensor on the GPU, a 4 KiB one on the host: ``add`` of two GPU tensors reads 2 KiB and writes 1 KiB on the GPU;
    ``mul_`` of the host's reads and writes 8 KiB on the host, ``_foreach_add_`` 8 KiB more; a copy from the GPU
    into the host's tensor is a transfer, no one's work; ``sub`` on the GPU after them is a segment of its own. A
    tensor made by no host call counts, and stays the GPU's even where `on_host` names it later."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Context:
        step, phase, region = 0, staticmethod(lambda: "optimizer"), staticmethod(lambda: "")

    host: set[int] = set()
    making = [False]  # as a fake world's call that puts its results on the host, until it marks them
    counter = WorkCounter(0, Context(), on_host=lambda storage: making[0] or storage._cdata in host)
    with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
        gpu = torch.zeros(256)
        making[0] = True
        on_host = torch.empty(1024)
        making[0] = False
        host.add(on_host.untyped_storage()._cdata)
        held = counter.log.peak_bytes
        also = torch.empty(1024)
        host.add(also.untyped_storage()._cdata)  # counted as the GPU's when made: it stays so
        counter._close()
        counter.log.items.clear()
        total = gpu + gpu
        on_host.mul_(2.0)
        torch._foreach_add_([on_host], 1.0)
        on_host[:256].copy_(gpu)
        torch._foreach_add_([also], 1.0)
        assert (total - gpu) is not None
    items = counter.finish().items
    assert [item[0] for item in items] == ["c", "h", "c"]
    assert items[0][4] == 3 * 1024 and items[1] == ["h", "optimizer", 4 * 4096]
    assert items[2][4] == 2 * 4096 + 3 * 1024  # the foreach on `also` (the GPU's), then sub
    assert held == 1024 and counter.log.peak_bytes == held + 4096 + 2 * 1024  # `also`, `total` and sub's result


@pytest.mark.parametrize("conf, reserved_mib", [("", 12 + 12 + 20), ("expandable_segments:True", 20 + 20)])
def test_reserved_bytes_are_the_storages_replayed_through_the_caching_allocator(monkeypatch, conf, reserved_mib):
    """By hand (capture/caching_allocator.py's rules): three 12 MiB tensors made one after another, the first two
    dropped before the next is made, take one block; a 12 MiB tensor made on a side stream cannot have it; an 8 MiB
    one beside the third cuts a 20 MiB segment. With expandable segments the first stream's 12 MiB maps a 20 MiB
    page whose other 8 MiB hold the 8 MiB tensor; the side stream maps a page of its own."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Context:
        step, phase, region = 0, staticmethod(lambda: "forward"), staticmethod(lambda: "block")

    monkeypatch.setenv("PYTORCH_ALLOC_CONF", conf)  # (set, it wins over PYTORCH_CUDA_ALLOC_CONF, even empty)
    stream = [None]
    counter = WorkCounter(0, Context(), current_stream=lambda: stream[0])
    with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
        for _ in range(2):
            dropped = torch.empty(3 << 20)  # fp32: 12 MiB
            del dropped
        kept = torch.empty(3 << 20)
        stream[0] = side = object()
        other = torch.empty(3 << 20)
        stream[0] = None
        small = torch.empty(2 << 20)  # 8 MiB, on the first stream
        assert side and kept is not None and other is not None and small is not None
    log = counter.finish()
    assert log.peak_bytes == 32 << 20
    assert log.reserved_bytes == reserved_mib << 20
    assert log.reserved_at == {"expandable_segments": bool(conf), "step": 0, "phase": "forward", "module": "block"}


def test_a_storage_dropped_between_two_ops_is_free_for_the_second(monkeypatch):
    """By hand (the allocator's defaults): a 12 MiB tensor takes a 12 MiB segment, a 4 MiB one a 20 MiB segment whose
    other 16 MiB stay cached. The first dropped, the next 12 MiB request is its block (the best fit), and a 16 MiB one
    the cached rest: 32 MiB reserved. Had the drop been seen late, the 12 MiB request would have cut the 16 MiB
    rest and the 16 MiB one a new segment (48 MiB)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Context:
        step, phase, region = 0, staticmethod(lambda: "forward"), staticmethod(lambda: "block")

    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "")  # the allocator's defaults, whatever the environment says
    counter = WorkCounter(0, Context())
    with FakeTensorMode(), ModeRecorder(lambda *call: 0, None, counter):
        first = torch.empty(3 << 20)  # fp32: 12 MiB
        small = torch.empty(1 << 20)
        del first
        again = torch.empty(3 << 20)
        rest = torch.empty(4 << 20)
        assert small is not None and again is not None and rest is not None
    log = counter.finish()
    assert log.peak_bytes == (4 + 12 + 16) << 20
    assert log.reserved_bytes == 32 << 20
