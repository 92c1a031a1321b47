"""In one process (gloo, world 1): bench_trace.py's DDP step (its `build_ddp`: 8 x Linear(512, 512), 1 MiB
buckets, batch 64, SGD) with no recorder, and with the C++ recorder's kernels installed, active or not;
rounds interleaved in a random order, medians of the per-step wall time over 8 steps a sample.

A diagnosis, not a figure of the trace's cost (that is bench_trace.py's): one process has none of the
launcher, flusher or second rank, so what the kernel itself adds to a DDP step shows alone.

Run: PYTHONPATH=src python benchmarks/diag_native_ddp.py [--rounds 30] [--inactive]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--inactive", action="store_true", help="kernels installed but not recording")
    args = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29613"), RANK="0",
                      WORLD_SIZE="1")
    import torch
    import torch.distributed as dist
    from bench_trace import build_ddp

    from meshscope.capture import native
    from meshscope.capture.job_context import JobContext
    from meshscope.capture.native import NativeRecorder

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    native.build(log=print)
    module = native.load()
    step, _, _ = build_ddp(0)
    context = JobContext(None, modules=False)
    times: dict[str, list[float]] = {"none": [], "recorder": []}
    for rnd in range(args.rounds + 1):  # round 0: warm-up, discarded
        for mode in random.Random(rnd).sample(list(times), 2):
            recorder = NativeRecorder(module, context).__enter__() if mode == "recorder" else None
            if recorder is not None and args.inactive:
                module.set_active(False)
            step()
            t0 = time.perf_counter()
            for _ in range(8):
                step()
            t = (time.perf_counter() - t0) / 8
            if recorder is not None:
                recorder.__exit__()
                native.uninstall()
                recorder.drain()
                recorder.completions()
            if rnd:
                times[mode].append(t)
    base = statistics.median(times["none"])
    for mode, ts in times.items():
        print(f"{mode:9s} {statistics.median(ts) * 1e3:8.3f} ms per step  {(statistics.median(ts) - base) * 1e6:+8.0f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
