"""NCCL kernel time per call of a CUDA-graph-replayed function: the sweep's kernel-time fits and the
profile's graph-replay measurement of a step's communication.

Why: a call timed on the stream is the kernel plus the gap before the next one, and an eager kernel's
duration is mostly its wait for the peer's launch; a profiled step's NCCL kernels, replayed in a
graph, add up to communication time alone. Predicting a step with wall-time fits and comparing it
with that over-predicted TP and EP by +33 to +73 % on 2 x H200; with kernel-time fits the error was
-8 to +9 % (docs/results/h200x2.md).

How: `calls` back-to-back calls captured in one CUDA graph; the ranks meet at a barrier; one replay
under torch.profiler; the trace's NCCL kernels cut into the calls in start order
(`kernels.kernel_seconds_per_step`). Callers take the median over at least `MIN_CALLS` calls, so that
the first call's wait for a peer whose replay started later (profiler start-up differs per rank)
does not count.
"""

from __future__ import annotations

import json

import torch

from ..capture.recorder import suspended
from .cuda_graph import graphed
from .kernels import kernel_seconds_per_step, profiled

MIN_CALLS = 3
"""Fewer calls leave no median that excludes the first call's wait."""


def graph_kernel_seconds(fn, device, calls: int, warmup: int, path, barrier) -> list[float]:
    """NCCL kernel seconds of each of `calls` back-to-back calls of `fn()`, replayed as one CUDA graph.

    Every rank of the collectives' groups must call this at the same point (the eager warmup and the
    replay issue collectives); `barrier()` makes them start the replay together. The trace is left at
    `path`.
    """
    if calls < MIN_CALLS:
        raise ValueError(f"kernel time per call needs at least {MIN_CALLS} calls in the graph, not {calls}")
    with suspended():
        replay = graphed(fn, device, warmup, calls)
        torch.cuda.synchronize(device)
        barrier()
        with profiled(path, device):
            replay()
            torch.cuda.synchronize(device)
    return kernel_seconds_per_step(json.loads(path.read_text()), calls)
