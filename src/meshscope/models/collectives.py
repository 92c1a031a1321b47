"""Collectives as named autograd Functions, in the manner of Megatron's mappings.py.

Each class states what it does in forward and backward, and its shape contract. Tensor dims are
named by suffix: ``x_BD`` is [B, D]; a group of size ``G`` on the mesh axis the caller passes.
All gathers and scatters work on dim 0 (tokens/batch), so shards are contiguous slabs.

Two gradient conventions exist for a loss computed identically on every TP rank (the design brief,
"Gradient semantics"):

* summed-loss (torch.distributed.nn semantics; the chapter's fingerprint, docs/chapter.md Q9): `AllReduceSum`,
  `ReduceScatterSum`, `AllGatherCat`. Backward treats the G replicated losses as G different
  summands, so shard gradients come out G times the true gradient: divide the loss by G.
* replicated-loss (Megatron's f/g conjugates, what DTensor does): `CopyToGroup` (f), `ReduceFromGroup`
  (g), `ReduceScatterSum`, `GatherSplitBackward` and its conjugate `SplitGatherBackward`. Correct
  gradients with the plain loss and fewer collectives.

`AllToAllV` moves rows between ranks with per-destination splits; its backward swaps the splits
(chapter Q21: why a variable-length all-to-all's backward swaps the split arrays).

Every Function is an identity on a one-rank group (no collective is issued), as the predictor assumes.
Backward collectives carry the forward's region label, so the captured ledger places them on the
layer and microbatch they belong to.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..capture.recorder import current_labels, region
from ..core.errors import UsageError
from ..core.groups import AxisGroup


def _all_reduce(x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    out = x.contiguous().clone()
    dist.all_reduce(out, group=group.pg)
    return out


def _all_gather_tensor(out, x, group):
    # torch 2.13 renamed the tensor-in/tensor-out collectives; older releases have only the old
    # names. Looked up per call, so that an active Capture sees it.
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, x, group=group)


def _reduce_scatter_tensor(out, x, group):
    getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, x, group=group)


def _all_gather(x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] * group.size, *x.shape[1:]))
    _all_gather_tensor(out, x, group=group.pg)
    return out


def _reduce_scatter(x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    if x.shape[0] % group.size:
        raise UsageError(f"reduce_scatter over {group.axis} needs dim 0 ({x.shape[0]}) divisible by {group.size}")
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // group.size, *x.shape[1:]))
    _reduce_scatter_tensor(out, x, group=group.pg)
    return out


def _local_chunk(x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    if x.shape[0] % group.size:
        raise UsageError(f"cannot split dim 0 ({x.shape[0]}) into {group.size} equal slabs over {group.axis}")
    rows = x.shape[0] // group.size
    me = group.local_rank(dist.get_rank())
    return x[me * rows:(me + 1) * rows].contiguous()


class _Labelled(torch.autograd.Function):
    """Base: remembers the forward's (region, microbatch) so backward collectives carry it."""

    @staticmethod
    def _save(ctx, group: AxisGroup) -> None:
        ctx.group = group
        ctx.labels = current_labels()

    @staticmethod
    def _forward(ctx, collective, x, group: AxisGroup):
        """Save the group and labels for backward; `collective(x, group)`, a copy on a one-rank group."""
        _Labelled._save(ctx, group)
        return collective(x, group) if group.size > 1 else x.clone()

    @staticmethod
    def _backward(ctx, collective, grad):
        """`collective(grad, group)` under the forward's region label; the identity on a one-rank group."""
        if ctx.group.size == 1:
            return grad
        with region(*ctx.labels):
            return collective(grad, ctx.group)


class AllReduceSum(_Labelled):
    """forward: all-reduce (sum); backward: all-reduce (sum) of the gradient.  [summed-loss]

    x_*: the same shape on every rank -> y_*: same shape, the sum over the group.
    Backward sums the G incoming gradients, which is right when the G losses downstream are
    different summands; with one loss replicated G times it yields G x the true gradient.
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup):
        return _Labelled._forward(ctx, _all_reduce, x, group)

    @staticmethod
    def backward(ctx, grad):
        return _Labelled._backward(ctx, _all_reduce, grad), None


class ReduceFromGroup(_Labelled):
    """forward: all-reduce (sum); backward: identity.  [replicated-loss, Megatron's "g"]

    x_*: partial sums -> y_*: replicated full sum. The gradient of a replicated loss w.r.t. the
    replicated output is already the gradient of every partial input.
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup):
        return _all_reduce(x, group) if group.size > 1 else x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class CopyToGroup(_Labelled):
    """forward: identity; backward: all-reduce (sum).  [replicated-loss, Megatron's "f"]

    x_*: replicated input of a column-parallel layer -> the same tensor. Each rank's shard sees only
    its part of the input gradient; the sum over the group is the full input gradient. Autograd
    prunes this backward (no collective) when the input needs no gradient.
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup):
        _Labelled._save(ctx, group)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _Labelled._backward(ctx, _all_reduce, grad), None


class ReduceScatterSum(_Labelled):
    """forward: reduce-scatter (sum) along dim 0; backward: all-gather along dim 0.  [both semantics]

    x_[N, *]: partial sums -> y_[N/G, *]: this rank's slab of the full sum (N divisible by G).
    The gradient of a slab is needed for the whole input on every rank: gather it.
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup):
        return _Labelled._forward(ctx, _reduce_scatter, x, group)

    @staticmethod
    def backward(ctx, grad):
        return _Labelled._backward(ctx, _all_gather, grad), None


class AllGatherCat(_Labelled):
    """forward: all-gather along dim 0; backward: reduce-scatter (sum) along dim 0.  [summed-loss]

    x_[N, *] -> y_[N*G, *], member i's slab at rows [i*N, (i+1)*N). This is torch.distributed.nn's
    NCCL backward (chapter Q10: AllGather's NCCL backward is a ReduceScatter): it sums the G replicated
    losses' gradients, hence G x the true gradient under a replicated loss.
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup):
        return _Labelled._forward(ctx, _all_gather, x, group)

    @staticmethod
    def backward(ctx, grad):
        return _Labelled._backward(ctx, _reduce_scatter, grad), None


class GatherSplitBackward(_Labelled):
    """forward: all-gather along dim 0; backward: keep this rank's slab (no collective).
    [replicated-loss, Megatron's gather_from_sequence_parallel_region for a replicated consumer]

    x_[N, *] -> y_[N*G, *]. With the loss replicated, every rank already holds the full gradient
    of y; the gradient of this rank's slab is its own slice.
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup):
        return _Labelled._forward(ctx, _all_gather, x, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.group.size == 1:
            return grad, None
        return _local_chunk(grad, ctx.group), None


class SplitGatherBackward(_Labelled):
    """forward: keep this rank's slab along dim 0 (no collective); backward: all-gather along dim 0.
    [replicated-loss, Megatron's scatter_to_sequence_parallel_region; the conjugate of GatherSplitBackward]

    x_[N*G, *] replicated -> y_[N, *], member i's rows [i*N, (i+1)*N). Each rank's slab gradient is
    only its part of the replicated tensor's gradient; gathering the G parts gives the whole of it
    (Megatron's pipeline scatter/gather: the sender of a split activation gathers its gradient).
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup):
        return _Labelled._forward(ctx, _local_chunk, x, group)

    @staticmethod
    def backward(ctx, grad):
        return _Labelled._backward(ctx, _all_gather, grad), None


def check_splits(splits, rows: int, group: AxisGroup, what: str) -> list[int]:
    """Validate split sizes before any collective is issued; one-line error otherwise."""
    splits = [int(s) for s in splits]
    if len(splits) != group.size:
        raise UsageError(f"{what} {splits} has {len(splits)} entries; the {group.axis} group has {group.size} ranks")
    if any(s < 0 for s in splits):
        raise UsageError(f"{what} {splits} has a negative entry")
    if sum(splits) != rows:
        raise UsageError(f"{what} {splits} sums to {sum(splits)} but the tensor has {rows} rows")
    return splits


class AllToAllV(_Labelled):
    """forward: all-to-all with uneven splits; backward: all-to-all with the splits swapped.

    x_[sum(input_splits), *] -> y_[sum(output_splits), *]. Rows [sum(input_splits[:j]), ...) go to
    member j; output rows arrive grouped by source member. Backward sends each gradient row back to
    where its forward row came from: what A sent B, B now sends A (input and output splits swap).
    Autograd prunes the backward when the input needs no gradient (chapter Q22: the 3-kernel MoE).
    """

    @staticmethod
    def forward(ctx, x, group: AxisGroup, input_splits, output_splits):
        _Labelled._save(ctx, group)
        input_splits = check_splits(input_splits, x.shape[0], group, "input_splits")
        output_splits = [int(s) for s in output_splits]
        if len(output_splits) != group.size or any(s < 0 for s in output_splits):
            raise UsageError(f"output_splits {output_splits} needs {group.size} entries >= 0 for the {group.axis} group")
        ctx.splits = (input_splits, output_splits)
        if group.size == 1:
            return x.clone()
        x = x.contiguous()
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x, output_split_sizes=output_splits, input_split_sizes=input_splits, group=group.pg)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.group.size == 1:
            return grad, None, None, None
        input_splits, output_splits = ctx.splits
        with region(*ctx.labels):
            grad = grad.contiguous()
            out = grad.new_empty((sum(input_splits), *grad.shape[1:]))
            dist.all_to_all_single(out, grad, output_split_sizes=input_splits, input_split_sizes=output_splits,
                                   group=ctx.group.pg)
        return out, None, None, None
