"""Communication budgets, measured: false positives over re-runs, other worlds, and a check at 1,024 ranks.

Three parts (``--part`` picks them; all by default), each printing its figures with the machine's
load:

- ``soak``: a budget fitted once per clean job from a real gloo trace, then ``meshscope check`` of
  that job ``--runs`` times (real gloo traces: a fake world is deterministic and proves nothing
  here). Jobs: DDP (tests/jobs/ddp.py), FSDP2 x TP (fsdp_tp.py), a job whose step 0 issues a random
  number of calls (random_init.py) and an MoE job with learned routing (moe_a2a.py --routing learned).
  The figure: checks that did not hold (false positives), expected 0.
- ``worlds``: torch's test Transformer (tests/jobs/transformer.py, FSDP2 x TP 2 + SP) fitted at fake
  worlds of 8 and 16 (``--vary world=8,16``), checked at 32: a budget over two sizes holds at a third.
- ``scale``: the same job with 8 layers, dim 1024, TP 8 + SP x FSDP2, fitted at fake worlds of 32 and 64
  (``--fake-tensors``), then ``meshscope check`` at 1,024 fake ranks, timed (target: at most 60 s on
  2 cores).

Run: PYTHONPATH=src python benchmarks/bench_budget.py [--part soak|worlds|scale] [--runs 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "tests" / "jobs"


def load() -> str:
    return open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"


def ms(*args, timeout=1800) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "meshscope", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)
    return proc, time.monotonic() - start


def fit(out: Path, name: str, options: list[str], job: list[str], vary: list[str] = ()) -> Path:
    budget = out / name / "budget.toml"
    proc, wall = ms("budget", *options, "--budget", budget, "--out", out / name / "points",
                    *[f for v in vary for f in ("--vary", v)], "--", *job)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: meshscope budget failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    print(f"  {name}: fitted in {wall:.1f} s: {proc.stdout.strip()}", flush=True)
    return budget


def check(budget: Path, out: Path, job: list[str] = (), options: list[str] = ()) -> tuple[dict, float]:
    proc, wall = ms("check", budget, *options, "--json", "--out", out, *(["--", *job] if job else []))
    try:
        return json.loads(proc.stdout), wall
    except json.JSONDecodeError:
        return {"verdict": f"error (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"}, wall


SOAK = {
    "ddp": (["--nproc-per-node", "2"], [JOBS / "ddp.py", "--steps", "5"]),
    "fsdp_tp": (["--nproc-per-node", "4"], [JOBS / "fsdp_tp.py", "--steps", "5"]),
    "random_init": (["--nproc-per-node", "2"], [JOBS / "random_init.py", "--steps", "5"]),
    "moe_learned": (["--nproc-per-node", "2"], [JOBS / "moe_a2a.py", "--steps", "5", "--routing", "learned"]),
}


def soak(out: Path, runs: int) -> None:
    print(f"soak: {runs} re-runs of each clean job in real gloo traces, load {load()} at the start", flush=True)
    rows = []
    for name, (options, job) in SOAK.items():
        budget = fit(out, name, options, list(map(str, job)))
        verdicts, walls = [], []
        for i in range(runs):
            doc, wall = check(budget, out / name / f"run{i}")
            verdicts.append(doc["verdict"])
            walls.append(wall)
            if doc["verdict"] != "holds":
                moved = [v for p in doc.get("points", []) for v in p["violations"]][:3]
                print(f"    {name} run {i}: {doc['verdict']} {moved}", flush=True)
        rows.append((name, runs, sum(v != "holds" for v in verdicts), sorted(walls)[len(walls) // 2]))
    print(f"{'job':14s} {'runs':>5s} {'not holding':>12s} {'median s':>9s}   (load {load()} at the end)")
    for name, n, bad, wall in rows:
        print(f"{name:14s} {n:5d} {bad:12d} {wall:9.1f}")


def worlds(out: Path) -> None:
    print(f"worlds: fitted at fake worlds 8 and 16, checked at 32, load {load()}", flush=True)
    job = [JOBS / "transformer.py", "--tp", "2", "--sequence-parallel", "--layers", "2", "--steps", "4"]
    budget = fit(out, "worlds", ["--fake-world", "{world}", "--fake-tensors"], list(map(str, job)), ["world=8,16"])
    doc, wall = check(budget, out / "worlds-check", options=["--fake-world", "32", "--fake-tensors"])
    moved = [v for p in doc.get("points", []) for v in p["violations"]]
    print(f"  world 32: {doc['verdict']} in {wall:.1f} s ({len(moved)} entries moved) (load {load()})")


def scale(out: Path) -> None:
    print(f"scale: fitted at fake worlds 32 and 64, checked at 1,024, load {load()}", flush=True)
    job = [JOBS / "transformer.py", "--tp", "8", "--sequence-parallel", "--dp-mode", "fsdp", "--layers", "8",
           "--dim", "1024", "--heads", "16", "--seq", "2048", "--vocab", "8192", "--batch", "1", "--steps", "4"]
    budget = fit(out, "scale", ["--fake-world", "{world}", "--fake-tensors", "--nproc-per-node", "8"],
                 list(map(str, job)), ["world=32,64"])
    start_load = load()
    doc, wall = check(budget, out / "scale-check", options=["--fake-world", "1024", "--fake-tensors",
                                                            "--nproc-per-node", "8"])
    moved = [v for p in doc.get("points", []) for v in p["violations"]]
    print(f"  meshscope check at 1,024 fake ranks: {doc['verdict']} in {wall:.1f} s ({len(moved)} entries moved; "
          f"load {start_load} at the start, {load()} at the end)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=("soak", "worlds", "scale"), action="append", default=None)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-budget-"))
    print(f"{os.cpu_count()} CPUs, {sys.version.split()[0]}, traces under {out}", flush=True)
    for part in args.part or ["soak", "worlds", "scale"]:
        {"soak": lambda: soak(out, args.runs), "worlds": lambda: worlds(out), "scale": lambda: scale(out)}[part]()


if __name__ == "__main__":
    main()
