"""A compute segment's time on a GPU, by the roofline: matmuls at their dtype's peak, the rest at HBM bandwidth.

A segment (`capture.work`) holds the matmul FLOPs per dtype, the bytes those matmuls read and wrote, and the
bytes every other op read and wrote. Matmuls run at ``peak(dtype) x matmul_efficiency``, fused attention kernels
at ``x attention_efficiency`` (flash attention reaches less of the peak than a large matmul), unless their bytes take
longer at ``hbm_bandwidth x memory_efficiency`` (a skinny matmul is memory-bound); every other op is timed by
its bytes (elementwise ops, norms, softmax, optimizer updates: memory-bound on any GPU of the cluster specs).
What this leaves out, and docs/forecast.md measures: kernel launch gaps between small ops, a matmul's
efficiency below the large-matmul ceiling at small shapes, and fused kernels that move fewer bytes than the
ops they replace (torch.compile).
"""

from __future__ import annotations

from ..capture.work import ATTENTION, HOST_WORK
from .cluster import GpuSpec

HALF = ("bfloat16", "float16")


def peak_flops(gpu: GpuSpec, dtype: str, tf32: bool) -> float:
    """The dense tensor-core peak a matmul of `dtype` runs at: bf16/fp16 at the bf16 peak, fp32 at TF32's where
    the job allows TF32 (``torch.backends.cuda.matmul.allow_tf32``, off by default since torch 1.12) else at the
    CUDA cores' fp32 peak; 8-bit float matmuls at twice the bf16 peak (Hopper's FP8 tensor cores)."""
    if dtype in HALF:
        return gpu.bf16_flops
    if dtype == "float32":
        return gpu.tf32_flops if tf32 else gpu.fp32_flops
    if dtype.startswith("float8"):
        return 2 * gpu.bf16_flops
    return gpu.fp32_flops


MATMUL, MEMORY_BOUND, MEASURED, HOST = "matmul", "memory-bound", "measured", "host"
"""What a segment's seconds are bound by (`segment_terms`), beside `capture.work.ATTENTION`: the classes a step's
kernels fall in on a GPU's profile too (benchmarks/forecast_step_kernels.py), so each can be held to its own; and
the host's work (CPU offload's optimizer step), which is no GPU's."""


def segment_terms(item, gpu: GpuSpec, tf32: bool = False) -> dict[str, float]:
    """Seconds of one ``["c", phase, {dtype: FLOPs}, matmul bytes, other bytes, stream]`` segment on `gpu`, by what
    bounds them: `MATMUL` and `ATTENTION` FLOPs (an attention kernel's keyed ``"<dtype> attention"``, at
    `GpuSpec.attention_efficiency`), or the matmuls' bytes where those take longer (the time shared out between the
    two as their FLOPs' was), and `MEMORY_BOUND` for every other op's bytes; a measured segment (``--measure-on``:
    its seconds as a seventh field) is `MEASURED`, what it took; the host's work in a segment
    (``["h", phase, bytes]``) is `HOST`, its bytes at `GpuSpec.host_bandwidth`."""
    if item[0] == HOST_WORK:
        return {HOST: item[2] / gpu.host_bandwidth}
    if len(item) > 6:
        return {MEASURED: item[6]}
    _, _, flops, mm_bytes, other_bytes, _ = item
    bandwidth = gpu.hbm_bandwidth * gpu.memory_efficiency
    terms: dict[str, float] = {}
    for key, f in flops.items():
        dtype, _, kind = key.partition(" ")
        which = ATTENTION if kind == ATTENTION else MATMUL
        efficiency = gpu.attention_efficiency if which == ATTENTION else gpu.matmul_efficiency
        terms[which] = terms.get(which, 0.0) + f / (peak_flops(gpu, dtype, tf32) * efficiency)
    flop_s, bytes_s = sum(terms.values()), mm_bytes / bandwidth
    if bytes_s > flop_s:  # skinny matmuls: their bytes bound them
        terms = {k: t * bytes_s / flop_s for k, t in terms.items()} if flop_s else {MATMUL: bytes_s}
    if other_bytes:
        terms[MEMORY_BOUND] = other_bytes / bandwidth
    return terms


def segment_seconds(item, gpu: GpuSpec, tf32: bool = False) -> float:
    """Seconds of one segment (or the host's work in one) on `gpu`: its `segment_terms` together."""
    return sum(segment_terms(item, gpu, tf32).values())
