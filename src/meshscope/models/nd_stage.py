"""A pipeline stage whose layer is itself parallel: the stage program over any stage computation, and
Megatron's scatter/gather of the boundary tensor over the stage's TP group.

The seed ran each mode alone and noted that "真正3D并行会再增加独立PP坐标": in composed N-D training a
pipeline stage is a TP (or MoE) layer, and its boundary P2P goes between the ranks of one pp group, i.e.
the ranks with the same tp and dp coordinates. The stage's output is replicated over its TP group, so
every TP rank would send the same bytes. Megatron's ``scatter_gather_tensors_in_pipeline`` sends 1/T
of it instead and all-gathers it in the receiver's TP group; the gradient travels back the same way.

Placements of that boundary (seed step 1; the TP rules of `experiments.tp` turn them into collectives):

  boundary     placement             summed-loss                     replicated-loss
  pp.scatter   Replicate -> Shard(0)  slice; bwd zero-fill: a shard   SplitGatherBackward: slice; bwd
               (sender)               is a partial sum, which the     all-gather (the gradient must be
                                      row output's AR backward sums   whole before the identity "g")
  pp.gather    Shard(0) -> Replicate  AllGatherCat: AG; bwd RS of     GatherSplitBackward: AG; bwd
               (receiver)             the partial input gradient      keep own slab

`run_stage_program` generalises `pipeline.stage.run_program` from one Linear to any stage computation
(a TP MLP, an MoE layer, with or without the scatter/gather), executing the same schedule program over
the same `StageBoundary`.

Legend: b microbatch rows, D model dim, T tp size, bs = b / T rows of one boundary slab.
"""

from __future__ import annotations

import torch

from ..capture import region
from ..collectives import AllGatherCat, GatherSplitBackward, SplitGatherBackward
from ..groups import AxisGroup
from ..predict import Replicate, Shard
from .pipeline import Exchange, Message, StageBoundary
from .tp_mlp import SUMMED, Boundary

PP_SCATTER, PP_GATHER = "pp.scatter", "pp.gather"
"""Region labels of the boundary tensor's split (sender) and gather (receiver) over the TP group."""


def scatter(y_bD: torch.Tensor, group: AxisGroup, rank: int, semantics: str) -> torch.Tensor:
    """The slab y_bsD of the replicated stage output that this TP rank sends downstream."""
    with region(PP_SCATTER):
        if semantics == SUMMED:  # plain slice: its zero-filled gradient is a summand of the AR backward
            return y_bD.chunk(group.size)[group.local_rank(rank)]
        return SplitGatherBackward.apply(y_bD, group)


def gather(x_bsD: torch.Tensor, group: AxisGroup, semantics: str) -> torch.Tensor:
    """The replicated stage input x_bD rebuilt from the slabs the TP group received."""
    with region(PP_GATHER):
        return (AllGatherCat if semantics == SUMMED else GatherSplitBackward).apply(x_bsD, group)


def scatter_gather_boundaries(rows: int, hidden: int, receive: bool, send: bool) -> tuple[list, list]:
    """(before, after): the placement changes a stage adds around its layer for scatter/gather P2P.

    The receiver's input slab is a leaf that requires grad (it came from the previous stage), so the
    gather's backward edge always exists; so does the scatter's, whose input is the layer's output.
    """
    shape = (rows, hidden)
    before = [Boundary(PP_GATHER, shape, Shard(0), Replicate(), needs_grad=True)] if receive else []
    after = [Boundary(PP_SCATTER, shape, Replicate(), Shard(0), needs_grad=True)] if send else []
    return before, after


def run_stage_program(prog, boundary: StageBoundary, forward, inputs) -> tuple[list, list, int]:
    """Execute one training step of a stage's program; return (outputs, losses, peak stash).

    forward(i, x) -> (y, out): microbatch i's stage output y (recorded) and `out`, the tensor sent
    downstream or, on the last stage, microbatch i's loss. x is inputs[i] on the first stage and the
    received activation, made a fresh leaf, elsewhere (seed: send/recv move bytes, not graphs).
    """
    stage = boundary.stage
    first, last = stage == 0, stage == boundary.pp - 1
    inbox: dict[Message, torch.Tensor] = {}
    outbox: dict[Message, torch.Tensor] = {}
    stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    outputs: list = [None] * len(inputs)
    losses: list = [None] * len(inputs)
    peak = 0
    for item in prog:
        if isinstance(item, Exchange):
            inbox.update(boundary.exchange(item, outbox))
            continue
        i = item.microbatch
        if item.kind == "F":
            x = inputs[i] if first else inbox.pop(Message("activation", i, stage - 1)).requires_grad_(True)
            with region(f"stage{stage}", i):  # every collective of the layer carries microbatch i
                y, out = forward(i, x)
            outputs[i] = y.detach()
            if last:
                losses[i] = out.detach()
            else:
                outbox[Message("activation", i, stage)] = out.detach()
            stash[i] = (x, out)
            peak = max(peak, len(stash))
        else:
            x, out = stash.pop(i)
            if last:
                out.backward()
            else:  # continue the local graph with the gradient the next stage sent back
                out.backward(inbox.pop(Message("gradient", i, stage)))
            if not first:
                outbox[Message("gradient", i, stage - 1)] = x.grad
    if inbox or outbox or stash:
        raise RuntimeError(f"stage {stage} ended the step with unconsumed messages or activations "
                           f"({len(inbox)} received, {len(outbox)} unsent, {len(stash)} stashed)")
    return outputs, losses, peak
