"""What a move costs a traced job, all of it: the module hooks that see it, its recording and the flush that
writes it, in microseconds of CPU time per move, in one process.

A move is a change of (phase, module) on the job's main thread (`capture.job_context`); a model of
`--modules` children called in turn moves twice per child and twice for the root per forward, and
issues no collective, so what a trace adds to its forwards is its moves' cost. A sample is `--calls`
forwards and, traced, the flush that writes their moves (`RankTrace` with the C++ recorder, as
`meshscope trace` runs it, without the flusher thread: the sample's own flush writes them), in the
process's CPU time (all its threads); traced and untraced samples alternate, and the figure is the
median over `--samples` pairs of (traced - untraced) / moves, with the smallest and largest.

The meshscope measured is the one on ``PYTHONPATH``: to compare a checkout, ``git archive REV src |
tar -x -C DIR`` and run this file with ``PYTHONPATH=DIR/src``.

Run: PYTHONPATH=src python benchmarks/bench_moves.py [--modules 16] [--calls 200] [--samples 21]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn

from meshscope.capture.job_context import JobContext
from meshscope.core.rundir import RunDir
from meshscope.trace.recording import RankTrace


class Root(nn.Module):
    def __init__(self, modules: int):
        super().__init__()
        self.children_ = nn.ModuleList(nn.Identity() for _ in range(modules))

    def forward(self, x):
        for child in self.children_:
            x = child(x)
        return x


def sample(model: Root, x, calls: int, traced: bool) -> float:
    """CPU seconds of `calls` forwards, and with `traced` the flush of their moves."""
    if traced:
        context = JobContext()
        trace = RankTrace(RunDir(tempfile.mkdtemp(prefix="bench_moves_")), 0, context, stream=False, recorder="native")
        if trace.recorder != "native":
            raise SystemExit(f"the C++ recorder is unavailable here: {trace.recorder_note}")
        context.install()
        recording = trace.recording()
        recording.__enter__()
        model(x)  # naming, as the first step of a traced job
        trace.flush()
    start = time.process_time()
    for _ in range(calls):
        model(x)
    if traced:
        trace.flush()
    elapsed = time.process_time() - start
    if traced:
        recording.__exit__(None, None, None)
        context.remove()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", type=int, default=16, help="children of the root (default 16: bench_trace's DDP model has 17 modules)")
    p.add_argument("--calls", type=int, default=200, help="forwards per sample")
    p.add_argument("--samples", type=int, default=21)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, x = Root(args.modules), torch.ones(1)
    moves = args.calls * 2 * (args.modules + 1)
    for _ in range(3):  # warm-up
        sample(model, x, args.calls, False)
        sample(model, x, args.calls, True)
    plain, traced = [], []
    for _ in range(args.samples):
        plain.append(sample(model, x, args.calls, False))
        traced.append(sample(model, x, args.calls, True))
    per_move = sorted((t - u) / moves * 1e6 for u, t in zip(plain, traced))
    print(f"{args.modules + 1} modules, {moves // args.calls} moves per forward, {args.samples} pairs of samples of "
          f"{args.calls} forwards; torch {torch.__version__}")
    print(f"the trace per move: {statistics.median(per_move):.3f} us CPU [{per_move[0]:.3f}, {per_move[-1]:.3f}]; "
          f"an untraced module call {statistics.median(plain) / (args.calls * (args.modules + 1)) * 1e6:.3f} us")


if __name__ == "__main__":
    main()
