"""CUDA-graph replay of a training step: the step's device work, without Python or launch jitter.

Why: on the H200 VM the eager steps of the suite are bound by Python and kernel launches (GPU time
equals host time within 0.3 %), so their CV is the host's jitter, 7.5-17.3 % per step
(docs/results/h200x2.md), however many steps are taken. A step captured once into a CUDA graph
replays the same kernels and NCCL calls with a single launch; what is timed is then the device's
step: GEMMs, collectives and the waits between ranks, which is what a communication study compares.
Both figures are honest; they answer different questions, and the method string says which one a
table holds. Measured on 2 x H200 with one graph of 20 steps per sample: every suite configuration's
CV 0.5-3.0 % in 5 of 6 runs; in the sixth one late rank spoiled one sample (docs/results/h200x2.md).

How (torch's "whole-network capture" recipe):
warm the step up eagerly on a side stream, so lazily created NCCL communicators, the caching
allocator and autograd's buffers exist before the capture; then capture the calls. Capture errors are
thread-local: ProcessGroupNCCL's watchdog thread polls CUDA events while the main thread captures,
and under the default global mode such a call from another thread invalidates the capture.

Limits, checked by the caller: the step may not read device values on the host (``.item()``,
``.tolist()``, a synchronise) and its shapes and split sizes must be the same at every step, since a
replay repeats the captured launches verbatim. `Experiment.graph_blocker` names what rules a step out.
Collective recording (`capture`) sees the captured call once, never the replays.
"""

from __future__ import annotations

import torch


class NotCapturable(RuntimeError):
    """The step did something a CUDA graph cannot hold (the message says what CUDA refused)."""


def graphed(fn, device, warmup: int = 3, repeat: int = 1):
    """Capture `repeat` back-to-back calls of `fn()` on `device` into one CUDA graph; return a callable
    that replays it (nccl-tests' ``-G`` captures its loop of iterations the same way, so that the
    graph's own launch is paid once per sample, not once per call).

    `warmup` eager calls run first on a side stream (at least one: the capture needs every lazily
    created resource to exist). Every rank must call this at the same point with the same arguments,
    as the eager calls issue their collectives. A replay does the device work of `repeat` calls of
    `fn()` on the same memory (parameters updated in place, as eagerly); Python-side objects the step
    creates (a fresh ``.grad`` tensor, a record) are those of the capture and do not change.
    """
    if repeat < 1:
        raise ValueError(f"repeat {repeat} must be at least 1")
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"CUDA-graph replay needs a CUDA device, not {device}")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(repeat):
                fn()
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotCapturable(f"the step cannot be captured in a CUDA graph: {first}") from exc
    torch.cuda.synchronize(device)
    return graph.replay
