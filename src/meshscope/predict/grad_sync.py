"""The data-parallel gradient sync of one rank's dense weights, in each flavour `volume` knows.

- ``per-tensor``: one all-reduce per weight tensor (meshscope's own `sync_grads`, no bucketing).
- ``ddp`` (torch's DistributedDataParallel, Li et al. 2020): gradients are copied into buckets
  filled in the order they become ready in the backward (the reverse of registration order:
  the output layer first, the embeddings last), one all-reduce per bucket. A bucket closes once it
  holds at least its cap: the first at 1 MiB and the rest at 25 MiB by default, or every one at
  ``bucket_cap_mb`` when it is given (`ModelSpec.bucket_mb`). These are the buckets DDP rebuilds
  after its first iteration from the observed order; the first iteration itself runs one bucket.
- ``fsdp`` (FSDP2 ``fully_shard`` of every layer and then of the root, ZeRO-3 after Rajbhandari
  et al. 2020): per unit, one all-gather of its parameters before its forward and, for the layers,
  again before their backward (the root keeps its parameters between forward and backward), and
  one reduce-scatter of its gradients. Each tensor is split by dim 0 over the group, padded to a
  multiple of it: an all-gather outputs and a reduce-scatter takes sum(ceil(d0 / n) n x rest).

The sync runs once per step (phase optimizer: after the last microbatch's backward, whatever phase
the framework issues it in; earlier microbatches skip it, as ``no_sync`` and pipeline schedules
do); FSDP's all-gathers run for every microbatch. Returned as (op, phase, region, count, size)
rows for `volume`, sizes in the nccl-tests convention (all-gather output, reduce-scatter input).
"""

from __future__ import annotations

from .model_spec import ModelSpec
from .weights import Weight

MIB = 1024 * 1024
DDP_FIRST_BUCKET = 1 * MIB
"""torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the first bucket's cap when bucket_cap_mb is not given."""
DDP_BUCKET = 25 * MIB
"""DDP's default bucket_cap_mb (25)."""


def grad_sync(spec: ModelSpec, weights: list[Weight], dp: int) -> list[tuple[str, str, str, int, int]]:
    """(op, phase, region, count, size) of the sync of `weights` over a data-parallel group of `dp`."""
    e = spec.elem
    if spec.data_parallel == "per-tensor":
        return _per_tensor(weights, e)
    if spec.data_parallel == "ddp":
        return [("all_reduce", "optimizer", f"bucket {i}", 1, size)
                for i, size in enumerate(ddp_buckets([w.numel * e for w in reversed(weights)], spec.bucket_mb))]
    units: dict[int | None, int] = {}
    for w in weights:
        units[w.unit] = units.get(w.unit, 0) + -(-w.dim0 // dp) * dp * (w.numel // w.dim0) * e
    m = spec.microbatches
    out = []
    for unit, size in units.items():
        region = "root" if unit is None else f"layer {unit}"
        out.append(("all_gather", "forward", region, m, size))
        if unit is not None:
            out.append(("all_gather", "backward", region, m, size))
        out.append(("reduce_scatter", "optimizer", region, 1, size))
    return out


def _per_tensor(weights: list[Weight], e: int) -> list[tuple[str, str, str, int, int]]:
    """One all-reduce per tensor, counted per (name, size)."""
    counted: dict[tuple[str, int], int] = {}
    for w in weights:
        counted[(w.name, w.numel * e)] = counted.get((w.name, w.numel * e), 0) + 1
    return [("all_reduce", "optimizer", name, n, size) for (name, size), n in counted.items()]


def ddp_buckets(sizes: list[int], bucket_mb: float | None) -> list[int]:
    """Bytes of each DDP bucket for tensors of `sizes` bytes in gradient-ready order
    (torch's ``compute_bucket_assignment_by_size``: a bucket closes once it reaches its cap)."""
    first, cap = (DDP_FIRST_BUCKET, DDP_BUCKET) if bucket_mb is None else (int(bucket_mb * MIB),) * 2
    buckets, filled, limit = [], 0, first
    for size in sizes:
        filled += size
        if filled >= limit:
            buckets.append(filled)
            filled, limit = 0, cap
    return buckets + ([filled] if filled else [])
