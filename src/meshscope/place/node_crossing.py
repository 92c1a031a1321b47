"""Which groups of a rank layout cross a node boundary: the group math of the placement advisor (`place`).

The chapter's engineering principles of topology mapping (docs/chapter.md, Q28) judge a mapping by real
group membership: a group whose ranks sit on two nodes talks over the inter-node link. Nodes are equal
blocks of consecutive ranks (node = rank // gpus_per_node); pipeline stages are the pp coordinate, so
crossings are also counted per stage and, for pp itself, per stage boundary.

Group math is per group, never per rank in Python: a single axis's groups are arithmetic progressions
(stride, size) read from `Layout.group_of(axis, 0)`; the groups' first ranks are the ranks whose
coordinates on the axis are zero, found with one vectorised pass (numpy) per distinct group set.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..core.errors import UsageError
from ..core.mesh import Layout

AXIS_MEMBERS = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "dp-cp": ("dp", "cp"), "pp": ("pp",),
                "ep": ("ep",), "etp": ("etp",), "edp": ("edp",)}
"""The groups a placement is judged by, as single axes whose (stride, size) spans combine."""


def axis_spans(layout: Layout, axis: str) -> tuple[tuple[int, int], ...]:
    """(stride, size) of each single axis in `axis`, sorted, adjacent ones merged: a canonical key of
    the axis's group set (two orders give the same groups exactly when these agree)."""
    pairs = []
    for a in AXIS_MEMBERS[axis]:
        offsets = layout.group_of(a, 0)
        if len(offsets) > 1:
            pairs.append((offsets[1], len(offsets)))
    merged: list[tuple[int, int]] = []
    for stride, size in sorted(pairs):
        if merged and merged[-1][0] * merged[-1][1] == stride:
            merged[-1] = (merged[-1][0], merged[-1][1] * size)
        else:
            merged.append((stride, size))
    return tuple(merged)


def crossing_groups(world: int, gpus_per_node: int, spans: tuple[tuple[int, int], ...]) -> int:
    """How many groups of the axis with these (stride, size) spans hold ranks of more than one node."""
    return sum(crossing_per_stage(world, gpus_per_node, spans, (1, 1)))


@lru_cache(maxsize=4096)
def crossing_per_stage(world: int, gpus_per_node: int, spans: tuple[tuple[int, int], ...],
                       stage_span: tuple[int, int]) -> tuple[int, ...]:
    """Per pipeline stage, how many of the axis's groups cross nodes; stage_span = (stride, pp) of pp.

    A group is its first rank b (every span coordinate zero) plus the offsets; its ranks run from b to
    b + sum((size - 1) * stride), so it crosses exactly when those two ends sit on different nodes. An
    axis other than pp varies no pp coordinate, so the group's stage is b's.
    """
    ranks = np.arange(world, dtype=np.int64)
    first = np.ones(world, dtype=bool)
    for stride, size in spans:
        first &= (ranks // stride) % size == 0
    bases = ranks[first]
    last = bases + sum((size - 1) * stride for stride, size in spans)
    crossing = bases[bases // gpus_per_node != last // gpus_per_node]
    stride, pp = stage_span
    return tuple(int(n) for n in np.bincount((crossing // stride) % pp, minlength=pp))


@lru_cache(maxsize=4096)
def crossing_boundaries(world: int, gpus_per_node: int, stage_span: tuple[int, int]) -> tuple[int, ...]:
    """Per stage boundary b (stage b to b + 1), how many rank pairs (r, r + stride) sit on two nodes."""
    stride, pp = stage_span
    ranks = np.arange(world, dtype=np.int64)
    senders = ranks[(ranks // stride) % pp < pp - 1]
    crossing = senders[senders // gpus_per_node != (senders + stride) // gpus_per_node]
    return tuple(int(n) for n in np.bincount((crossing // stride) % pp, minlength=pp - 1))


def check_nodes(world: int, gpus_per_node: int) -> None:
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1 or world % gpus_per_node:
        raise UsageError(f"--gpus-per-node {gpus_per_node} does not divide --world {world}; nodes must be "
                         f"equal: pick a divisor of {world}")
