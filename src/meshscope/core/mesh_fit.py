"""The layout behind the groups a job created: from observed groups back to sizes and an order.

A traced job tells us only its process groups (axis label -> member ranks; groups it named none of
are labelled by `mesh_infer` first, ``axis0``... or a convention's names). `fit` reconstructs the
layout from the axes that are the job's mesh dims: atomic mesh axes (not joined like Megatron's
``tp-pp``, not named groups) with groups of two or more ranks (a 1-rank group joins nobody: torchtitan
builds every dim of size 1 too). Two reconstructions:

- `fit_layout`: the groups as a `Layout` of meshscope's vocabulary (tp, cp, ep, etp, dp, edp, pp),
  found by trying every order of ``tp-cp-ep-dp-pp`` with the observed sizes; what `meshscope layout`
  would print for this job. Used when every dim the job has is in that vocabulary;
- `dims`: the mesh as DeviceMesh sees it, in the job's own names (torchtitan's ``dp_replicate`` and
  ``fsdp``, Megatron-core 0.19.2's ``gtp``). An atomic axis's groups are arithmetic progressions of
  one stride (rank = sum of coordinate x stride, the leftmost axis fastest, as `Layout` counts), so
  the dims sorted by stride, each stride the product of the sizes before it, spell the order.

Either says why it does not fit (`Fit.reason`) instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import permutations

from .axes import LAYOUT_AXES, is_mesh_axis
from .errors import UsageError
from .mesh import Layout


@dataclass(frozen=True)
class Fit:
    """A reconstruction: the axes fastest first with their sizes, or why there is none."""

    order: tuple[str, ...] = ()
    sizes: dict[str, int] = field(default_factory=dict)
    layout: Layout | None = None
    reason: str = ""
    same: tuple[tuple[str, str], ...] = ()
    """(axis, the axis whose groups it repeats) for axes not counted in `sizes`: a dense Megatron job's
    expert groups, which its parallel_state creates whatever the model (etp = tp, edp = dp at ep 1)."""

    @property
    def ok(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        if not self.ok:
            return self.reason
        if self.layout is not None:  # as `meshscope layout` would be asked for it
            sizes = ", ".join(f"{a} {n}" for a, n in self.sizes.items())
            same = "".join(f"; {a} has the groups of {b}" for a, b in self.same)
            return f"{sizes} (order {self.layout.order}{same}; meshscope layout --world {self.layout.world}" + "".join(
                f" --{a} {self.layout.size(a)}" for a in ("tp", "cp", "ep", "etp", "pp") if self.layout.size(a) > 1) + (
                f" --order {self.layout.order})")
        return " x ".join(f"{a} {self.sizes[a]}" for a in self.order) + f" (order {'-'.join(self.order)})"


def dim_axes(axes: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
    """The axes that are mesh dims of the job: atomic mesh axes with a group of two or more ranks."""
    return {a: gs for a, gs in axes.items() if is_mesh_axis(a) and "-" not in a and any(len(g) > 1 for g in gs)}


def fit(world: int, axes: dict[str, list[list[int]]]) -> Fit:
    """The layout of the job's mesh dims: as `meshscope layout` names it when every dim is in its
    vocabulary (`fit_layout`, else `dims`), in the job's own names otherwise (`dims`)."""
    found = dim_axes(axes)
    if not found:
        return Fit(reason="no mesh axis with groups of two or more ranks")
    if set(found) <= set(LAYOUT_AXES):
        layout = fit_layout(world, found)
        if layout.ok:
            return layout
        mesh = dims(world, found)
        return mesh if mesh.ok else Fit(reason=f"{layout.reason}; {mesh.reason}")
    return dims(world, found)


def progression(group: list[int]) -> int | None:
    """The stride of a sorted group that is an arithmetic progression, else None."""
    if len(group) < 2:
        return None
    stride = group[1] - group[0]
    return stride if all(b - a == stride for a, b in zip(group, group[1:])) else None


def dims(world: int, axes: dict[str, list[list[int]]]) -> Fit:
    """The mesh dims of the atomic axes in `axes` (groups of two or more ranks), fastest first.

    Axes whose groups are the same are one dim under several names, written ``batch/fsdp``; at each
    stride the finest dim is the next in the order, and every other axis must be a product of dims
    next to each other (a flattened dim: torch's ``mesh_dp_cp``, torchtitan's ``batch``)."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, groups in axes.items():
        first = sorted(next((g for g in groups if 0 in g), groups[0]))
        stride = progression(first)
        if stride is not None and first[0] == 0:
            shapes.setdefault((stride, len(first)), []).append(name)
    named = {"/".join(sorted(names)): shape for shape, names in shapes.items()}
    if not named:
        return Fit(reason="no axis with groups of two or more ranks")
    order, sizes, expect, products = [], {}, 1, [1]
    while nexts := sorted((n, a) for a, (stride, n) in named.items() if stride == expect and a not in sizes):
        size, name = nexts[0]
        order.append(name)
        sizes[name] = size
        expect *= size
        products.append(expect)
    for name, (stride, size) in named.items():
        if name not in sizes and not (stride in products and stride * size in products):
            return Fit(reason=f"axis {name} (stride {stride}, size {size}) is neither a dim nor a product of dims "
                              f"of {' x '.join(order) or 'none'}: the axes seen ({', '.join(sorted(named))}) do not "
                              f"form one mesh (another dimension is missing or two families overlap)")
    if expect != world:
        return Fit(tuple(order), sizes, reason=f"the axes seen multiply to {expect} ranks, not the world of {world}")
    return Fit(tuple(order), sizes)


def fit_layout(world: int, axes: dict[str, list[list[int]]]) -> Fit:
    """The `Layout` whose groups are exactly the observed ones on every axis it knows. dp is the ranks
    the other axes leave, as `meshscope layout` counts it; edp only where the job has experts (an ep
    above 1) or edp groups of its own."""
    known = {a: sorted(sorted(g) for g in gs) for a, gs in axes.items() if a in LAYOUT_AXES}
    if not known:
        return Fit(reason="no group is labelled with an axis of tp, cp, ep, etp, dp, edp or pp")
    sizes = {a: len(gs[0]) for a, gs in known.items()}
    for order in permutations(("tp", "cp", "ep", "dp", "pp")):
        try:
            layout = Layout(world, tp=sizes.get("tp", 1), cp=sizes.get("cp", 1), ep=sizes.get("ep", 1),
                            etp=sizes.get("etp", 1), pp=sizes.get("pp", 1), order="-".join(order))
        except UsageError:
            continue
        if all(layout.groups(a) == gs for a, gs in known.items()):
            shown = {a for a in known if layout.size(a) > 1}
            shown |= {"dp"} if layout.dp > 1 else set()
            shown |= {"edp"} if ("edp" in known or layout.ep > 1) and layout.edp > 1 else set()
            same = tuple((a, b) for a, b in (("etp", "tp"), ("edp", "dp"))
                         if layout.ep == 1 and a in shown and b in shown and layout.groups(a) == layout.groups(b))
            sizes = {a: layout.size(a) for a in LAYOUT_AXES if a in shown - {a for a, _ in same}}
            return Fit(tuple(a for a in order if a in sizes), sizes, layout, same=same)
    return Fit(reason=f"the groups of {', '.join(sorted(known))} fit no tp-cp-ep-dp-pp order of a {world}-rank "
                      f"layout with sizes {sizes}")
