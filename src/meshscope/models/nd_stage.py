"""A pipeline stage whose layer is itself parallel: Megatron's scatter/gather of the boundary tensor
over the stage's TP group.

The chapter ran each mode alone and noted that real 3-D parallelism adds an independent PP coordinate: in
composed N-D training a pipeline stage is a TP (or MoE) layer, and its boundary P2P goes between the ranks of
one pp group, i.e. the ranks with the same tp and dp coordinates. The stage's output is replicated over its TP
group, so every TP rank would send the same bytes. Megatron's ``scatter_gather_tensors_in_pipeline`` sends 1/T
of it instead and all-gathers it in the receiver's TP group; the gradient travels back the same way.

Placements of that boundary (chapter Q27, step 1; the TP rules of `experiments.tp` turn them into collectives):

  boundary     placement             summed-loss                     replicated-loss
  pp.scatter   Replicate -> Shard(0)  slice; bwd zero-fill: a shard   SplitGatherBackward: slice; bwd
               (sender)               is a partial sum, which the     all-gather (the gradient must be
                                      row output's AR backward sums   whole before the identity "g")
  pp.gather    Shard(0) -> Replicate  AllGatherCat: AG; bwd RS of     GatherSplitBackward: AG; bwd
               (receiver)             the partial input gradient      keep own slab

The stage itself (a TP MLP, an MoE layer, with or without the scatter/gather) runs through the same
`pipeline.run_program` and `StageBoundary` as the plain pipeline, with its own forward.

Legend: b microbatch rows, D model dim, T tp size, bs = b / T rows of one boundary slab.
"""

from __future__ import annotations

import torch

from ..capture.recorder import region
from ..core.groups import AxisGroup
from ..predict.edges import PlacementEdge
from ..predict.placement import SUMMED, Replicate, Shard
from .collectives import AllGatherCat, GatherSplitBackward, SplitGatherBackward

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
    before = [PlacementEdge(PP_GATHER, shape, Shard(0), Replicate(), needs_grad=True)] if receive else []
    after = [PlacementEdge(PP_SCATTER, shape, Replicate(), Shard(0), needs_grad=True)] if send else []
    return before, after
