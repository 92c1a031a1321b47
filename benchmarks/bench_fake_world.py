"""A real job's ledger at 1,024 ranks on this CPU: wall time and the memory of the processes alive at once.

Runs ``meshscope trace --fake-world N --fake-tensors --nproc-per-node 8 --ranks auto`` on a GPT-style script
(`tests/jobs/transformer.py`: torch's test Transformer, token + position embeddings, L blocks,
FSDP2 over dp x TP over tp; `--sequence-parallel` on) and samples, every 50 ms, the resident memory
(``VmRSS``) of every process below the trace command, summed over the processes alive at that moment
(pages a forked rank shares with the fork server count in both), and every 0.5 s their summed ``Pss``
(shared pages divided among the processes sharing them).
It prints the trace's wall time, the classes it traced, the peak of that sum (and of the largest
single process, and what each process alive at the peak held), and whether every traced rank passed.
The issue's target: all rank classes of dim 1024, 8 layers, seq 2048, tp 8 on a 1,024-rank world in at
most 60 s and 4 GiB.

Run: PYTHONPATH=src python benchmarks/bench_fake_world.py [--world 1024] [--tp 8] [--layers 8]
     [--dim 1024] [--seq 2048] [--batch 1] [--steps 2] [--no-fake-tensors]
     PYTHONPATH=src python benchmarks/bench_fake_world.py --pp 4 --batch 4   (tp 8 x pp 4 x dp 32, 1F1B, 4 microbatches)
     python benchmarks/bench_fake_world.py --cwd DIR -- JOB...   (any job instead, run in DIR; e.g. torchtitan's
         ``-m torchtitan.train ...`` with the flags of tests/test_torchtitan.py, in a folder `make_assets` filled)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _kib(pid: int, file: str, field: str) -> int:
    """A field in KiB of a process's ``/proc`` file (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_kib(pid: int) -> int:
    return _kib(pid, "status", "VmRSS:")


def _name(pid: int) -> str:
    """What a process is, for the breakdown at the peak: a rank by the log its output goes to, the fork
    server's own children (its import probe) by that and their parent, else its command line, shortened."""
    try:
        out = os.readlink(f"/proc/{pid}/fd/1")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        parent_out = os.readlink(f"/proc/{parent}/fd/1")
    except OSError:
        return "?"
    if Path(out).name.startswith("rank"):
        return Path(out).stem
    if Path(out).name == "fork_server.log":
        return "fork server's probe" if parent_out == out else "fork server"
    return " ".join(a.decode(errors="replace") for a in argv[:4])[:60]


def _pss_kib(pid: int) -> int:
    """The process's proportional share: its own pages plus its share of those it shares (a forked rank
    shares most of the server's)."""
    return _kib(pid, "smaps_rollup", "Pss:")


class TreeMemory(threading.Thread):
    """Peak of the summed RSS of `root` and all its descendants, of the largest one alone, and of their summed Pss."""

    def __init__(self, root: int, every_s: float = 0.05, scan_every: int = 10):
        """Every `every_s` the resident memory of the tree's processes; every `scan_every` samples the tree
        itself, from all of ``/proc`` (which cost the 2-core box about 14 s of a 98 s trace when it was
        scanned every 50 ms; a rank lives for seconds, so a 0.5 s old tree misses none)."""
        super().__init__(daemon=True)
        self.root, self.every_s, self.scan_every = root, every_s, scan_every
        self.peak_sum_kib = self.peak_one_kib = self.peak_alive = self.peak_pss_kib = 0
        self.at_peak: list[tuple[str, int]] = []  # (what, RSS KiB) of each live process when the sum peaked
        self.done = threading.Event()

    def run(self) -> None:
        tree, sample = [self.root], 0
        while not self.done.wait(self.every_s):
            if sample % self.scan_every == 0:
                kids, todo, tree = _children(), [self.root], []
                while todo:
                    pid = todo.pop()
                    tree.append(pid)
                    todo += kids.get(pid, [])
                self.peak_pss_kib = max(self.peak_pss_kib, sum(_pss_kib(p) for p in tree))
            sample += 1
            sizes = [_rss_kib(p) for p in tree]
            if sum(sizes) > self.peak_sum_kib:
                self.peak_sum_kib = sum(sizes)
                self.at_peak = [(_name(p), s) for p, s in zip(tree, sizes) if s]  # named now: a rank's
                # output goes to its log only after its fork
            self.peak_one_kib = max(self.peak_one_kib, max(sizes, default=0))
            self.peak_alive = max(self.peak_alive, sum(1 for s in sizes if s))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=1024)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--fake-tensors", action=argparse.BooleanOptionalAction, default=True,
                   help="trace with --fake-tensors (tensors without data; default on)")
    p.add_argument("--pp", type=int, default=1,
                   help="> 1: tests/jobs/pipeline_3d.py (pp stages x FSDP2 x TP, 1F1B) instead of FSDP2 x TP+SP")
    p.add_argument("--cwd", type=Path, default=ROOT, help="where the job runs (default: this checkout)")
    p.add_argument("job", nargs="*", help="after --: the job to trace instead of the built-in transformer")
    args = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench_fake_world_")) / "trace"
    shapes = ["--tp", str(args.tp), "--layers", str(args.layers), "--dim", str(args.dim), "--heads", str(args.heads),
              "--seq", str(args.seq), "--batch", str(args.batch), "--vocab", str(args.vocab), "--steps", str(args.steps)]
    job = (args.job if args.job
           else [str(ROOT / "tests/jobs/pipeline_3d.py"), "--pp", str(args.pp), "--microbatches", str(args.batch), *shapes] if args.pp > 1
           else [str(ROOT / "tests/jobs/transformer.py"), "--sequence-parallel", "--dp-mode", "fsdp", *shapes])
    cmd = [sys.executable, "-m", "meshscope", "trace", "--fake-world", str(args.world), "--nproc-per-node", "8",
           *(["--fake-tensors"] if args.fake_tensors else []), "--out", str(out), "--json", "--", *job]
    print(" ".join(["meshscope", *cmd[3:]]))
    print(f"machine: {len(os.sched_getaffinity(0))} usable cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    sys.path.insert(0, str(ROOT / "src"))
    from meshscope.capture import native

    native.build(log=print)  # once per torch, before the timing (the trace would build it first)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=args.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = TreeMemory(proc.pid)
    memory.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    memory.done.set()
    memory.join()
    if proc.returncode not in (0, 1) or not stdout.strip():
        sys.exit(f"the trace failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    doc = json.loads(stdout)
    traced = [r["rank"] for r in doc["per_rank"]]
    print(f"wall {wall:.1f} s; ranks traced {len(traced)} ({traced[:12]}{' ...' if len(traced) > 12 else ''}); "
          f"passed {doc['passed']}")
    print(f"resident memory: peak of the sum over live processes {memory.peak_sum_kib / 2**20:.2f} GiB "
          f"({memory.peak_sum_kib / 2**10:,.0f} MiB) "
          f"(at most {memory.peak_alive} processes alive at once); largest single process "
          f"{memory.peak_one_kib / 2**20:.2f} GiB; peak of the summed proportional share (Pss, sampled every "
          f"{memory.every_s * memory.scan_every:.1f} s) {memory.peak_pss_kib / 2**20:.2f} GiB")
    print("at the peak: " + "; ".join(f"{what} {kib / 2**20:.2f} GiB"
                                      for what, kib in sorted(memory.at_peak, key=lambda x: -x[1])))
    print(f"layout: {doc.get('layout')}")
    calls = {r["rank"]: sum(len(s["events"]) for s in r["steps"]) for r in doc["per_rank"]}
    print(f"calls per traced rank: {calls}")
    for rank in traced:
        end = json.loads((out / "ranks" / f"rank{rank}.json").read_text()) if (out / "ranks" / f"rank{rank}.json").exists() else {}
        if end.get("status") not in ("ok", "stopped"):
            log = out / "logs" / f"rank{rank}.log"
            print(f"rank {rank} {end.get('status', 'missing')}: {end.get('error', '')}\n"
                  + (log.read_text()[-2500:] if log.exists() else "(no log)"))
            break


if __name__ == "__main__":
    main()
