"""Capture overhead on a TP-sized training step (the chapter's MLP: B 128, D 512, H 1024, tp 2).

Launches 2 gloo ranks (or NCCL with --backend nccl) and times the same step in blocks of `--block`
steps, alternating: no capture / a Capture kept on for the block (how the one-step ledger and the
run-long flight log use it: entered once, not per step) / the flight log's capture (which also writes
a JSON line per call). Interleaving makes drift hit all three equally. Prints the median step time of
each and the overheads. A barrier precedes every step, and on GPU a device synchronise ends it.

Run: python benchmarks/bench_capture.py [--iters 600] [--block 20] [--backend gloo|nccl]
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def worker(iters: int, backend: str, block: int) -> None:
    import torch.distributed as dist

    from meshscope.capture.flightlog import FlightLog
    from meshscope.capture.recorder import Capture
    from meshscope.core.mesh import Layout
    from meshscope.models.collectives import AllReduceSum
    from meshscope.run.runtime import RankContext

    ctx = RankContext.start(backend, 60, None)
    tp = ctx.mesh(Layout(ctx.world, tp=ctx.world))["tp"]
    g = torch.Generator().manual_seed(0)
    x_BD = torch.randn(128, 512, generator=g).to(ctx.device)
    w1_HD = torch.randn(1024 // tp.size, 512, generator=g).to(ctx.device).requires_grad_()
    w2_DH = torch.randn(512, 1024 // tp.size, generator=g).to(ctx.device).requires_grad_()

    def step():
        """One step; returns host seconds of (forward, backward, synchronise)."""
        t0 = time.perf_counter()
        y_BD = AllReduceSum.apply(F.linear(F.gelu(F.linear(x_BD, w1_HD)), w2_DH), tp)
        loss = y_BD.square().mean() / tp.size
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        ctx.synchronize()
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    flight = FlightLog(tempfile.mkdtemp(), ctx.rank)
    modes = {"off": contextlib.nullcontext, "capture": Capture, "flight log": flight.capture}
    # prints: the median step per mode and, per mode, the medians of its forward / backward /
    # synchronise host times, which say where a recording's cost lands
    times = {m: [] for m in modes}
    parts = {m: [] for m in modes}
    calls = {}
    for i in range(iters // block):
        for mode, make in modes.items():
            with make() as cap:
                before = len(cap.events) if cap is not None else 0
                for j in range(block):
                    dist.barrier()
                    start = time.perf_counter()
                    split = step()
                    if i > 0:  # the first round of blocks is warmup
                        times[mode].append(time.perf_counter() - start)
                        parts[mode].append(split)
                if cap is not None:  # the barriers are recorded too: count what one step issued
                    calls[mode] = (len(cap.events) - before) / block - 1
    if ctx.rank == 0:
        med = {m: statistics.median(t) for m, t in times.items()}
        print(f"backend {backend}, {ctx.world} ranks, {len(times['off'])} steps per mode in blocks of {block}: "
              f"median step {med['off'] * 1e3:.3f} ms without capture; with a capture kept on "
              f"{med['capture'] * 1e3:.3f} ms ({100 * (med['capture'] / med['off'] - 1):+.2f} %); with the "
              f"flight log {med['flight log'] * 1e3:.3f} ms ({100 * (med['flight log'] / med['off'] - 1):+.2f} %)")
        for mode in modes:
            fwd, bwd, sync = (statistics.median(p[k] for p in parts[mode]) * 1e6 for k in range(3))
            recorded = f", {calls[mode]:.0f} recorded calls per step" if mode in calls else ""
            print(f"  {mode:10s} median host us: forward {fwd:7.1f}  backward {bwd:7.1f}  synchronise {sync:7.1f}{recorded}")
    ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=600, help="steps per mode, in blocks")
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.iters, args.backend, args.block)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
           f"--iters={args.iters}", f"--backend={args.backend}", f"--block={args.block}", "--worker"]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    main()
