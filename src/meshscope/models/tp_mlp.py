"""The tensor-parallel MLP of the chapter, with its sequence-parallel variant, under both gradient semantics.

Chapter Q4 and Q5 (tensor-parallel matrix sharding): Y = GELU(X W1^T) W2^T with W1 [H, D] column-parallel
(weight dim 0 sharded, so each rank computes a feature shard of the hidden activation and no all-gather is needed
before the next layer) and W2 [D, H] row-parallel (weight dim 1 sharded, so each rank's output is a
*partial* sum of the full output). The row output then becomes
  - Replicate through an all-reduce (``tp_ar``), or
  - a batch Shard(0) through a reduce-scatter, gathered back for a replicated loss (``tp_sp``,
    chapter Q12, the sequence-parallel experiment: the RS/AG pair is kept inside a trainable loop on purpose).

Which collective Function sits at each boundary depends on the gradient semantics (design brief,
"Gradient semantics"); the forward collectives are the same, the backward ones differ:

  boundary     summed-loss (torch.distributed.nn)      replicated-loss (Megatron f/g)
  fc1.in       nothing (X.grad stays a partial sum)    CopyToGroup: AR in backward, if X needs grad
  fc2.out      AllReduceSum: AR fwd, AR bwd            ReduceFromGroup: AR fwd, identity bwd
  sp.scatter   ReduceScatterSum: RS fwd, AG bwd        ReduceScatterSum: RS fwd, AG bwd
  sp.gather    AllGatherCat: AG fwd, RS bwd            GatherSplitBackward: AG fwd, slice bwd

Under summed-loss every rank's loss counts as a separate summand, so the loss must be divided by T.
Measured with this model (T=2, D=512, H=1024, gloo, FP32), loss NOT divided: the norm of every shard's
weight gradient is 2.0000 x the norm of its slice of the unsharded gradient, for tp_ar (batch 32) and
tp_sp (batch 128) alike; the max abs error is 3.2e-3 (tp_ar) / 1.8e-3 (tp_sp), far above the 2e-5
tolerance, while outputs and DP replicas stay right. Divided, the error is below 1e-9.

`boundaries` annotates the same model for the predictor (chapter Q27, step 1: the placement of each
activation where it changes), and `shard_shapes` lists the parameters the DP sync will visit.

Legend: B batch rows of one DP replica, D model dim (--hidden), H FFN dim (--ffn), T TP size,
Hs = H / T hidden features of one shard, Bs = B / T rows of one sequence shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..capture.recorder import region
from ..core.groups import AxisGroup
from ..predict.edges import PlacementEdge
from ..predict.placement import REPLICATED, SUMMED, Partial, Replicate, Shard
from .collectives import AllGatherCat, AllReduceSum, CopyToGroup, GatherSplitBackward, ReduceFromGroup, ReduceScatterSum

FC1_IN, FC2_OUT, SP_SCATTER, SP_GATHER = "fc1.in", "fc2.out", "sp.scatter", "sp.gather"
"""Region labels of the four layout boundaries (captured and predicted events carry them)."""

FUNCTIONS = {
    SUMMED: {FC1_IN: None, FC2_OUT: AllReduceSum, SP_SCATTER: ReduceScatterSum, SP_GATHER: AllGatherCat},
    REPLICATED: {FC1_IN: CopyToGroup, FC2_OUT: ReduceFromGroup, SP_SCATTER: ReduceScatterSum,
                 SP_GATHER: GatherSplitBackward},
}
"""The collective Function each semantics puts at each boundary (None: no collective at all)."""


def _shard(full: torch.Tensor, dim: int, group: AxisGroup, rank: int) -> torch.Tensor:
    """This rank's slab of `full` along `dim` (the chapter's ``W.chunk(tp_size, dim)[tp_rank]``)."""
    return full.chunk(group.size, dim=dim)[group.local_rank(rank)].clone()


def _apply(fn, x: torch.Tensor, group: AxisGroup, label: str) -> torch.Tensor:
    """Run boundary Function `fn` under its region label; `None` means the tensor passes untouched."""
    if fn is None:
        return x
    with region(label):
        return fn.apply(x, group)


class ColumnParallelLinear(nn.Module):
    """Linear whose weight [out, in] is sharded on dim 0 (Megatron ColumnParallelLinear, PyTorch
    ColwiseParallel): replicated x_BI -> feature shard y_B(O/T). `input_fn` is the boundary Function on
    the replicated input (Megatron's "f" under replicated-loss; None under summed-loss)."""

    def __init__(self, weight_OI: torch.Tensor, group: AxisGroup, rank: int, input_fn):
        super().__init__()
        self.weight = nn.Parameter(_shard(weight_OI, 0, group, rank))
        self.group, self.input_fn = group, input_fn

    def forward(self, x_BI: torch.Tensor) -> torch.Tensor:
        return F.linear(_apply(self.input_fn, x_BI, self.group, FC1_IN), self.weight)


class RowParallelLinear(nn.Module):
    """Linear whose weight [out, in] is sharded on dim 1 (Megatron RowParallelLinear, PyTorch
    RowwiseParallel): feature shard x_B(I/T) -> partial sum y_BO, one summand per TP rank. The caller
    decides the output placement (chapter Q7: row parallel is not always an AllReduce)."""

    def __init__(self, weight_OI: torch.Tensor, group: AxisGroup, rank: int):
        super().__init__()
        self.weight = nn.Parameter(_shard(weight_OI, 1, group, rank))

    def forward(self, x_BIs: torch.Tensor) -> torch.Tensor:
        return F.linear(x_BIs, self.weight)


class TensorParallelMLP(nn.Module):
    """Y = GELU(X W1^T) W2^T over a TP group, with a replicated output on every rank.

    sequence_parallel False: partial Y -> all-reduce -> Y (``tp_ar``).
    sequence_parallel True: partial Y -> reduce-scatter -> y_BsD -> all-gather -> Y (``tp_sp``).
    """

    def __init__(self, w1_HD: torch.Tensor, w2_DH: torch.Tensor, group: AxisGroup, rank: int,
                 semantics: str, sequence_parallel: bool):
        super().__init__()
        self.fns = FUNCTIONS[semantics]
        self.group, self.semantics, self.sequence_parallel = group, semantics, sequence_parallel
        self.fc1 = ColumnParallelLinear(w1_HD, group, rank, self.fns[FC1_IN])
        self.fc2 = RowParallelLinear(w2_DH, group, rank)

    def forward(self, x_BD: torch.Tensor) -> torch.Tensor:
        partial_BD = self.fc2(F.gelu(self.fc1(x_BD)))
        if not self.sequence_parallel:
            return _apply(self.fns[FC2_OUT], partial_BD, self.group, FC2_OUT)
        y_BsD = _apply(self.fns[SP_SCATTER], partial_BD, self.group, SP_SCATTER)
        return _apply(self.fns[SP_GATHER], y_BsD, self.group, SP_GATHER)

    def loss(self, y_BD: torch.Tensor) -> torch.Tensor:
        """The chapter's loss ``output.square().mean()``, replicated on every TP rank; divided by T under
        summed-loss, whose backward adds the T replicas' gradients (2.000 x wrong at T=2 otherwise)."""
        scale = self.group.size if self.semantics == SUMMED else 1
        return y_BD.square().mean() / scale


def shard_shapes(hidden: int, ffn: int, tp: int) -> list[tuple[str, tuple[int, int]]]:
    """(parameter name, local shape) of every parameter, in `named_parameters` order."""
    return [("fc1.weight", (ffn // tp, hidden)), ("fc2.weight", (hidden, ffn // tp))]




def boundaries(batch: int, hidden: int, sequence_parallel: bool, input_grad: bool) -> list[PlacementEdge]:
    """The MLP's placement changes in forward order (same for both semantics)."""
    shape = (batch, hidden)
    out = [PlacementEdge(FC1_IN, shape, Replicate(), Replicate(), needs_grad=input_grad, grad_in=Partial())]
    if sequence_parallel:
        out += [PlacementEdge(SP_SCATTER, shape, Partial(), Shard(0), needs_grad=True),
                PlacementEdge(SP_GATHER, shape, Shard(0), Replicate(), needs_grad=True)]
    else:
        out.append(PlacementEdge(FC2_OUT, shape, Partial(), Replicate(), needs_grad=True))
    return out
