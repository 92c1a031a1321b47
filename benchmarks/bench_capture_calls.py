"""Per-call cost of recording a collective: bare, with a capture, with the flight log (and a profile).

One process, a one-rank NCCL group on GPU 0 (gloo on CPU with --cpu). Prints microseconds per
all_reduce (best of 5 runs of 3000 calls) and the top of a cProfile of the captured calls.

Run: PYTHONPATH=src python3 benchmarks/bench_capture_calls.py [--cpu]
"""
import cProfile, pstats, sys, tempfile, time, os, torch, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29555")
CPU = "--cpu" in sys.argv
if CPU:
    dist.init_process_group("gloo", rank=0, world_size=1)
else:
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
from meshscope.capture import Capture
from meshscope.flightlog import FlightLog
x = torch.ones(4, device="cpu" if CPU else "cuda")
sync = (lambda: None) if CPU else torch.cuda.synchronize
N = 3000
def run():
    best = 1e9
    for _ in range(5):
        sync(); t = time.perf_counter()
        for _ in range(N): dist.all_reduce(x)
        sync(); best = min(best, (time.perf_counter() - t) / N * 1e6)
    return best
base = run()
with Capture(): cap = run()
fl = FlightLog(tempfile.mkdtemp(), 0)
with fl.capture(): flt = run()
print(f"us per all_reduce: bare {base:.1f}, capture +{cap - base:.1f}, flight log +{flt - base:.1f}")
pr = cProfile.Profile()
with Capture():
    pr.enable()
    for _ in range(N): dist.all_reduce(x)
    pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
