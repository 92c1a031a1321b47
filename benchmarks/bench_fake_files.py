"""What a fake rank's own layer of files costs (`trace.fake.files`): from its fork to the rank program,
and on the writes that land in it.

In a process that imported what the fork server imports (`fork_server.PRELOAD`: torch and its parallel
APIs, so a fork copies as many page tables as the server's does), forks ``--forks`` children in turn,
alternately with and without `files.isolate`; each child reports ``time.perf_counter()`` (the
monotonic clock, shared by every process) at the point where the server's child calls
``trace.rank.main``, and the parent takes it from the moment before ``os.fork()``. Then, in a child
with its layer and one without: the first append to a pre-existing file of ``--mib`` MiB (overlayfs
copies it whole into the rank's tmpfs) and a ``torch.save`` of ``--mib`` MiB of tensors into the
working directory (the tmpfs against the disk's page cache). The working directory is a fresh folder
below ``--cwd`` (default ``/var/tmp``), with the run directory inside it, as the default ``traces/...``
is (bound through the layer).

Run: PYTHONPATH=src python benchmarks/bench_fake_files.py [--forks 40] [--mib 64] [--cwd /var/tmp]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from meshscope.trace.fake import files
from meshscope.trace.fake.fork_server import PRELOAD, _import_all


def machine() -> str:
    cpu = platform.processor() or "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (f"cpu {cpu}, {len(os.sched_getaffinity(0))} usable cores; kernel {platform.release()}; python "
            f"{platform.python_version()}; torch {metadata.version('torch')}; uid {os.getuid()}; "
            f"load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


def in_child(work, isolated: bool, run_dir: Path) -> float:
    """Fork; the child takes its layer (or not) and runs `work`, whose float it sends back."""
    read, write = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            if isolated:
                files.isolate(run_dir)
            os.write(write, repr(work(start)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as said:
        value = said.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not value:
        sys.exit(f"the child {'with' if isolated else 'without'} its layer failed (status {status})")
    return float(value)


def ms(values: list[float]) -> str:
    values = sorted(values)
    return (f"median {statistics.median(values) * 1e3:.2f} ms, p90 {values[int(0.9 * (len(values) - 1))] * 1e3:.2f} ms, "
            f"min {values[0] * 1e3:.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forks", type=int, default=40)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--cwd", type=Path, default=Path("/var/tmp"))
    args = p.parse_args()
    _import_all(PRELOAD)
    import torch

    cwd = Path(tempfile.mkdtemp(prefix="bench_fake_files.", dir=args.cwd))
    try:
        os.chdir(cwd)
        run_dir = cwd / "run"
        run_dir.mkdir()
        reason = files.probe(run_dir)
        if reason:
            sys.exit(f"no layer of files here: {reason}")
        print(machine())
        print(f"covered: {files.covered(run_dir)}")

        def ready(start: float) -> float:
            return time.perf_counter() - start

        times = {True: [], False: []}
        for i in range(args.forks * 2):
            isolated = i % 2 == 0
            times[isolated].append(in_child(ready, isolated, run_dir))
        print(f"fork -> rank program, {args.forks} forks each: without {ms(times[False])}; with {ms(times[True])}")

        (cwd / "big.bin").write_bytes(os.urandom(args.mib << 20))
        state = {f"w{i}": torch.randn(1 << 18) for i in range(args.mib)}  # 1 MiB of float32 each

        def append(_: float) -> float:
            t0 = time.perf_counter()
            with open("big.bin", "ab") as f:
                f.write(b"x")
            return time.perf_counter() - t0

        def save(_: float) -> float:
            t0 = time.perf_counter()
            torch.save(state, "ckpt.pt")
            return time.perf_counter() - t0

        for name, work in ((f"first append to a {args.mib} MiB file", append), (f"torch.save of {args.mib} MiB", save)):
            for isolated in (False, True):
                took = [in_child(work, isolated, run_dir) for _ in range(3)]
                (cwd / "big.bin").write_bytes((cwd / "big.bin").read_bytes()[: args.mib << 20])
                (cwd / "ckpt.pt").unlink(missing_ok=True)
                print(f"{name}, {'with' if isolated else 'without'} the layer, 3 runs: {ms(took)}")
    finally:
        os.chdir("/")
        shutil.rmtree(cwd)


if __name__ == "__main__":
    main()
