"""Timed samples of one training step on every rank: a barrier and a device synchronise before each
sample, no recording while sampling, optionally K back-to-back steps or one CUDA-graph replay per
sample; per sample the host clock and, on GPU, CUDA events."""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from ..capture.recorder import suspended
from .cuda_graph import graphed


@dataclass(frozen=True)
class StepTimes:
    """One rank's timed samples, warmup discarded."""

    host_s: list[float]
    """Host wall time per sample (perf_counter), per step: the sample's time / steps_per_sample."""
    gpu_s: list[float] | None
    """GPU time per sample from CUDA events, per step likewise; None on CPU."""
    steps_per_sample: int
    method: str
    """How the samples were taken, in words, for the report (the method is part of the figure)."""

    def to_json(self) -> dict:
        return asdict(self)


def time_steps(fn, samples: int, *, warmup: int = 3, device=None, group=None, steps_per_sample: int = 1,
               cuda_graph: bool = False) -> StepTimes:
    """Time `fn()` on this rank: `samples` samples after `warmup` discarded ones.

    Before each sample every rank of `group` (None: the default group; no barrier when
    torch.distributed is not initialised) meets at a barrier, and on a GPU the device is synchronised,
    so a sample starts from an idle device on all ranks at once. A sample runs `fn` `steps_per_sample`
    times back to back and its time is divided by that number: with 1 this is per-step timing; with K
    it is "the mean of K back-to-back steps per sample", which the design brief proposes where eager
    per-step CV on the H200 stayed at 17-20 % however many steps were taken. With `cuda_graph` the
    sample's `steps_per_sample` steps are captured once, after `warmup` eager steps, into one CUDA
    graph (`cuda_graph.graphed`) and each sample is one replay: the device-side steps, without Python
    or launch overhead. The method string says which was used. Host time always includes waiting for the device (synchronise before the clock stops);
    GPU time is CUDA-event time between the first step's start and the last step's end.

    No collective is recorded while sampling (`capture.suspended`): the recording's own cost would be
    part of the figure. Callers mark what they time in the flight log instead (`RankContext.progress`).
    """
    if samples < 1 or warmup < 0 or steps_per_sample < 1:
        raise ValueError(f"need samples >= 1, warmup >= 0, steps_per_sample >= 1; got {samples}, {warmup}, {steps_per_sample}")
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda_graph and not cuda:
        raise ValueError(f"CUDA-graph timing needs a CUDA device, not {device}")
    host, gpu = [], [] if cuda else None
    # A garbage-collection pause inside a sample is noise of the harness, not of the step: collect
    # now and keep the collector off while sampling (re-enabled after, whatever happens).
    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with suspended():
            sample = graphed(fn, device, warmup, steps_per_sample) if cuda_graph else None
            for i in range(warmup + samples):
                if dist.is_available() and dist.is_initialized():
                    dist.barrier(group=group)
                if cuda:
                    torch.cuda.synchronize(device)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                t0 = time.perf_counter()
                if sample is not None:
                    sample()
                else:
                    for _ in range(steps_per_sample):
                        fn()
                if cuda:
                    end.record()
                    end.synchronize()
                t1 = time.perf_counter()
                if i >= warmup:
                    host.append((t1 - t0) / steps_per_sample)
                    if cuda:
                        gpu.append(start.elapsed_time(end) / 1e3 / steps_per_sample)
    finally:
        if gc_was_on:
            gc.enable()
    return StepTimes(host, gpu, steps_per_sample, method_text(samples, warmup, steps_per_sample, cuda, cuda_graph))


def method_text(samples: int, warmup: int, steps_per_sample: int, cuda: bool, cuda_graph: bool = False) -> str:
    """How `time_steps` took its samples, in words (the method is part of the figure)."""
    harness = ("a barrier before each sample" + (" and a device synchronise" if cuda else "")
               + ", garbage collector off and no collective recording while sampling")
    step = (f"each sample one replay of a CUDA graph of its {steps_per_sample} step(s), captured after {max(warmup, 1)} "
            f"eager steps (device time: no Python or launch overhead)" if cuda_graph else "eager steps")
    if steps_per_sample == 1:
        return f"per step: {samples} steps after {warmup} warmup, {step}, {harness}"
    return (f"per sample of {steps_per_sample} back-to-back steps, time / {steps_per_sample}: {samples} samples "
            f"after {warmup} warmup, {step}, {harness}")
