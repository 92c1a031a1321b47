"""The predictor's shared machinery: the seed's six steps as reusable rules.

"从模型 Shape 预测 Trace 的方法": (1) annotate each tensor's layout, (2) op shapes, (3) map layout
changes to collectives, (4) multiply by dtype size (input vs output bytes), (5) walk the autograd graph
backwards applying the duals and pruning edges whose input needs no gradient, (6) add the orthogonal
DP gradient sync. Each parallel mode's predictor walks its own model symbolically with these rules;
none of them keeps a table of per-experiment constants.

`Ledger` assigns ``seq`` per rank and group (the order the ranks must issue them), so a mode emits
events in issue order and the ledger can be diffed against a capture.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """Step 3: the collective that turns layout `src` into `dst` (seed's table)."""
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return "all_reduce"
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return "reduce_scatter"
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return "all_gather"
    raise ValueError(f"no single collective turns {src} into {dst}")
