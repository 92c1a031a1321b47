"""The mesh axes of groups a job created without a name, recovered from their members alone.

`core.axes` labels a group by its description, and some frameworks give none: picotron builds its
tp, cp, pp and dp groups with ``dist.new_subgroups_by_enumeration`` over a dp x pp x cp x tp grid
(huggingface/picotron at 59714b1, ``picotron/process_group_manager.py``), DeepSpeed with plain
``dist.new_group(ranks)``; every such group reads ``group``, and the calls of all its axes land in
one row. The members say more than the name would:

- a group of every rank is the world (DeepSpeed's ZeRO over the whole world makes such copies);
- the groups that are arithmetic progressions of one stride and one size, and together partition the
  world, are one mesh axis (rank = sum of coordinate x stride, `core.mesh_fit`'s arithmetic). The
  axes whose strides chain from 1, each the product of the sizes inside it, form a mesh, named by
  stride: ``axis0`` innermost, ``axis1`` next...; the groups of every rank that varies along several
  of them at once are that product (``axis1-axis2``, picotron's ``pp_dp``; ``axis0-axis2``, its
  ``cp_dp``, which is no progression), fastest first as `core.axes` joins Megatron's;
- a convention is claimed only where the creations prove it: picotron's six families created in its
  order, group for group (`picotron_sequence`), name the axes ``tp``, ``cp``, ``pp``, ``dp``,
  ``cp-dp`` and ``pp-dp``, which `mesh_fit` then fits as a `Layout`.

Anything else (groups that overlap, leave ranks out, or are no progression and no product of the
mesh's axes) stays ``group``. A group the job did name, with a description meshscope does not know
(subgroups.py's ``gloo_pairs``), is the job's own: its members are never inferred, since calls on it
read ``group`` too and cannot be told from an unnamed group's with the same members.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from math import prod

from .axes import GROUP, axis_of
from .events import WORLD
from .mesh_fit import progression

Members = tuple[int, ...]

PICOTRON = ("tp", "cp", "pp", "dp", "cp-dp", "pp-dp")
"""picotron's groups in the order its ``ProcessGroupManager.__init__`` creates them (``tp_group``,
``cp_group``, ``pp_group``, ``dp_group``, ``cp_dp_group``, ``pp_dp_group``), as axis labels."""


@dataclass(frozen=True)
class Inferred:
    """What the members of a job's unnamed groups say about their axes."""

    labels: dict[Members, str] = field(default_factory=dict)
    """Member ranks (ascending) of an unnamed group -> its axis; groups that fit nothing are absent."""
    convention: str = ""
    """Whose names: ``picotron`` (its creation order, proven group for group), ``strides`` (``axis0``
    innermost), or empty where no mesh axis was inferred (at most the world)."""

    def note(self) -> str:
        """What the layout line says of the names."""
        if self.convention == "picotron":
            return ("names inferred: the groups were created in the order of picotron's ProcessGroupManager "
                    "(tp, cp, pp, dp, cp_dp, pp_dp), and the job named none of them")
        if self.convention == "strides":
            return "names inferred from the groups' strides (axis0 innermost): the job named none of them"
        return ""


def infer(world: int, created: Sequence[tuple[str, Sequence[int]]], called: Iterable[Sequence[int]] = ()) -> Inferred:
    """The axes of the unnamed groups among `created` ((description, ranks) of every group the job
    created, in order, an empty description for none: ``groups/rank<R>.jsonl``) and `called` (the
    members of groups that calls labelled ``group`` were issued on, where a creation went unrecorded)."""
    own = {tuple(sorted(r)) for d, r in created if d and axis_of(d) == GROUP}  # named by the job: not ours
    order = [g for g in (tuple(sorted(r)) for d, r in created if not d) if g not in own]
    pool = (set(order) | {tuple(sorted(g)) for g in called}) - own
    if labels := _picotron(world, order):
        return Inferred(labels, "picotron")
    everyone = tuple(range(world))
    labels = {everyone: WORLD} if everyone in pool else {}
    axes = _chain(world, pool - {everyone})
    names = [f"axis{i}" for i in range(len(axes))]
    sizes = {len(g) for g in pool}
    for count in range(1, len(axes) + 1):
        for chosen in combinations(range(len(axes)), count):
            if prod(axes[i][1] for i in chosen) not in sizes:
                continue
            groups = _groups(world, axes, chosen)
            if groups <= pool:
                for g in groups:
                    labels.setdefault(g, "-".join(names[i] for i in chosen))
    return Inferred(labels, "strides" if axes else "")


def _chain(world: int, pool: set[Members]) -> list[tuple[int, int]]:
    """(stride, size) of the mesh's axes, innermost first: the families of progressions that partition
    the world, from stride 1, each at the product of the sizes before it (the smallest size first where
    several share a stride: the larger are products of it and an axis further out)."""
    families: dict[tuple[int, int], set[Members]] = {}
    for g in pool:
        stride = progression(list(g))
        if stride is not None:
            families.setdefault((stride, len(g)), set()).add(g)
    whole = set(range(world))
    partitions = {shape for shape, gs in families.items()
                  if len(gs) * shape[1] == world and set().union(*gs) == whole}
    out, expect = [], 1
    while nexts := sorted(size for stride, size in partitions if stride == expect):
        out.append((expect, nexts[0]))
        expect *= nexts[0]
    return out


def _span(axes: list[tuple[int, int]], chosen: Iterable[int]) -> list[int]:
    """Every offset the `chosen` axes reach from a rank where they are all 0."""
    offsets = [0]
    for stride, size in (axes[i] for i in chosen):
        offsets = [o + k * stride for k in range(size) for o in offsets]
    return offsets


def _groups(world: int, axes: list[tuple[int, int]], chosen: tuple[int, ...]) -> set[Members]:
    """The groups along the `chosen` axes: the ranks that differ only there. Ranks past the mesh's
    product repeat it in blocks (an outer axis the job made no groups for)."""
    inner = prod(size for _, size in axes)
    others = _span(axes, [i for i in range(len(axes)) if i not in chosen])
    offsets = _span(axes, chosen)
    return {tuple(sorted(block + b + o for o in offsets)) for block in range(0, world, inner) for b in others}


def picotron_sequence(dp: int, pp: int, cp: int, tp: int) -> list[list[Members]]:
    """The groups picotron creates, family by family in `PICOTRON`'s order, each family's groups in its
    enumeration's order (process_group_manager.py: ``grid = torch.arange(world).view(dp, pp, cp, tp)``;
    ``tp_group`` enumerates ``grid[d, p, c, :]`` for d, p, c; ``cp_dp_group`` ``grid[:, p, :, t]``
    flattened for p, t...), members ascending as ``groups/rank<R>.jsonl`` records them."""
    def rank(d, p, c, t):
        return ((d * pp + p) * cp + c) * tp + t
    D, P, C, T = range(dp), range(pp), range(cp), range(tp)
    return [
        [tuple(rank(d, p, c, t) for t in T) for d in D for p in P for c in C],
        [tuple(rank(d, p, c, t) for c in C) for d in D for p in P for t in T],
        [tuple(rank(d, p, c, t) for p in P) for d in D for c in C for t in T],
        [tuple(rank(d, p, c, t) for d in D) for p in P for c in C for t in T],
        [tuple(sorted(rank(d, p, c, t) for d in D for c in C)) for p in P for t in T],
        [tuple(sorted(rank(d, p, c, t) for d in D for p in P)) for c in C for t in T],
    ]


def _picotron(world: int, order: list[Members]) -> dict[Members, str]:
    """picotron's labels where `order` holds its six families one after another, group for group;
    else none. Its first tp group is ranks 0..tp-1, and each family has world / size groups, so the
    sizes are read where each family starts and the whole sequence is then compared."""
    def size_at(i: int) -> int:  # the size of a family's groups, where it starts at `i` and divides the world
        return len(order[i]) if i < len(order) and world % len(order[i]) == 0 else 0

    for start, first in enumerate(order):
        if first != tuple(range(len(first))) or not (tp := size_at(start)):
            continue
        cp = size_at(start + world // tp)
        pp = size_at(start + world // tp + world // cp) if cp else 0
        if not pp or world % (tp * cp * pp):
            continue
        families = picotron_sequence(world // (tp * cp * pp), pp, cp, tp)
        flat = [g for family in families for g in family]
        if order[start:start + len(flat)] == flat:
            labels: dict[Members, str] = {}
            for name, family in zip(PICOTRON, families):
                for g in family:
                    labels.setdefault(g, name)  # identical families (cp-dp is dp at cp 1) read as the first
            return labels
    return {}
