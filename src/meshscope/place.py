"""Placement advisor: which axis goes inside the node, ranked by predicted communication time.

The seed ("拓扑映射的工程原则"): usually TP stays in the NVLink domain, PP boundaries and DP cross nodes,
"这不是固定规则": when experts outweigh activations, or activations outweigh weights, the best mapping
changes, so feed the real group membership, the topology and the per-axis payload into a solver
instead of ordering axes by habit. This is that solver.

A placement is an order string (`mesh.Layout`, leftmost axis fastest). The 120 orders of tp-cp-ep-dp-pp
collapse to far fewer distinct placements: axes of size 1 and adjacent axes that always travel
together give the same groups, so placements are deduplicated by the groups of every axis that carries
traffic (an axis without collectives, such as edp of a dense model, cannot change the cost). Orders that
`Layout` rejects (dense and expert pp groups differ) are skipped and counted.

Per placement and axis: the busiest rank's bytes per step (`volume.step_traffic`, independent of the
order), how many of the axis's groups span more than one node (node = rank // gpus_per_node), and the
time of its collectives under an alpha-beta model per link class: a call costs alpha + link bytes /
bandwidth, link bytes being the ring fraction of `volume.link_bytes`. An axis with ANY crossing group
is timed on the inter-node link (its slowest group holds every rank of the step back). Blocking
pipeline P2P: each message a rank sends or receives costs a call. The total is the SUM over axes:
collectives of different axes are not assumed to overlap (a serial upper bound), which is also what
makes the ranking explainable axis by axis.

What flips the usual answer here is bytes: experts whose gradients (synced over edp) outweigh the
all-to-all tokens pull edp inside the node and push ep out; activations that outweigh the weights pull
pp inside and push dp out. Stage imbalance, the seed's other example, is a compute effect that a
communication-only model cannot see; it is not modelled.

Group math is per group, never per rank in Python: a single axis's groups are arithmetic progressions
(stride, size) read from `Layout.group_of(axis, 0)`; the groups' first ranks are the ranks whose
coordinates on the axis are zero, found with one vectorised pass (numpy) per distinct group set.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import UsageError
from .mesh import DEFAULT_ORDER, ORDER_AXES, Layout
from .model_spec import ModelSpec
from .sweep import BUS_FACTOR, Fit
from .volume import Traffic, link_bytes, step_traffic

AXIS_MEMBERS = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "dp-cp": ("dp", "cp"), "pp": ("pp",),
                "ep": ("ep",), "etp": ("etp",), "edp": ("edp",)}
"""The groups a placement is judged by, as single axes whose (stride, size) spans combine."""


@dataclass(frozen=True)
class LinkClass:
    """One class of links under the alpha-beta model: a call of B link bytes costs alpha + B / bandwidth."""

    name: str
    """intra-node or inter-node."""
    latency_s: float
    """alpha: seconds per call."""
    bandwidth: float
    """Bytes per second one rank's link carries (nccl-tests bus bandwidth)."""
    source: str = "default"
    """Where the figures come from (defaults, flags, or a sweep file)."""

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth > 0):
            raise UsageError(f"{self.name} link: latency {self.latency_s} s must be >= 0 and bandwidth "
                             f"{self.bandwidth} B/s > 0")

    def time(self, t: Traffic, n: int) -> float:
        return t.count * self.latency_s + link_bytes(t, n) / self.bandwidth

    def to_json(self) -> dict:
        return {"name": self.name, "latency_s": self.latency_s, "bandwidth_Bps": self.bandwidth, "source": self.source}


INTRA_DEFAULT = LinkClass("intra-node", 10e-6, 300e9)
"""NVLink/NVSwitch: 300 GB/s bus bandwidth (the design brief measured 326 GB/s all_reduce busbw on
two H200s at 1 GiB), 10 us per call (NCCL's usual 5-20 us)."""
INTER_DEFAULT = LinkClass("inter-node", 20e-6, 25e9)
"""One 200 Gb/s NIC per GPU (HDR InfiniBand / RoCE): 25 GB/s, 20 us per call."""


def link_from_sweep(path: Path) -> LinkClass:
    """The intra-node link from a saved `meshscope sweep` (a run directory or its sweep.json).

    Takes the all_reduce fit of the largest group (else the first fit): alpha is the fit's latency and
    the bandwidth is its bus bandwidth factor(op, n) / beta, so ring factors are not counted twice.
    One link class for every intra-node group, whatever its size: the model has one alpha per class.
    """
    file = path / "sweep.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
        fits = [Fit(**{**f, "rel_err": tuple(f["rel_err"])}) for f in doc["fits"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--sweep {path}: not a readable meshscope sweep.json ({exc.__class__.__name__}: {exc})")
    if not fits:
        raise UsageError(f"--sweep {path}: the sweep has no fits")
    ars = [f for f in fits if f.op == "all_reduce"]
    fit = max(ars, key=lambda f: f.group_size) if ars else fits[0]
    if fit.beta_s_per_byte <= 0:
        raise UsageError(f"--sweep {path}: the {fit.op} fit has beta {fit.beta_s_per_byte:.3g} <= 0 (noise "
                         f"swamped the size dependence); sweep larger sizes")
    bw = BUS_FACTOR[fit.op](fit.group_size) / fit.beta_s_per_byte
    return LinkClass("intra-node", max(fit.alpha_s, 0.0), bw, f"sweep {file} ({fit.op} on {fit.group_size} ranks)")


@dataclass(frozen=True)
class AxisCost:
    """One axis under one placement."""

    axis: str
    group_size: int
    groups: int
    crossing: int
    """Groups whose ranks span more than one node."""
    bytes: int
    """Bytes per step on the busiest rank (nccl-tests sizes, logical)."""
    link: LinkClass
    time_s: float


@dataclass(frozen=True)
class Placement:
    """A distinct group set: the orders that give it and its cost per axis."""

    orders: tuple[str, ...]
    axes: tuple[AxisCost, ...]
    total_s: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_s", sum(a.time_s for a in self.axes))

    @property
    def order(self) -> str:
        """The representative order: the default if it is one of them, else the first."""
        return DEFAULT_ORDER if DEFAULT_ORDER in self.orders else self.orders[0]

    def reason(self) -> str:
        """In words: the crossing axes that cost most, and what stays inside a node."""
        crossing = sorted((a for a in self.axes if a.crossing), key=lambda a: -a.time_s)
        inside = [a.axis for a in self.axes if not a.crossing]
        words = [f"{a.axis} crosses nodes: {fmt_bytes(a.bytes)}/step over {a.link.bandwidth / 1e9:.3g} GB/s links"
                 for a in crossing[:2]]
        if len(crossing) > 2:
            rest = [a.axis for a in crossing[2:]]
            words.append(f"{', '.join(rest)} cross{'es' if len(rest) == 1 else ''} too")
        if inside:
            words.append(f"inside the node: {', '.join(inside)}")
        return "; ".join(words) or "no axis has a group of more than one rank"


@dataclass(frozen=True)
class Ranking:
    """Every distinct placement of one model and layout, best (least communication time) first."""

    layout: Layout
    gpus_per_node: int
    spec: ModelSpec
    intra: LinkClass
    inter: LinkClass
    traffic: tuple[Traffic, ...]
    placements: tuple[Placement, ...]
    skipped_orders: tuple[str, ...]
    """Orders `Layout` rejects for these sizes (dense and expert pp groups would differ)."""


def fmt_bytes(n: float) -> str:
    """Decimal units, to sit next to GB/s: 4.1 GB, 256 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


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


@lru_cache(maxsize=4096)
def crossing_groups(world: int, gpus_per_node: int, spans: tuple[tuple[int, int], ...]) -> int:
    """How many groups of the axis with these (stride, size) spans hold ranks of more than one node.

    A group is its first rank b (every span coordinate zero) plus the offsets; its ranks run from b to
    b + sum((size - 1) * stride), so it crosses exactly when those two ends sit on different nodes.
    """
    ranks = np.arange(world, dtype=np.int64)
    first = np.ones(world, dtype=bool)
    for stride, size in spans:
        first &= (ranks // stride) % size == 0
    bases = ranks[first]
    last = bases + sum((size - 1) * stride for stride, size in spans)
    return int(np.count_nonzero(bases // gpus_per_node != last // gpus_per_node))


def check_nodes(world: int, gpus_per_node: int) -> None:
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1 or world % gpus_per_node:
        raise UsageError(f"--gpus-per-node {gpus_per_node} does not divide --world {world}; nodes must be "
                         f"equal: pick a divisor of {world}")


def rank_placements(world: int, gpus_per_node: int, spec: ModelSpec, sizes: dict[str, int],
                    intra: LinkClass = INTRA_DEFAULT, inter: LinkClass = INTER_DEFAULT) -> Ranking:
    """Enumerate the orders, deduplicate by group sets, cost each placement, rank by total time.

    sizes: tp, cp, pp, ep, etp (dp and edp derived as in `mesh.Layout`). Raises `UsageError` first,
    before any work, for sizes that do not divide the world or the model, or a node size that does not
    divide the world.
    """
    base = Layout(world, **sizes)
    check_nodes(world, gpus_per_node)
    traffic = tuple(step_traffic(spec, base))
    by_axis: dict[str, list[Traffic]] = {}
    for t in traffic:
        by_axis.setdefault(t.axis, []).append(t)
    judged = [a for a in AXIS_MEMBERS if a in by_axis]  # an axis that moves no bytes cannot matter
    classes: dict[tuple, list[str]] = {}
    skipped = []
    for perm in itertools.permutations(ORDER_AXES):
        order = "-".join(perm)
        try:
            layout = Layout(world, **sizes, order=order)
        except UsageError:
            skipped.append(order)
            continue
        key = tuple((a, axis_spans(layout, a)) for a in judged)
        classes.setdefault(key, []).append(order)
    placements = []
    for key, orders in classes.items():
        costs = []
        for axis, spans in key:
            n = base.size(axis)
            crossing = crossing_groups(world, gpus_per_node, spans)
            link = inter if crossing else intra
            ts = by_axis.get(axis, [])
            costs.append(AxisCost(axis, n, world // n, crossing, sum(t.bytes for t in ts), link,
                                  sum(link.time(t, n) for t in ts)))
        placements.append(Placement(tuple(orders), tuple(costs)))
    placements.sort(key=lambda p: (p.total_s, p.order))
    return Ranking(base, gpus_per_node, spec, intra, inter, traffic, tuple(placements), tuple(skipped))
