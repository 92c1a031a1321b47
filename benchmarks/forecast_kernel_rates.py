"""The rates a GPU's kernels reach, against the cluster spec's peaks: the figures the forecast's roofline takes
per op kind (forecast/cluster.py, GpuSpec's efficiencies; docs/forecast.md).

On a machine with a CUDA GPU, each kernel is run at the shapes of Llama 3 8B blocks (dim 4096, 32 heads, 8 KV
heads, head dim 128, FFN 14336, bf16) and timed with CUDA events (the median of 20 runs after 5 warm-up runs):

- matmuls: 8192^3, and a block's projections at 8,192 tokens (FLOP/s, against the bf16 peak); MoE experts'
  ``torch._grouped_mm`` at Qwen3 30B-A3B's shapes under EP 8;
- ``scaled_dot_product_attention``, causal, grouped-query, forward and backward apart, at sequences of 2,048 to
  16,384 (FLOP/s by torch's formulas, halved for causal as the forecast counts it; the kernel torch chose is
  named from the profiler);
- ``rms_norm`` forward and backward at 8,192 x 4,096 (bytes its operands and results hold / time, against HBM);
- a large device-to-device copy (the same).

Run: python benchmarks/forecast_kernel_rates.py [--peak-bf16 989.4e12 --hbm 3.35e12] (H100 SXM's figures by
default; give an H200's or another GPU's). Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F


def timed(fn, runs: int = 20, warmup: int = 5) -> float:
    """Median seconds of `fn` on the current stream."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def kernel_names(fn) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = sorted({e.key for e in prof.key_averages() if "flash" in e.key.lower() or "fmha" in e.key.lower()
                    or "attention" in e.key.lower() or "cudnn" in e.key.lower()})
    return "; ".join(n[:60] for n in names) or "?"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peak-bf16", type=float, default=989.4e12)
    p.add_argument("--hbm", type=float, default=3.35e12)
    args = p.parse_args()
    dev = torch.device("cuda")
    bf16 = torch.bfloat16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, peak bf16 {args.peak_bf16 / 1e12:.1f} TFLOP/s, "
          f"HBM {args.hbm / 1e12:.2f} TB/s", flush=True)

    for m, k, n, what in ((8192, 8192, 8192, "8192^3"), (8192, 4096, 4096, "wq/wo"), (8192, 4096, 1024, "wk/wv"),
                          (8192, 4096, 14336, "w1/w3"), (8192, 14336, 4096, "w2")):
        a, b = torch.randn(m, k, device=dev, dtype=bf16), torch.randn(k, n, device=dev, dtype=bf16)
        s = timed(lambda: a @ b)
        rate = 2 * m * k * n / s
        print(f"matmul {what} {m}x{k}x{n}: {s * 1e3:.3f} ms, {rate / 1e12:.0f} TFLOP/s, "
              f"{rate / args.peak_bf16:.3f} of peak", flush=True)

    # MoE experts: torch._grouped_mm over 16 experts of a rank (Qwen3 30B-A3B under EP 8: dim 2048, expert FFN 768),
    # 8,192 rows each (4 x 4096 tokens x top 8 / 8 ranks / 16 experts, balanced), gate/up then down
    if hasattr(torch, "_grouped_mm"):
        experts, rows = 16, 8192
        offs = torch.arange(rows, rows * experts + 1, rows, device=dev, dtype=torch.int32)
        for k, n, what in ((2048, 768, "w1/w3"), (768, 2048, "w2")):
            a = torch.randn(rows * experts, k, device=dev, dtype=bf16)
            b = torch.randn(experts, n, k, device=dev, dtype=bf16).transpose(-2, -1)
            try:
                s = timed(lambda: torch._grouped_mm(a, b, offs=offs))
            except RuntimeError as e:
                print(f"grouped_mm {what}: {str(e).splitlines()[0]}", flush=True)
                continue
            rate = 2 * rows * experts * k * n / s
            print(f"grouped_mm {what} {experts} x {rows}x{k}x{n}: {s * 1e3:.3f} ms, {rate / 1e12:.0f} TFLOP/s, "
                  f"{rate / args.peak_bf16:.3f} of peak", flush=True)

    for seq in (2048, 4096, 8192, 16384):
        q = torch.randn(1, 32, seq, 128, device=dev, dtype=bf16, requires_grad=True)
        k = torch.randn(1, 8, seq, 128, device=dev, dtype=bf16, requires_grad=True)
        v = torch.randn(1, 8, seq, 128, device=dev, dtype=bf16, requires_grad=True)

        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        out = forward()
        grad = torch.randn_like(out)

        def backward():
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

        # torch's formulas (flop_counter.py): forward two matmuls of 2 s^2 d per head, backward five; causal halves
        # them, as the forecast counts (capture/work.py)
        fwd_flops = 2 * 2 * 32 * seq * seq * 128 // 2
        bwd_flops = 5 * fwd_flops // 2
        fwd_s, bwd_s = timed(forward), timed(backward)
        print(f"sdpa causal gqa 1x32x{seq}x128 (kv 8) forward: {fwd_s * 1e3:.3f} ms, {fwd_flops / fwd_s / 1e12:.0f} "
              f"TFLOP/s, {fwd_flops / fwd_s / args.peak_bf16:.3f} of peak; backward: {bwd_s * 1e3:.3f} ms, "
              f"{bwd_flops / bwd_s / 1e12:.0f} TFLOP/s, {bwd_flops / bwd_s / args.peak_bf16:.3f} of peak "
              f"[{kernel_names(forward)}]", flush=True)

    x = torch.randn(8192, 4096, device=dev, dtype=bf16, requires_grad=True)
    w = torch.ones(4096, device=dev, dtype=bf16, requires_grad=True)
    y = F.rms_norm(x, [4096], w)
    g = torch.randn_like(y)
    fwd_s = timed(lambda: F.rms_norm(x, [4096], w))
    bwd_s = timed(lambda: torch.autograd.grad(y, (x, w), g, retain_graph=True))
    moved_fwd = 2 * x.nbytes + 8192 * 4  # read x, write y and one fp32 per row
    moved_bwd = 3 * x.nbytes + 8192 * 4  # read dy and x (and the row's fp32), write dx
    print(f"rms_norm 8192x4096 forward: {fwd_s * 1e6:.1f} us, {moved_fwd / fwd_s / 1e12:.2f} TB/s, "
          f"{moved_fwd / fwd_s / args.hbm:.3f} of HBM; backward: {bwd_s * 1e6:.1f} us, {moved_bwd / bwd_s / 1e12:.2f} "
          f"TB/s, {moved_bwd / bwd_s / args.hbm:.3f} of HBM [{y.grad_fn.name()}]", flush=True)

    big = torch.empty(2**30, device=dev, dtype=torch.uint8)
    dst = torch.empty_like(big)
    s = timed(lambda: dst.copy_(big))
    print(f"copy 1 GiB: {s * 1e3:.3f} ms, {2 * big.nbytes / s / 1e12:.2f} TB/s, {2 * big.nbytes / s / args.hbm:.3f} "
          f"of HBM", flush=True)


if __name__ == "__main__":
    main()
