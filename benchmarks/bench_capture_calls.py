"""Per-call cost of recording a collective: bare, with a capture, with the flight log (and a profile).

One process, a one-rank NCCL group on GPU 0 (gloo on CPU with --cpu). Prints microseconds per
all_reduce (median of 7 interleaved rounds of 3000 calls), the recorder's own cost on a no-op entry
point, and the top of a cProfile of the captured calls.

Run: PYTHONPATH=src python3 benchmarks/bench_capture_calls.py [--cpu]
"""
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29555")
CPU = "--cpu" in sys.argv
if CPU:
    dist.init_process_group("gloo", rank=0, world_size=1)
else:
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
from meshscope.capture.flightlog import FlightLog
from meshscope.capture.recorder import Capture

x = torch.ones(4, device="cpu" if CPU else "cuda")
sync = (lambda: None) if CPU else torch.cuda.synchronize
N = 3000
fl = FlightLog(tempfile.mkdtemp(), 0)
modes = {"bare": contextlib.nullcontext, "capture": Capture, "flight log": fl.capture}
per_call = {m: [] for m in modes}
for _ in range(7):  # interleaved rounds, so that drift of the host hits every mode alike
    for mode, make in modes.items():
        with make():
            sync(); t = time.perf_counter()
            for _ in range(N): dist.all_reduce(x)
            sync(); per_call[mode].append((time.perf_counter() - t) / N * 1e6)
med = {m: statistics.median(v) for m, v in per_call.items()}
print(f"us per all_reduce (median of 7 interleaved rounds of {N}): bare {med['bare']:.1f}, "
      f"capture {med['capture'] - med['bare']:+.1f}, flight log {med['flight log'] - med['bare']:+.1f}")
# The recorder alone: a no-op entry point wrapped as the capture wraps all_reduce (no NCCL, no gloo),
# so the figure is the recording's own hot-path cost, free of the collective's noise.
from meshscope.capture.collective_calls import C10D
from meshscope.capture.recorder import _wrap_c10d


def noop(tensor, op=None, group=None, async_op=False): return None
recorded = _wrap_c10d(noop, C10D["all_reduce"])
def best_us(f, n=20000):
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): f(x)
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best
with Capture():
    print(f"recorder alone (no-op entry point, best of 5 x 20000): {best_us(recorded) - best_us(noop):.2f} us per call")
pr = cProfile.Profile()
with Capture():
    pr.enable()
    for _ in range(N): dist.all_reduce(x)
    pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
