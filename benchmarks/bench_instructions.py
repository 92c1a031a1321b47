"""What `meshscope trace` costs a training step, in instructions: a figure that the machine's load does not move.

`bench_trace.py` times its steps; on a shared machine (this project's 2-core box) its samples vary by
10-20 %, more than the few percent it is after. This runs the same steps in the same modes (its
builders and its mode classes, imported from the `bench_trace.py` beside this file, so a tree checked
out elsewhere measures its own trace) with every rank under valgrind's callgrind, which counts the
instructions each process executes, all its threads. Instrumentation is off while torch imports; each
sample zeroes the counters after its barrier, runs K steps and the trace's flush, and dumps them
(`callgrind_control -z` / `-d`): the counts of one sample are the rank's instructions for those steps,
the flush included. torch runs on one thread per rank (OMP_NUM_THREADS=1, as torch.distributed.run sets),
so no pool spins. The trace's flusher wakes every `FLUSH_S` (0.5 s) of wall time, and under callgrind a
step takes some 50 times as long, so it would drain about 50 times as often per step as in a real job
(each drain has a fixed cost): here it does not wake at all, and each sample's one flush at its end
drains all its steps, as `bench_trace.py`'s window does. A first round, not reported, warms what the
steps' first samples still set up after their first step (its untraced samples read up to 4 M instructions
per step more than later ones on FSDP2 x TP; the traced ones, which come after them, did not).

What it does not see: time spent waiting (for the GIL, for the other rank, for the disk), and what an
instruction costs (a cache miss is one instruction). It is a count of the work, to be read beside
`bench_trace.py`'s times, not instead of them.

Run: PYTHONPATH=src python benchmarks/bench_instructions.py [--steps ddp tp fsdp_tp] [--rounds 2] [--steps-per-sample 4]
     (valgrind on PATH; on this project's 2-core box the defaults, three rounds with the warm-up, took 17 minutes;
     three trees of two rounds each side by side 35: the counts do not depend on the load, so trees can run at once.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trace  # noqa: E402  (this tree's steps and modes)

STEPS = ("ddp", "tp", "fsdp_tp")


def control(*args: str) -> None:
    """One command to this process's callgrind; it returns once callgrind has carried it out."""
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True, timeout=120)


def worker(args) -> None:
    import warnings

    import torch.distributed as dist
    from torch.distributed import device_mesh

    from meshscope.capture import dispatch
    from meshscope.trace import mesh_dims, recording

    recording.FLUSH_S = 1e6  # see the docstring: only the window's own flush drains

    import torch

    warnings.filterwarnings("ignore")
    bench_trace.DEVICE = torch.device("cpu")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # bench_trace.worker's set-up, spelled out here rather than shared: this file is copied into older trees
    # (`git archive`), whose bench_trace.py has the builders and modes but no set-up to call
    original_init = device_mesh.DeviceMesh.__init__
    mesh_dims.label_device_meshes()
    label_init = device_mesh.DeviceMesh.__init__
    builders = {"tp": lambda: bench_trace.build_tp(world), "ddp": lambda: bench_trace.build_ddp(rank),
                "fsdp_tp": lambda: bench_trace.build_fsdp_tp(world, 1)}
    steps = {name: builders[name]()[0] for name in args.steps}
    device_mesh.DeviceMesh.__init__ = original_init
    dispatch.uninstall()
    modes = {"none": bench_trace.NoneMode, "trace": bench_trace.TraceMode, "cheap": bench_trace.CheapMode}
    tmp = Path(tempfile.mkdtemp(prefix="bench_instr_"))
    control("-i", "on")
    n = 0
    for rnd in range(args.rounds + 1):  # round 0 is warm-up
        for s in args.steps:
            for m in args.modes:
                n += 1
                mode = modes[m](run_dir=tmp / f"sample{n}", rank=rank, label_init=label_init)
                mode.enter()
                mode.run(steps[s])  # untimed: first-use costs of this sample's mode
                if m != "none":
                    mode.end_window()
                dist.barrier()
                control("-z")
                for _ in range(args.steps_per_sample):
                    mode.run(steps[s])
                mode.end_window()
                control("-d", f"{s}:{m}:{rnd}")
                mode.exit()
    dist.barrier()
    dist.destroy_process_group()


def totals(out: Path) -> dict[tuple[str, str, int], int]:
    """(step, mode, round) -> instructions, from one rank's dumps."""
    found = {}
    for f in out.parent.glob(out.name + ".*"):
        text = f.read_text(errors="replace")
        desc = next(line for line in text.splitlines() if line.startswith("desc: Trigger: dump"))
        label = desc.rsplit(" ", 1)[1]
        s, m, rnd = label.split(":")
        found[s, m, int(rnd)] = int(next(line for line in text.splitlines() if line.startswith("totals:")).split()[1])
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    p.add_argument("--modes", nargs="+", choices=("none", "trace", "cheap"), default=["none", "trace"])
    p.add_argument("--rounds", type=int, default=2, help="rounds reported, after one of warm-up")
    p.add_argument("--steps-per-sample", type=int, default=4)
    p.add_argument("--nproc", type=int, default=2, help="ranks (tp and fsdp_tp need 2)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if "none" not in args.modes:
        p.error(f"--modes {' '.join(args.modes)}: 'none' must be among them (the overhead is against it)")
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        p.error(f"{' and '.join(missing)} not found on PATH: this benchmark runs each rank under valgrind's callgrind")
    if args.nproc < 2 and set(args.steps) & {"tp", "fsdp_tp"}:
        p.error(f"--nproc {args.nproc}: the tp and fsdp_tp steps need 2 ranks (or --steps ddp)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(tempfile.mkdtemp(prefix="bench_instr_cg_"))
    argv = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds), "--steps-per-sample",
            str(args.steps_per_sample), "--steps", *args.steps, "--modes", *args.modes]
    t0 = time.perf_counter()
    procs = []
    for rank in range(args.nproc):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.nproc),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                       f"--callgrind-out-file={out}/cg.{rank}", *argv],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for rank, proc in enumerate(procs):
        text, _ = proc.communicate()
        if proc.returncode:
            sys.exit(f"rank {rank} under valgrind exited {proc.returncode}:\n{text[-3000:]}")
    per_rank = [{(s, m, rnd - 1): n for (s, m, rnd), n in totals(out / f"cg.{rank}").items() if rnd}
                for rank in range(args.nproc)]
    K = args.steps_per_sample
    print(f"{args.nproc} gloo rank(s) under callgrind, {args.rounds} rounds (+1 warm-up) of {K} steps per (step, mode), "
          f"{time.perf_counter() - t0:.0f} s; torch {__import__('torch').__version__}; the dumps (callgrind_annotate "
          f"reads them): {out}")
    print("instructions per step and rank (millions), the median over rounds [min, max]; the trace's own, "
          "paired per round against 'none'")
    for s in args.steps:
        print(f"  [{s}]")
        for m in args.modes:
            per_step = [sum(r[s, m, i] for r in per_rank) / args.nproc / K for i in range(args.rounds)]
            line = f"    {m:6s} {statistics.median(per_step) / 1e6:10.3f} [{min(per_step) / 1e6:.3f}, {max(per_step) / 1e6:.3f}]"
            if m != "none":
                extra = [sum(r[s, m, i] - r[s, "none", i] for r in per_rank) / args.nproc / K for i in range(args.rounds)]
                line += (f"   {statistics.median(extra) / 1e6:+.3f} M per step [{min(extra) / 1e6:+.3f}, "
                         f"{max(extra) / 1e6:+.3f}]")
            print(line)


if __name__ == "__main__":
    main()
