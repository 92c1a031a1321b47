"""Capture overhead on a TP-sized training step (the seed's MLP: B 128, D 512, H 1024, tp 2).

Launches 2 gloo ranks (or NCCL with --backend nccl) and times the same step with and without an
active Capture, interleaved (on, off, on, off...) so that drift hits both equally. Prints the median
step time of each and the overhead.

Run: python benchmarks/bench_capture.py [--iters 300] [--backend gloo|nccl]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def worker(iters: int, backend: str) -> None:
    import torch.distributed as dist

    from meshscope.capture import Capture
    from meshscope.collectives import AllReduceSum
    from meshscope.mesh import Layout
    from meshscope.runtime import RankContext

    ctx = RankContext.start(backend, 60, None)
    tp = ctx.mesh(Layout(ctx.world, tp=ctx.world))["tp"]
    g = torch.Generator().manual_seed(0)
    x_BD = torch.randn(128, 512, generator=g).to(ctx.device)
    w1_HD = torch.randn(1024 // tp.size, 512, generator=g).to(ctx.device).requires_grad_()
    w2_DH = torch.randn(512, 1024 // tp.size, generator=g).to(ctx.device).requires_grad_()

    def step():
        y_BD = AllReduceSum.apply(F.linear(F.gelu(F.linear(x_BD, w1_HD)), w2_DH), tp)
        (y_BD.square().mean() / tp.size).backward()
        ctx.synchronize()

    times = {True: [], False: []}
    for i in range(iters + 20):
        on = i % 2 == 0
        dist.barrier()
        start = time.perf_counter()
        if on:
            with Capture():
                step()
        else:
            step()
        if i >= 20:
            times[on].append(time.perf_counter() - start)
    if ctx.rank == 0:
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"backend {backend}, {ctx.world} ranks, {iters // 2} steps each: "
              f"median step without capture {off * 1e3:.3f} ms, with capture {on * 1e3:.3f} ms, "
              f"overhead {100 * (on / off - 1):+.2f} %")
    ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.iters, args.backend)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
           f"--iters={args.iters}", f"--backend={args.backend}", "--worker"]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    main()
