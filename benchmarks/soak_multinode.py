"""Soak: two torch elastic agents on 127.0.0.1 form one 4-rank job, again and again; count clean runs.

Each run starts two ``torchrun --nnodes 2 --nproc-per-node 2`` agents at the same time, as two nodes
of one job would be, each running ``-m meshscope run tp_ar_b32 --world 4 --json`` (every rank goes
through the CLI and normal interpreter teardown, not the standalone worker's ``os._exit``). A run is
clean when both agents exit 0 within the time limit, no rank printed "terminate called", and rank 0's
result document (on the stdout of whichever agent holds it) says passed. On a failure the tail of each
agent's stderr is printed.

Run: python benchmarks/soak_multinode.py [--runs 20] [--rdzv c10d|static] [--timeout 120] [--keep DIR]

`launch_pair` and `problems` are also what tests/test_multinode.py runs, so CI and the soak check the
same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ["tp_ar_b32", "--world", "4"]


def free_port() -> int:
    """A port nobody listens on now (bound to port 0 and released; torchrun binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Agent:
    node: int
    returncode: int | None
    """None: it ran past the time limit and was killed."""
    stdout: str
    stderr: str


@dataclass
class PairOutcome:
    rdzv: str
    wall_s: float
    agents: list[Agent] = field(default_factory=list)

    @property
    def result(self) -> dict | None:
        """Rank 0's result document: the one JSON line an agent's stdout carries."""
        for agent in self.agents:
            for line in agent.stdout.splitlines():
                if line.startswith("{"):
                    try:
                        return json.loads(line)
                    except json.JSONDecodeError:
                        continue
        return None


def agent_cmd(rdzv: str, node: int, port: int, run_id: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--max-restarts", "0", "--monitor-interval", "0.2"]
    if rdzv == "c10d":
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id]
    elif rdzv == "static":
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", str(node)]
    else:
        raise ValueError(f"unknown rendezvous {rdzv!r} (c10d or static)")
    return cmd + ["-m", "meshscope", "run", *EXPERIMENT, "--json", "--out", str(out)]


def launch_pair(rdzv: str, workdir: Path, timeout_s: float = 120.0) -> PairOutcome:
    """Start both agents at once and wait for both, at most `timeout_s` in all; an agent still running
    then is killed with its whole process group (its ranks too), so a hang never outlives the limit."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, run_id = free_port(), f"soak{os.getpid()}{time.monotonic_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs, files = [], []
    start = time.monotonic()
    for node in range(2):
        out, err = open(workdir / f"agent{node}.out", "w+"), open(workdir / f"agent{node}.err", "w+")
        files.append((out, err))
        procs.append(subprocess.Popen(agent_cmd(rdzv, node, port, run_id, workdir / f"node{node}"),
                                      stdout=out, stderr=err, env=env, cwd=workdir, start_new_session=True))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.0, start + timeout_s - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for proc, code in zip(procs, codes):
        if code is None:
            _kill_group(proc)
    outcome = PairOutcome(rdzv, time.monotonic() - start)
    for node, (out, err) in enumerate(files):
        out.seek(0)
        err.seek(0)
        outcome.agents.append(Agent(node, codes[node], out.read(), err.read()))
        out.close()
        err.close()
    return outcome


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def problems(outcome: PairOutcome) -> list[str]:
    """Why a run was not clean ([] when it was)."""
    bad = []
    for agent in outcome.agents:
        if agent.returncode is None:
            bad.append(f"agent {agent.node} still running after the time limit (killed)")
        elif agent.returncode != 0:
            bad.append(f"agent {agent.node} exited {agent.returncode}")
        if "terminate called" in agent.stderr:
            bad.append(f"agent {agent.node}: a rank printed 'terminate called'")
        if "outlived destroy_process_group" in agent.stderr:
            bad.append(f"agent {agent.node}: communication threads outlived teardown")
    result = outcome.result
    if result is None:
        bad.append("no agent printed rank 0's result")
    elif not result.get("passed") or result.get("world") != 4:
        bad.append(f"rank 0's result: passed={result.get('passed')} world={result.get('world')}")
    return bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--rdzv", choices=("c10d", "static"), default="c10d")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per run, both agents (default %(default)s)")
    p.add_argument("--keep", type=Path, default=None, help="keep every run's logs under this folder")
    args = p.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="soak-multinode-"))
    clean, failures, start = 0, [], time.monotonic()
    for i in range(args.runs):
        outcome = launch_pair(args.rdzv, base / f"run{i:03d}", args.timeout)
        bad = problems(outcome)
        print(f"run {i + 1}/{args.runs}: {'clean' if not bad else 'FAILED: ' + '; '.join(bad)} "
              f"({outcome.wall_s:.1f} s)", flush=True)
        if bad:
            failures.append((i + 1, outcome))
        else:
            clean += 1
    print(f"\n{args.rdzv}: {clean}/{args.runs} clean runs in {time.monotonic() - start:.0f} s "
          f"on {os.cpu_count()} cores (logs: {base})")
    for i, outcome in failures:
        for agent in outcome.agents:
            tail = "\n    ".join(agent.stderr.strip().splitlines()[-15:])
            print(f"\n--- run {i}, agent {agent.node} (exit {agent.returncode}), stderr tail:\n    {tail}")
    return 0 if clean == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
