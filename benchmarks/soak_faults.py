"""Soak: every planted fault of tests/jobs/faults/ traced again and again; count what went wrong.

Each run is ``meshscope trace --nproc-per-node 2 --timeout T --json -- tests/jobs/faults/F.py`` in its
own run directory. Per fault the table counts: runs; hangs beyond the timeout (the trace did not end
within T + `GRACE_S` of the moment the first rank got stuck, or not at all before the hard limit);
orphaned processes (any process whose command line names the run directory once the trace has
ended: they are listed and then killed by pid); and a correct first finding (the doctor's root
cause has the fault's kind and axis, `EXPECTED`). Goals: 0, 0, 100 %.

Run: PYTHONPATH=src python benchmarks/soak_faults.py [--repeats 10] [--parallel 3] [--timeout 10]
     [--faults group_order,ddp_unused] [--keep DIR]

`EXPECTED`, `stuck_since` and `trace_fault` are also what tests/test_faults.py runs once per fault,
so CI and the soak check the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from meshscope.capture.flightlog import read

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "tests" / "jobs" / "faults"

GRACE_S = 15.0
"""What a trace may take beyond --timeout after a rank got stuck: the failing rank's exit (its flight
log, rank record and recorder dump), the elastic agent stopping the others, assembling the result and
running the doctor."""

HARD_LIMIT_S = 150.0
"""A trace still running after this long is killed and counted as a hang."""

EXPECTED = {
    # fault: (the first finding's kind, its axis, whether a rank gets stuck; else the job runs to its end)
    "group_order": ("group-order", "dp", True),
    "group_size": ("group-members", "tp", True),
    "skip_collective": ("mismatch", "dp", True),
    "both_send_first": ("p2p", "pp", True),
    "ddp_unused": ("ddp-unused", "dp", True),
    "a2a_splits": ("mismatch", "ep", False),  # gloo lets a receiver that expects more rows through
}


@dataclass
class Run:
    fault: str
    run_dir: Path
    returncode: int | None
    """None: killed at the hard limit."""
    doc: dict | None
    ended: float
    stderr: str
    orphans: list[str]

    @property
    def first(self) -> dict | None:
        findings = ((self.doc or {}).get("doctor") or {}).get("findings") or []
        return findings[0] if findings else None

    @property
    def correct(self) -> bool:
        kind, axis, _ = EXPECTED[self.fault]
        return self.first is not None and (self.first["kind"], self.first["axis"]) == (kind, axis)

    def late_by(self, timeout: float) -> float | None:
        """Seconds beyond timeout + grace that the trace ran after the first rank got stuck (None: in time)."""
        if self.returncode is None:
            return float("inf")
        since = stuck_since(self.run_dir)
        late = self.ended - since - timeout - GRACE_S if since is not None else 0.0
        return late if late > 0 else None


def stuck_since(run_dir: Path) -> float | None:
    """When the first rank that did not end well started its last call or group creation (the one it
    was stuck in); None if every rank ended well."""
    starts = []
    for end in (run_dir / "ranks").glob("rank*.json"):
        doc = json.loads(end.read_text())
        if doc["status"] == "ok":
            continue
        r = doc["rank"]
        times = [ln["t"] for ln in read(run_dir / "flight" / f"rank{r}.jsonl") if ln["kind"] == "issued"]
        times += [c["t"] for c in _lines(run_dir / "groups" / f"rank{r}.jsonl") if c["kind"] == "creating"]
        starts.append(max(times))
    return min(starts) if starts else None


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln] if path.exists() else []


def orphans(run_dir: Path) -> list[str]:
    """'PID COMMAND' of every process whose command line names the run directory."""
    out = subprocess.run(["pgrep", "-af", str(run_dir)], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if line.strip()]


def trace_fault(fault: str, run_dir: Path, timeout: float = 10.0, flags: tuple[str, ...] = ()) -> Run:
    """Trace one fault into `run_dir` (which must not exist) and look for what it left behind."""
    cmd = [sys.executable, "-m", "meshscope", "trace", *flags, "--nproc-per-node", "2", "--timeout", str(timeout),
           "--out", str(run_dir), "--json", "--", str(FAULTS / f"{fault}.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        out, err = proc.communicate(timeout=HARD_LIMIT_S)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = None
    ended = time.time()
    left = orphans(run_dir)
    for line in left:  # leave nothing behind for the next run
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    try:
        doc = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        doc = None
    return Run(fault, run_dir, code, doc, ended, err, left)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--parallel", type=int, default=3, help="traces at a time (a hung job mostly waits)")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--faults", default=",".join(EXPECTED))
    p.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(EXPECTED))
    if unknown or args.repeats < 1 or args.parallel < 1:
        print(f"soak_faults: unknown faults {unknown} (known: {', '.join(EXPECTED)})" if unknown
              else "soak_faults: --repeats and --parallel must be positive", file=sys.stderr)
        return 2
    base = args.keep or Path(tempfile.mkdtemp(prefix="soak-faults-"))
    jobs = [(f, i) for i in range(args.repeats) for f in faults]
    start = time.time()
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: trace_fault(job[0], base / f"{job[0]}-{job[1]}", args.timeout), jobs))
    print(f"{len(runs)} traces in {time.time() - start:.0f} s, --timeout {args.timeout:g}, grace {GRACE_S:g} s, "
          f"{args.parallel} at a time, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'fault':16} {'runs':>5} {'late':>5} {'orphans':>8} {'correct':>8}  {'worst s after stuck':>20}  first finding")
    bad = 0
    for fault in faults:
        mine = [r for r in runs if r.fault == fault]
        late = [r for r in mine if r.late_by(args.timeout) is not None]
        left = sum(len(r.orphans) for r in mine)
        right = sum(r.correct for r in mine)
        spans = [r.ended - s for r in mine if r.returncode is not None and (s := stuck_since(r.run_dir)) is not None]
        worst = f"{max(spans):.1f}" if spans else "-"
        kind, axis, _ = EXPECTED[fault]
        print(f"{fault:16} {len(mine):5} {len(late):5} {left:8} {100 * right / len(mine):7.0f}%  {worst:>20}  {kind} on {axis}")
        for r in mine:
            if not r.correct or r.orphans or r in late:
                bad += 1
                print(f"  {r.run_dir}: exit {r.returncode}, first finding {(r.first or {}).get('summary', '-')[:200]}"
                      f"{'; orphans ' + '; '.join(r.orphans) if r.orphans else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
