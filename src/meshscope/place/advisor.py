"""Placement advisor: which axis goes inside the node, ranked by predicted communication time.

The chapter's engineering principles of topology mapping (docs/chapter.md, Q28): usually TP stays in the
NVLink domain, PP boundaries and DP cross nodes, but "this is no fixed rule": when experts outweigh
activations, or activations outweigh weights, the best mapping changes, so feed the real group membership,
the topology and the per-axis payload into a solver instead of ordering axes by habit. This is that solver.

A placement is an order string (`mesh.Layout`, leftmost axis fastest). The 120 orders of tp-cp-ep-dp-pp
collapse to far fewer distinct placements: axes of size 1 and adjacent axes that always travel
together give the same groups, so placements are deduplicated by the groups of every axis that carries
traffic (an axis without collectives, such as edp of a dense model, cannot change the cost). Orders that
`Layout` rejects (dense and expert pp groups differ) are skipped and counted.

Per placement and axis: the bytes per step of the axis's busiest stage (`volume.stage_traffic`,
independent of the order; or a trace's steady step, `traced`, with ``place --from-trace``), how many of the axis's groups span more than one node (node = rank // gpus_per_node), and the
time of its collectives under an alpha-beta model per link class: a call costs alpha + link bytes /
bandwidth, link bytes being the ring fraction of `volume.link_bytes`. An axis with ANY crossing group
is timed on the inter-node link (its slowest group holds every rank of the step back). Blocking
pipeline P2P: each message a rank sends or receives costs a call. This per-axis report (`AxisCost`,
`Placement.total_s` = their sum, no overlap between axes) explains a placement axis by axis.

The ranking is by a step estimate that a pipeline is paced by its slowest stage (Narayanan et al. 2021
sec. 2.2: a step of M microbatches over p stages takes M + p - 1 slots of the slowest stage; the bubble
is (p - 1) / (M + p - 1) of the step). Per stage s, timed on ITS OWN groups (a tp/cp/dp/ep group lies
within one stage; a pp message is timed by whether its boundary's pairs cross nodes):
    C_s = compute (M x layers_s x layer_s, optional: 0 = communication only) + forward/backward comm
    O_s = the optimizer-phase comm (DP / expert-DP gradient sync, after the pipeline drains)
    T_s = (M + p - 1) / M x C_s + O_s,   step = max_s T_s.
Why per stage and a max: the chapter's other flip, unbalanced stages, is invisible to a
busiest-rank sum over axes that assumes L / p layers everywhere: a stage of 6 of 8 layers moves 3 times
the tp and dp bytes of its 2-layer neighbour while the pp messages stay the same, so an axis whose
bytes scale with layers can outweigh the boundary traffic on the heavy stage only, and the placement
that keeps that axis inside the node wins. Two approximations, both on the side of simplicity: the
fill/drain slots are charged at the pacing stage's rate, and a stage's optimizer sync is added to its
own pipeline time (the syncs of different stages run in parallel, in their own groups). With p = 1 and
no compute, step = the sum over axes, the per-axis report's total. Compute adds the same amount to every
placement of one stage, so it never changes a stage's ranking by itself; it decides WHICH stage paces.
`layer_s` is measured (an experiment's `step_fn` on the target GPU) or estimated from FLOPs: about
6 x 12 h^2 x b s / (tp cp) / achieved FLOP/s for a dense layer forward and backward.

What flips the usual answer here: experts whose gradients (synced over edp) outweigh the all-to-all
tokens pull edp inside the node and push ep out; activations that outweigh the weights pull pp inside
and push dp out; a stage holding most of the layers (`ModelSpec.stage_layers`) makes its layer-
proportional dp traffic pace the step, which can pull dp back inside and push pp out.

Which groups cross nodes, per axis, per stage and per stage boundary, is `node_crossing`'s business.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..core.errors import UsageError
from ..core.mesh import DEFAULT_ORDER, ORDER_AXES, Layout
from ..predict.model_spec import ModelSpec
from ..predict.volume import Traffic, stage_traffic
from .links import INTER_DEFAULT, INTRA_DEFAULT, LinkClass
from .node_crossing import (
    AXIS_MEMBERS,
    axis_spans,
    check_nodes,
    crossing_boundaries,
    crossing_groups,
    crossing_per_stage,
)


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
class StageCost:
    """One pipeline stage under one placement: its share of the step estimate, per axis and compute."""

    stage: int
    layers: int
    axis_s: tuple[tuple[str, float], ...]
    """(axis, seconds it adds to the stage's step time T_s): forward/backward comm x (M + p - 1) / M,
    optimizer comm x 1."""
    compute_s: float
    """Seconds compute adds to T_s: (M + p - 1) x layers x layer_s."""
    step_s: float = field(init=False)
    """T_s: the step time if this stage paces the pipeline."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_s", self.compute_s + sum(t for _, t in self.axis_s))

    def shares(self) -> list[tuple[str, float]]:
        """("<axis> traffic" or "compute", seconds of T_s), largest first."""
        parts = [(f"{a} traffic", t) for a, t in self.axis_s] + ([("compute", self.compute_s)] if self.compute_s else [])
        return sorted(parts, key=lambda part: -part[1])


@dataclass(frozen=True)
class Placement:
    """A distinct group set: the orders that give it, its cost per axis and per stage."""

    orders: tuple[str, ...]
    axes: tuple[AxisCost, ...]
    stages: tuple[StageCost, ...]
    total_s: float = field(init=False)
    """Sum of the per-axis times (the per-axis report, busiest rank per axis)."""
    step_s: float = field(init=False)
    """The step estimate the ranking uses: max over stages of T_s."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_s", sum(a.time_s for a in self.axes))
        object.__setattr__(self, "step_s", self.pacing.step_s)

    @property
    def pacing(self) -> StageCost:
        """The slowest stage (the first of equals)."""
        return max(self.stages, key=lambda st: st.step_s)

    @property
    def order(self) -> str:
        """The representative order: the default if it is one of them, else the first."""
        return DEFAULT_ORDER if DEFAULT_ORDER in self.orders else self.orders[0]

    def reason(self) -> str:
        """In words: the stage that paces the step when stages differ, the crossing axes that cost most,
        and what stays inside a node."""
        words = []
        if len({st.layers for st in self.stages}) > 1:
            st = self.pacing
            shares = ", ".join(f"{name} {t * 1e3:.3g} ms" for name, t in st.shares()[:2])
            words.append(f"stage {st.stage} holds {st.layers} of {sum(s.layers for s in self.stages)} layers "
                         f"and paces the step: {shares}")
        crossing = sorted((a for a in self.axes if a.crossing), key=lambda a: -a.time_s)
        inside = [a.axis for a in self.axes if not a.crossing]
        words += [f"{a.axis} crosses nodes: {fmt_bytes(a.bytes)}/step over {a.link.bandwidth / 1e9:.3g} GB/s links"
                  for a in crossing[:2]]
        if len(crossing) > 2:
            rest = [a.axis for a in crossing[2:]]
            words.append(f"{', '.join(rest)} cross{'es' if len(rest) == 1 else ''} too")
        if inside:
            words.append(f"inside the node: {', '.join(inside)}")
        return "; ".join(words) or "no axis has a group of more than one rank"


MODEL_SOURCE = "the analytic model (volume.stage_traffic)"


@dataclass(frozen=True)
class Ranking:
    """Every distinct placement of one model and layout, best (least step estimate) first."""

    layout: Layout
    gpus_per_node: int
    spec: ModelSpec
    intra: LinkClass
    inter: LinkClass
    layer_s: float
    """Compute seconds of one layer, forward and backward, per microbatch (0 = communication only)."""
    stage_traffic: tuple[tuple[Traffic, ...], ...]
    """Per pipeline stage, every collective of one step on one of its ranks."""
    placements: tuple[Placement, ...]
    skipped_orders: tuple[str, ...]
    """Orders `Layout` rejects for these sizes (dense and expert pp groups would differ)."""
    source: str = MODEL_SOURCE
    """Where the per-stage traffic came from: the model, or a trace (`place --from-trace`)."""

    @property
    def traffic(self) -> tuple[Traffic, ...]:
        """The busiest stage's collectives (as `volume.step_traffic`)."""
        return max(self.stage_traffic, key=lambda ts: sum(t.bytes for t in ts))


def fmt_bytes(n: float) -> str:
    """Decimal units, to sit next to GB/s: 4.1 GB, 256 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def rank_placements(world: int, gpus_per_node: int, spec: ModelSpec, sizes: dict[str, int],
                    intra: LinkClass = INTRA_DEFAULT, inter: LinkClass = INTER_DEFAULT,
                    layer_s: float = 0.0, traced: tuple[tuple[Traffic, ...], ...] | None = None,
                    source: str = MODEL_SOURCE) -> Ranking:
    """Enumerate the orders, deduplicate by group sets, cost each placement, rank by the step estimate.

    sizes: tp, cp, pp, ep, etp (dp and edp derived as in `mesh.Layout`). layer_s: compute seconds of
    one layer forward and backward per microbatch (0 = communication only). traced: per pipeline stage,
    the traffic of one step as a trace recorded it (`place.traced`), used instead of the model's;
    `source` says where it came from. Raises `UsageError` first, before any work, for sizes that do
    not divide the world or the model, or a node size that does not divide the world.
    """
    base = Layout(world, **sizes)
    check_nodes(world, gpus_per_node)
    if not layer_s >= 0:
        raise UsageError(f"--layer-ms {layer_s * 1e3} must be >= 0 (compute of one layer per microbatch)")
    stages = traced or tuple(tuple(stage_traffic(spec, base, s)) for s in range(base.pp))
    judged = [a for a in AXIS_MEMBERS if any(t.axis == a for ts in stages for t in ts)]  # no bytes: cannot matter
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
    cost = _Coster(world, gpus_per_node, spec, base, intra, inter, layer_s, stages)
    placements = sorted((cost(tuple(orders), dict(key)) for key, orders in classes.items()),
                        key=lambda p: (p.step_s, p.order))
    return Ranking(base, gpus_per_node, spec, intra, inter, layer_s, stages, tuple(placements), tuple(skipped), source)


@dataclass(frozen=True)
class _Coster:
    """Times one placement's collectives per stage and per axis (the module docstring's T_s)."""

    world: int
    gpus_per_node: int
    spec: ModelSpec
    base: Layout
    intra: LinkClass
    inter: LinkClass
    layer_s: float
    stages: tuple[tuple[Traffic, ...], ...]

    def __call__(self, orders: tuple[str, ...], spans: dict[str, tuple]) -> Placement:
        pp, m = self.base.pp, self.spec.microbatches
        stage_span = spans["pp"][0] if spans.get("pp") else (1, 1)
        per_stage = {a: crossing_per_stage(self.world, self.gpus_per_node, sp, stage_span)
                     for a, sp in spans.items() if a != "pp"}
        boundaries = crossing_boundaries(self.world, self.gpus_per_node, stage_span)
        slots = (m + pp - 1) / m  # fill and drain, charged at this stage's rate
        raw: dict[str, list[tuple[int, float]]] = {a: [] for a in spans}  # per axis: (bytes, s) per stage
        stage_costs = []
        for s, traffic in enumerate(self.stages):
            share: dict[str, float] = {}
            for a in spans:
                ts = [t for t in traffic if t.axis == a]
                times = [self._link(t, s, per_stage, boundaries).time(t, self.base.size(a)) for t in ts]
                raw[a].append((sum(t.bytes for t in ts), sum(times)))
                share[a] = sum(x if t.phase == "optimizer" else x * slots for t, x in zip(ts, times))
            layers = self.spec.layers_per_stage(pp)[s]
            stage_costs.append(StageCost(s, layers, tuple(share.items()), (m + pp - 1) * layers * self.layer_s))
        axes = []
        for a, sp in spans.items():
            n = self.base.size(a)
            crossing = crossing_groups(self.world, self.gpus_per_node, sp)
            axes.append(AxisCost(a, n, self.world // n, crossing, max(b for b, _ in raw[a]),
                                 self.inter if crossing else self.intra, max(t for _, t in raw[a])))
        return Placement(orders, tuple(axes), tuple(stage_costs))

    def _link(self, t: Traffic, stage: int, per_stage: dict, boundaries: tuple[int, ...]) -> LinkClass:
        """Inter-node when any group of this stage on t's axis crosses (for pp: t's boundary)."""
        crossing = boundaries[min(stage, t.peer_stage)] if t.axis == "pp" else per_stage[t.axis][stage]
        return self.inter if crossing else self.intra
