"""NCCL kernel time per collective call, the basis of the sweep's kernel-time alpha-beta fits.

Why: the sweep times a call on the stream, the kernel plus the gap before the next one; a profiled
step's NCCL kernels add up to kernel time alone. Predicting a step's communication with wall-time fits
and comparing it with kernel time over-predicted TP and EP by +33 to +73 % on 2 x H200
(docs/results/h200x2.md). Fitting the kernel durations as well makes that comparison like for like.

How: one replay of a CUDA graph of `calls` back-to-back calls under torch.profiler; the trace's NCCL
kernels cut into the calls in start order (`kernels.kernel_seconds_per_step`); the median over the
calls, so that the first call's wait for a late peer does not count.
"""

from __future__ import annotations

import json

import torch

from .capture import suspended
from .cuda_graph import graphed
from .kernels import kernel_seconds_per_step, profiled
from .stats import percentile


def kernel_seconds_per_call(call, device, calls: int, warmup: int, path) -> float:
    """Median NCCL kernel seconds of one call of `call()` over one replay of `calls` captured calls.

    Every rank of the call's group must call this at the same point (the replay issues collectives).
    """
    with suspended():
        replay = graphed(call, device, warmup, calls)
        with profiled(path, device):
            replay()
            torch.cuda.synchronize(device)
    return percentile(kernel_seconds_per_step(json.loads(path.read_text()), calls), 50)
