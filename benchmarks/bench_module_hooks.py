"""What `capture.job_context`'s module hooks cost a module call: microseconds per call, in one process.

A traced job pays the JobContext's global forward hooks on every module call (the region stack and
the state the C++ recorder is told). Three models, each a root holding `--modules` children called
in turn, timed without hooks (``none``) and with a JobContext installed (``context``, its listener
one C call, as `capture.native.NativeRecorder`'s is):

  ``plain``  children are ``nn.Identity``;
  ``own``    every child has a forward hook of its own (as DTensor's parallelized modules and FSDP2's
             units do), so the context pops it after its own hooks;
  ``fresh``  the root builds a new ``nn.Identity`` per child call and drops it (megatron-core's
             ``FusedScaleMaskSoftmax`` builds an ``nn.Softmax`` per call), so freed addresses recur.

``--against FILE`` adds the JobContext of another checkout's ``capture/job_context.py`` (it imports
only torch), timed in the same rounds. A sample is `--calls` forwards of one model under one mode, in
this thread's CPU time (other processes on a shared machine move it less than wall time); modes
alternate within a round, and the figures are the minimum and the median over `--samples` rounds of
(mode - none) / module calls.

Run: PYTHONPATH=src python benchmarks/bench_module_hooks.py [--modules 64] [--calls 100] [--samples 31]
                                                             [--against OTHER/src/meshscope/capture/job_context.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch
from torch import nn

from meshscope.capture.job_context import JobContext


class Root(nn.Module):
    def __init__(self, modules: int, kind: str):
        super().__init__()
        self.kind, self.n = kind, modules
        self.children_ = nn.ModuleList(nn.Identity() for _ in range(modules if kind != "fresh" else 0))
        for child in self.children_ if kind == "own" else ():
            child.register_forward_hook(lambda module, args, output: None)

    def forward(self, x):
        if self.kind == "fresh":
            for _ in range(self.n):
                x = nn.Identity()(x)
            return x
        for child in self.children_:
            x = child(x)
        return x


def publisher():
    """The listener `NativeRecorder` installs: one C call with the state's number (an older tree's
    JobContext passes the state itself, which its recorder numbered first)."""
    states: dict[tuple, int] = {}

    def publish(state):
        if type(state) is not int:
            index = states.get(state)
            state = states[state] = len(states) if index is None else index
        abs(state)
    return publish


def sample(model: Root, x, calls: int, context_class) -> float:
    ctx = None
    if context_class is not None:
        ctx = context_class()
        ctx.install()
        ctx.listener = publisher()
        model(x)  # naming, as the first step of a traced job
    start = time.thread_time()
    for _ in range(calls):
        model(x)
    elapsed = time.thread_time() - start
    if ctx is not None:
        ctx.remove()
    return elapsed


def load(path: str):
    spec = importlib.util.spec_from_file_location("other_job_context", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.JobContext


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modules", type=int, default=64)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--samples", type=int, default=31)
    parser.add_argument("--against", help="another checkout's capture/job_context.py")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.ones(1)
    modes = {"none": None, "context": JobContext, **({"against": load(args.against)} if args.against else {})}
    n = args.calls * args.modules
    for kind in ("plain", "own", "fresh"):
        model = Root(args.modules, kind)
        times = {mode: [] for mode in modes}
        for mode in modes:  # warm-up
            sample(model, x, args.calls, modes[mode])
        for _ in range(args.samples):
            for mode, context_class in modes.items():
                times[mode].append(sample(model, x, args.calls, context_class) / n * 1e6)
        none = times.pop("none")
        line = f"{kind:6s} {min(none):5.2f} us a module call without hooks"
        for mode, ts in times.items():
            added = [t - b for t, b in zip(ts, none)]
            line += f"; {mode} adds {min(ts) - min(none):5.2f} (min) {statistics.median(added):5.2f} (median)"
        print(line + f", {args.samples} rounds")


if __name__ == "__main__":
    main()
