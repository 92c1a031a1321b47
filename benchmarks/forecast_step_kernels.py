"""Where a real step's GPU time goes, by the roofline's classes of op: matmuls, fused attention, everything else
(memory-bound), and the GPU idle between kernels. The forecast's roofline times each class from the work it
counted (forecast/compute.py); set beside this, each class's measured time gives the rate that class really ran
at over a whole step, and the idle time is what no class holds (docs/forecast.md, "Compute on one H100").

On a machine with a CUDA GPU, for each config of benchmarks/forecast_llama_layers.py's Llama 3 8B blocks (or with
``--model moe`` forecast_moe_layers.py's Qwen3 30B-A3B blocks, ``moe-torchtitan`` the same with torchtitan's
permutation; bf16, AdamW, DDP over a world of 1 on NCCL) it runs 4
steps (forecast_llama_layers.py's ``step``), then profiles one step with torch.profiler (CUDA activity) and sums its
kernels' time per class by kernel name. Prints, per config: the step (CUDA events), the GPU's busy time, each
class's kernel time and count, and the ten longest kernels of the memory-bound class.

Run: python benchmarks/forecast_step_kernels.py [--model llama|moe|moe-torchtitan] [--configs 4x1x8192,8x1x8192,...] (blocks x batch
x seq) [--compile] (each block torch.compile'd: inductor's fused kernels fall in the memory-bound class).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import forecast_llama_layers  # noqa: E402
import forecast_moe_layers  # noqa: E402
from forecast_llama_layers import step  # noqa: E402

MODELS = {"llama": (forecast_llama_layers.llama, 4096), "moe": (forecast_moe_layers.qwen3_moe, 2048),
          "moe-torchtitan": (functools.partial(forecast_moe_layers.qwen3_moe, permutation="torchtitan"), 2048)}
"""A model's blocks and their width."""

ATTENTION = ("flash", "fmha", "sdpa", "attention")
MATMUL = ("gemm", "cutlass", "xmma", "nvjet", "cublas")


def kernel_class(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ATTENTION):
        return "attention"
    if any(k in low for k in MATMUL):
        return "matmul"
    return "memory-bound"


def random_input(batch: int, seq: int, dim: int) -> torch.Tensor:
    return torch.randn(batch, seq, dim, device="cuda", dtype=torch.bfloat16)


def profile_config(stack, dim: int, layers: int, batch: int, seq: int, compile_blocks: bool = False) -> None:
    from torch.profiler import ProfilerActivity, profile

    blocks = stack(layers, seq).to("cuda", torch.bfloat16)
    if compile_blocks:
        forecast_llama_layers.compiled(blocks.blocks)
    model = nn.parallel.DistributedDataParallel(blocks, device_ids=[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(4):
        step(model, opt, random_input(batch, seq, dim))
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start.record()
        step(model, opt, random_input(batch, seq, dim))
        end.record()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_class, count, per_name = collections.Counter(), collections.Counter(), collections.Counter()
    spans = []
    for e in kernels:
        us, which = e.time_range.elapsed_us(), kernel_class(e.name)
        per_class[which] += us
        count[which] += 1
        if which == "memory-bound":
            per_name[e.name[:90]] += us
        spans.append((e.time_range.start, e.time_range.end))
    busy, reach = 0, None
    for a, b in sorted(spans):  # union of the kernels' intervals: the GPU's busy time
        if reach is None or a > reach:
            busy += b - a
            reach = b
        elif b > reach:
            busy += b - reach
            reach = b
    print(f"config {layers}x{batch}x{seq}: step {start.elapsed_time(end):.2f} ms (CUDA events, profiled), kernels "
          f"busy {busy / 1e3:.2f} ms; " + "; ".join(f"{c} {per_class[c] / 1e3:.2f} ms in {count[c]} kernels"
                                                    for c in ("matmul", "attention", "memory-bound")), flush=True)
    for name, us in per_name.most_common(10):
        print(f"  memory-bound {us / 1e3:8.2f} ms  {name}", flush=True)
    del model, opt
    torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="llama")
    p.add_argument("--configs", default="4x1x8192,8x1x8192,4x2x8192,8x1x4096,8x4x2048")
    p.add_argument("--compile", action="store_true", help="each block torch.compile'd (inductor's kernels)")
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for config in args.configs.split(","):
        layers, batch, seq = (int(v) for v in config.split("x"))
        profile_config(*MODELS[args.model], layers, batch, seq, args.compile)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
