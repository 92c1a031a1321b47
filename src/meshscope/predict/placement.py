"""The layout-transition rules (docs/chapter.md, Q27, steps 1, 3 and 5).

A tensor spread over a group is in one of three placements: every rank holds all of it (`Replicate`),
a slab of one dim (`Shard`), or a summand of it (`Partial`). A change of placement is a collective
(`transition`): Partial -> Replicate all-reduce, Partial -> Shard reduce-scatter, Shard -> Replicate
all-gather; Replicate -> Shard (a local slice) and Shard -> Partial (a slab zero-filled is a summand)
are free (`collective`). Backward, the gradient of a tensor placed p is placed `grad_placement(p)`:
the duals AR <-> AR (or identity), AG <-> RS follow from applying the same rules to the gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

SUMMED, REPLICATED = "summed-loss", "replicated-loss"
"""Gradient semantics (docs/design.md): each TP rank's replicated loss is a separate summand
(torch.distributed.nn's view), or the TP ranks share one loss (Megatron's f/g, DTensor)."""
SEMANTICS = (SUMMED, REPLICATED)


@dataclass(frozen=True)
class Replicate:
    """Every rank of the group holds the full tensor."""


@dataclass(frozen=True)
class Shard:
    """Each rank holds the slab `dim` / G of the tensor."""

    dim: int


@dataclass(frozen=True)
class Partial:
    """Each rank holds a summand; the tensor is the sum over the group (pending reduction)."""


def transition(src, dst) -> str:
    """Step 3: the collective that turns placement `src` into `dst`."""
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return "all_reduce"
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return "reduce_scatter"
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return "all_gather"
    raise ValueError(f"no single collective turns {src} into {dst}")


def collective(src, dst) -> str | None:
    """Step 3 with the free cases: no change, Replicate -> Shard (a local slice) and Shard -> Partial
    (the slab zero-filled is a summand, which a pipeline's scatter/gather backward needs)."""
    if src == dst or (isinstance(src, Replicate) and isinstance(dst, Shard)):
        return None
    if isinstance(src, Shard) and isinstance(dst, Partial):
        return None
    return transition(src, dst)


def grad_placement(p, semantics: str):
    """Step 5: the placement of the gradient of a tensor placed `p`.

    A partial sum's summands each need the whole gradient: Replicate. A shard's gradient is a shard.
    A replicated tensor's gradient is replicated under replicated-loss (one loss), but a partial sum
    under summed-loss (each rank's loss is a separate summand).
    """
    if isinstance(p, Partial):
        return Replicate()
    if isinstance(p, Replicate) and semantics == SUMMED:
        return Partial()
    return p


def local_numel(shape: tuple[int, ...], p, group_size: int) -> int:
    """Step 4's element count on one rank: a shard holds 1/G of the tensor, the others all of it."""
    n = 1
    for d in shape:
        n *= d
    return n // group_size if isinstance(p, Shard) else n
