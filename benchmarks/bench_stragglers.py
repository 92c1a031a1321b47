"""How often the trace names the slow rank and where its time went, and how often a healthy job stays clean.

Nine cases: a planted delay (``tests/jobs/delays.py``: ``--slow-ms``, 60 by default, once per step on
one rank) in a module's forward, in data loading and in a backward hook, under DDP (``ddp.py``, world
4, rank 2, module ``net.2``), FSDP2 x TP (``transformer.py``, world 4 = dp 2 x tp 2, rank 2,
``layers.0.feed_forward``) and 1F1B pipelining (``pipelining.py --schedule 1f1b``, world 2, rank 0,
``fc1``); and each job healthy. Each run is ``meshscope trace --json`` of ``--steps`` steps; a planted
run counts as right when the trace's time section names exactly that rank with that (phase, module)
(forward: ``forward, <module>``; data: ``other, no module``; backward: ``backward, no module``); a
healthy run counts as clean when it names none. The doctor reads the same analysis
(`doctor.stragglers`), so its finding is the trace's.

Prints per case: right (or clean) out of the runs, the median of the others' wait per step the
straggler caused, the median step, and the clock estimate's largest error against the one monotonic
clock all ranks share here. Nothing is asserted (docs/trace.md, "Time", has the figures).

Run: PYTHONPATH=src python benchmarks/bench_stragglers.py [--runs 10] [--steps 8] [--jobs ddp fsdp_tp 1f1b]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "jobs"

CASES = {  # job -> (ranks, script and its arguments, the slow rank, the module of forward)
    "ddp": (4, ["ddp.py"], 2, "net.2"),
    "fsdp_tp": (4, ["transformer.py"], 2, "layers.0.feed_forward"),
    "1f1b": (2, ["pipelining.py", "--schedule", "1f1b"], 0, "fc1"),
}
PLACES = {"forward": "forward, {module}", "data": "other, no module", "backward": "backward, no module"}


def trace(out: Path, nproc: int, job: list[str], steps: int, extra: list[str]) -> dict | None:
    cmd = [sys.executable, "-m", "meshscope", "trace", "--nproc-per-node", str(nproc), "--out", str(out), "--json",
           "--", str(JOBS / job[0]), *job[1:], "--steps", str(steps), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        print(f"  trace failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}", flush=True)
        return None


def named(doc: dict | None) -> list[tuple[int, str]]:
    if doc is None or not doc.get("time") or not doc["time"]["analysed"]:
        return [(-1, "not analysed")]
    return [(s["rank"], f"{s['phase']}, {s['module'] or 'no module'}") for s in doc["time"]["stragglers"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--slow-ms", type=float, default=60.0)
    p.add_argument("--jobs", nargs="+", choices=sorted(CASES), default=list(CASES))
    p.add_argument("--places", nargs="+", choices=[*PLACES, "healthy"], default=[*PLACES, "healthy"])
    args = p.parse_args()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {args.runs} runs of {args.steps} steps per case, "
          f"delay {args.slow_ms:g} ms", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for job in args.jobs:
            nproc, script, slow, module = CASES[job]
            for place in args.places:
                want = [] if place == "healthy" else [(slow, PLACES[place].format(module=module))]
                extra = [] if place == "healthy" else ["--slow-rank", str(slow), "--slow-in", place,
                                                       "--slow-ms", str(args.slow_ms)]
                right, caused, step, clock, wrong = 0, [], [], [], []
                start = time.monotonic()
                for run in range(args.runs):
                    doc = trace(Path(tmp) / f"{job}-{place}-{run}", nproc, script, args.steps, extra)
                    got = named(doc)
                    right += got == want
                    if got != want:
                        wrong.append(got)
                    if doc is not None and doc["time"]["analysed"]:
                        t = doc["time"]
                        step.append(t["step_ms"])
                        caused += [s["ms_per_step"] for s in t["stragglers"] if s["rank"] == slow]
                        if t["clock_true_error_ms"] is not None:
                            clock.append(t["clock_true_error_ms"])
                row = (job, place, right, args.runs, statistics.median(caused) if caused else None,
                       statistics.median(step) if step else None, max(clock) if clock else None,
                       time.monotonic() - start, os.getloadavg()[0])
                rows.append(row)
                print(f"{job:8} {place:9} {'clean' if place == 'healthy' else 'right'} {right}/{args.runs}"
                      f"  caused {_ms(row[4])}/step  step {_ms(row[5])}  clock error <= {_ms(row[6], 3)}"
                      f"  ({row[7]:.0f} s, load {row[8]:.1f})" + (f"  wrong: {wrong[:3]}" if wrong else ""), flush=True)
    planted = [r for r in rows if r[1] != "healthy"]
    healthy = [r for r in rows if r[1] == "healthy"]
    if planted:
        print(f"planted: {sum(r[2] for r in planted)}/{sum(r[3] for r in planted)} right "
              f"({sum(r[2] for r in planted) / sum(r[3] for r in planted):.0%})")
    if healthy:
        print(f"healthy: {sum(r[2] for r in healthy)}/{sum(r[3] for r in healthy)} clean")
    return 0


def _ms(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f} ms"


if __name__ == "__main__":
    sys.exit(main())
