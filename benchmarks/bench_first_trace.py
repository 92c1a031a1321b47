"""A newcomer's first `meshscope trace`: on a cold cache (the C++ recorder not built yet) vs a warm one.

Runs ``meshscope trace --nproc-per-node 2 -- tests/jobs/ddp.py --steps 3`` (``--job`` changes the
script) N times in pairs: first with ``MESHSCOPE_CACHE`` a fresh empty folder, so the trace builds
its C++ recorder before the ranks start (`capture.native_build.ensure`), then at once again on the
cache that run left (the recorder only loaded). Each run is timed from the command's start to its
end, and prints the load averages (``/proc/loadavg``: 1, 5, 15 min) as it starts and the 1-min one
as it ends (other work on the machine slows a build several times over), whether the trace passed
and the recorder its ranks used (``ranks/rank<R>.json``'s ``"recorder"``). Then the medians of the cold
and the warm runs and their difference, and the median of the paired differences. The issue's
target: the cold first trace at most 20 s slower than a warm one on this project's 2-core box.

Run: PYTHONPATH=src python benchmarks/bench_first_trace.py [--runs 3] [--job tests/jobs/ddp.py --steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    cpu = platform.processor() or "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (f"cpu {cpu}, {len(os.sched_getaffinity(0))} usable cores; python {platform.python_version()}; "
            f"torch {metadata.version('torch')}")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def trace(cache: Path, out: Path, job: list[str]) -> tuple[float, str, str]:
    """One `meshscope trace` of `job` on `cache`: (wall s, the load as it started and ended, what it reported)."""
    cmd = [sys.executable, "-m", "meshscope", "trace", "--nproc-per-node", "2", "--out", str(out), "--json", "--", *job]
    env = {**os.environ, "MESHSCOPE_CACHE": str(cache), "PYTHONPATH": str(ROOT / "src")}
    load = loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.exit(f"the trace failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    load += f" -> {loadavg().split()[0]}"
    doc = json.loads(proc.stdout)
    recorders = sorted({json.loads(p.read_text())["recorder"] for p in (out / "ranks").glob("rank*.json")})
    return wall, load, f"passed {doc['passed']}, recorder {'/'.join(recorders)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="pairs of (cold, warm) traces")
    p.add_argument("--job", nargs=argparse.REMAINDER, default=["tests/jobs/ddp.py", "--steps", "3"],
                   help="the traced script and its arguments (last on the command line)")
    args = p.parse_args()
    print(f"meshscope trace --nproc-per-node 2 -- {' '.join(args.job)}  (cold: an empty MESHSCOPE_CACHE)")
    print(f"machine: {machine()}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench_first_trace_"))
    cold, warm = [], []
    for i in range(args.runs):
        cache = scratch / f"cache{i}"
        for kind, times in (("cold", cold), ("warm", warm)):
            wall, load, said = trace(cache, scratch / f"{kind}{i}", args.job)
            times.append(wall)
            print(f"run {i + 1} {kind}: {wall:6.1f} s   load {load:<22} {said}", flush=True)
    pairs = [c - w for c, w in zip(cold, warm)]
    print(f"median cold {statistics.median(cold):.1f} s, warm {statistics.median(warm):.1f} s: "
          f"difference {statistics.median(cold) - statistics.median(warm):.1f} s "
          f"(paired differences {', '.join(f'{d:.1f}' for d in pairs)}; median {statistics.median(pairs):.1f} s)")


if __name__ == "__main__":
    main()
