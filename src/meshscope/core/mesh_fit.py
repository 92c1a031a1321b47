"""The layout behind the groups a job created: from observed groups back to sizes and an order.

A traced job tells us only its process groups (axis label -> member ranks). Two reconstructions:

- `dims`: the mesh as DeviceMesh sees it. An atomic axis's groups are arithmetic progressions of one
  stride (rank = sum of coordinate x stride, the leftmost axis fastest, as `Layout` counts), so the
  axes sorted by stride, each stride the product of the sizes before it, spell the order.
- `fit_layout`: the same groups as a `Layout` of meshscope's vocabulary (tp, cp, ep, etp, dp, edp,
  pp), found by trying every order of ``tp-cp-ep-dp-pp`` with the observed sizes; what `meshscope
  layout` would print for this job.

Either says why it does not fit (`Fit.reason`) instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import permutations

from .errors import UsageError
from .mesh import Layout

LAYOUT_AXES = ("tp", "cp", "ep", "etp", "dp", "edp", "pp")
"""Axis labels `Layout` knows."""


@dataclass(frozen=True)
class Fit:
    """A reconstruction: the axes fastest first with their sizes, or why there is none."""

    order: tuple[str, ...] = ()
    sizes: dict[str, int] = field(default_factory=dict)
    layout: Layout | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        if not self.ok:
            return self.reason
        if self.layout is not None:  # as `meshscope layout` would be asked for it
            sizes = ", ".join(f"{a} {n}" for a, n in self.sizes.items())
            return f"{sizes} (order {self.layout.order}; meshscope layout --world {self.layout.world}" + "".join(
                f" --{a} {self.layout.size(a)}" for a in ("tp", "cp", "ep", "etp", "pp") if self.layout.size(a) > 1) + (
                f" --order {self.layout.order})")
        return " x ".join(f"{a} {self.sizes[a]}" for a in self.order) + f" (order {'-'.join(self.order)})"


def _progression(group: list[int]) -> int | None:
    """The stride of a sorted group that is an arithmetic progression, else None."""
    if len(group) < 2:
        return None
    stride = group[1] - group[0]
    return stride if all(b - a == stride for a, b in zip(group, group[1:])) else None


def dims(world: int, axes: dict[str, list[list[int]]]) -> Fit:
    """The mesh dims of the atomic axes in `axes` (groups of two or more ranks), fastest first."""
    atomic = {}
    for name, groups in axes.items():
        first = sorted(next((g for g in groups if 0 in g), groups[0]))
        stride = _progression(first)
        if stride is not None and first[0] == 0:
            atomic[name] = (stride, len(first))
    if not atomic:
        return Fit(reason="no axis with groups of two or more ranks")
    order, sizes, expect = [], {}, 1
    for name, (stride, size) in sorted(atomic.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0])):
        if stride < expect and stride * size <= expect * (expect // stride):
            continue  # a flattened dim (torch's mesh_dp_cp): a product of dims already in the order
        if stride != expect:
            return Fit(reason=f"axis {name} has stride {stride} where {expect} was expected: the axes seen "
                              f"({', '.join(sorted(atomic))}) do not form one mesh (another dimension is missing "
                              f"or two families overlap)")
        order.append(name)
        sizes[name] = size
        expect *= size
    if expect != world:
        return Fit(tuple(order), sizes, reason=f"the axes seen multiply to {expect} ranks, not the world of {world}")
    return Fit(tuple(order), sizes)


def fit_layout(world: int, axes: dict[str, list[list[int]]]) -> Fit:
    """The `Layout` whose groups are exactly the observed ones on every axis it knows."""
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
            experts = any(a in known for a in ("ep", "etp", "edp"))
            shown = {a for a in known if layout.size(a) > 1}
            shown |= {"dp"} if layout.dp > 1 else set()
            shown |= {"edp"} if experts and layout.edp > 1 else set()
            sizes = {a: layout.size(a) for a in LAYOUT_AXES if a in shown}
            return Fit(tuple(a for a in order if a in sizes), sizes, layout)
    return Fit(reason=f"the groups of {', '.join(sorted(known))} fit no tp-cp-ep-dp-pp order of a {world}-rank "
                      f"layout with sizes {sizes}")
