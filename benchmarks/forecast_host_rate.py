"""The rate a rank's host-side ops move the bytes the forecast counts for them (``GpuSpec.host_bandwidth``).

FSDP2's CPU offload (``CPUOffloadPolicy``) runs the optimizer step on the host, on the sharded parameters,
gradients and moments kept there (docs/forecast.md). This times torch's AdamW on CPU tensors (the single-tensor
loop torch picks for them; foreach and fused run only on accelerators, torch 2.13 optim/optimizer.py
``_default_to_fused_or_foreach``) at a given number of intra-op threads (torchrun sets ``OMP_NUM_THREADS=1``
for each rank where it starts more than one per node, torch 2.13 distributed/run.py), and divides the bytes
`meshscope.capture.work.WorkCounter` counts for one step on the host by the step's measured seconds (and the
elements, for comparison: a GPU host's Xeon moved about as many bytes a second in bf16 as in fp32, this project's
2-core box about as many elements).

Run: python benchmarks/forecast_host_rate.py [--elements 67108864] [--tensors 8] [--threads 1,2] [--steps 5]
[--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from types import SimpleNamespace

import torch

from meshscope.capture.work import HOST_WORK, CountingMode, WorkCounter


def counted_bytes(opt: torch.optim.Optimizer) -> int:
    """The bytes one ``opt.step()`` on the host reads and writes, as the forecast's work counter counts them."""
    context = SimpleNamespace(step=0, phase=lambda: "optimizer", region=lambda: "")
    counter = WorkCounter(0, context, on_host=lambda storage: True)
    with CountingMode(counter, lambda: 0):
        opt.step()
    return sum(item[2] for item in counter.finish().items if item[0] == HOST_WORK)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--elements", type=int, default=64 * 2**20, help="fp32 parameters in all")
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    params = [torch.nn.Parameter(torch.randn(args.elements // args.tensors, dtype=dtype)) for _ in range(args.tensors)]
    for param in params:
        param.grad = torch.randn_like(param)
    opt = torch.optim.AdamW(params, lr=1e-4)
    opt.step()  # the moments are made in the first step
    nbytes = counted_bytes(opt)
    elements = nbytes // params[0].element_size()
    print(f"{platform.node()} ({platform.processor() or platform.machine()}), torch {torch.__version__}: AdamW over "
          f"{args.elements:,} {args.dtype} parameters in {args.tensors} tensors, {elements / 1e9:.2f} G elements "
          f"({nbytes / 1e9:.2f} GB) counted per step")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        seconds = []
        for _ in range(args.steps):
            start = time.perf_counter()
            opt.step()
            seconds.append(time.perf_counter() - start)
        s = statistics.median(seconds)
        print(f"threads {threads}: step median {s * 1e3:.1f} ms (min {min(seconds) * 1e3:.1f}, max "
              f"{max(seconds) * 1e3:.1f}), {elements / s / 1e9:.2f} G elements/s, {nbytes / s / 1e9:.2f} GB/s counted",
              flush=True)


if __name__ == "__main__":
    main()
