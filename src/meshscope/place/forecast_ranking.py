"""Placements ranked by the forecast's job step: ``place --from-trace DIR --cluster SPEC``.

The advisor (`advisor`) times each axis's per-step volume with one alpha-beta link per class; the forecast
(`forecast.step`) runs the traced job's whole step on a cluster: compute, each call on NCCL's cost model for the
nodes its group spans, and how much of it the compute stream waits for. This module asks the forecast the
advisor's question. A placement is an order string (`mesh.Layout`, leftmost axis fastest); under order O the rank
the trace called r, with coordinates c(r) in the trace's layout, sits at global rank O.rank_of(c(r)) and on node
that // gpus_per_node (`placed_ranks`). That node map (`collective_time.NodeOf`) is the forecast's only input that
changes: every call keeps its group of the trace's ranks, every compute segment its time, and the timeline is run
again. The trace's own order gives the map r -> r // gpus_per_node, the forecast's default.

The cost model compares node identities only (which members share a node), so orders that put the trace's ranks
on nodes the same way, up to the nodes' names, forecast the same: they are one placement. Of the 120 orders of
tp-cp-ep-dp-pp, those `Layout` rejects (dense and expert pp groups would differ) are skipped and counted.

A job with experts (ep or etp > 1) numbers each rank twice, once per family (dense tp cp dp pp, expert etp ep
edp pp; `mesh`). An order that moves the two families' coordinates to different ranks would pair a dense position
with an expert position the trace never ran together: a different job, which this trace cannot forecast. Such
orders are skipped and counted; trace the job in that order to weigh it.

What stays the trace's: each rank class is played by its traced rank (`forecast.inputs`) and that rank's groups
are the ones timed. Where a placement spreads the groups of one class's members over nodes differently (node sizes
that do not divide an axis's span), the class is timed as its traced rank's groups fall.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass

from ..capture.work import ISSUE
from ..core.errors import UsageError
from ..core.mesh import DENSE_AXES, EXPERT_AXES, ORDER_AXES, Layout
from ..forecast.cluster import INTER, ClusterSpec
from ..forecast.collective_time import collective_time
from ..forecast.inputs import TracedJob
from ..forecast.result import ClassForecast, Forecast
from ..forecast.step import forecast
from .node_crossing import check_nodes


@dataclass(frozen=True)
class ForecastPlacement:
    """One placement: the orders that give it, its node map and the forecast of the traced step under it."""

    orders: tuple[str, ...]
    order: str
    """The order shown: the trace's own if it is one of `orders`, else the first."""
    nodes: tuple[int, ...]
    """The trace's rank r -> the node it sits on (the placed rank // gpus_per_node)."""
    forecast: Forecast
    crossing: dict[str, int]
    """Per axis, the calls of the pacing class's step whose ranks sit on more than one node (`collective_time`'s
    link ``inter-node``)."""

    @property
    def step_s(self) -> float:
        return self.forecast.step_s

    @property
    def critical(self) -> ClassForecast:
        """The rank class that paces the step."""
        return next(c for c in self.forecast.classes if c.rank == self.forecast.critical_rank)


@dataclass(frozen=True)
class ForecastRanking:
    """Every distinct placement of one trace's ranks on one cluster's nodes, best (least forecast step) first."""

    job: TracedJob
    layout: Layout
    """The trace's layout (its order is where the trace ran)."""
    cluster: ClusterSpec
    placements: tuple[ForecastPlacement, ...]
    orders: int
    """Orders that gave a placement (`Layout` accepted them, and their families move together)."""
    skipped_orders: tuple[str, ...]
    """Orders `Layout` rejects for these sizes."""
    unpaired_orders: tuple[str, ...]
    """Orders that move the expert coordinates elsewhere than the dense ones (module doc)."""
    seconds: float
    """Wall seconds the ranking took (every order's node map, every placement's forecast)."""

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.network.gpus_per_node

    @property
    def traced(self) -> ForecastPlacement:
        """The trace's own placement."""
        return next(p for p in self.placements if self.layout.order in p.orders)


def placed_ranks(trace: Layout, candidate: Layout) -> tuple[int, ...] | None:
    """Per rank r of the trace, the global rank its coordinates take under `candidate` (`Layout.rank_of` of
    `trace.coords(r)`); None where the job has experts and `candidate` puts their coordinates on another rank
    than the dense ones (module doc)."""
    return _placed([trace.coords(r) for r in range(trace.world)], candidate)


def _placed(coords: list[dict[str, int]], candidate: Layout) -> tuple[int, ...] | None:
    """`placed_ranks` of the trace's ranks' coordinates `coords` (read once for every order)."""
    experts = candidate.ep > 1 or candidate.etp > 1
    out = []
    for c in coords:
        placed = candidate.rank_of(**{a: c[a] for a in DENSE_AXES})
        if experts and candidate.rank_of(**{a: c[a] for a in EXPERT_AXES}) != placed:
            return None
        out.append(placed)
    return tuple(out)


def rank_by_forecast(job: TracedJob, layout: Layout, cluster: ClusterSpec, tf32: bool = False) -> ForecastRanking:
    """Forecast `job` (a trace read by `forecast.inputs.read`, whose layout is `layout`) under every distinct
    placement of its ranks on `cluster`'s nodes; best first, the trace's own order first among equal steps."""
    began = time.perf_counter()
    g = cluster.network.gpus_per_node
    if layout.world != job.world:
        raise UsageError(f"{job.run_dir}: the trace's layout has {layout.world} ranks, its world {job.world}")
    check_nodes(layout.world, g)
    maps: dict[tuple[int, ...], tuple[tuple[int, ...], list[str]]] = {}  # node partition -> (node map, orders)
    skipped, unpaired = [], []
    coords = [layout.coords(r) for r in range(layout.world)]
    for perm in itertools.permutations(ORDER_AXES):
        order = "-".join(perm)
        try:
            candidate = dataclasses.replace(layout, order=order)
        except UsageError:
            skipped.append(order)
            continue
        placed = _placed(coords, candidate)
        if placed is None:
            unpaired.append(order)
            continue
        nodes = tuple(r // g for r in placed)
        maps.setdefault(_partition(nodes), (nodes, []))[1].append(order)
    placements = []
    for nodes, orders in maps.values():
        result = forecast(job, cluster, tf32=tf32, nodes=nodes.__getitem__)
        order = layout.order if layout.order in orders else orders[0]
        placements.append(ForecastPlacement(tuple(orders), order, nodes, result,
                                            _crossing(job, result.critical_rank, cluster, nodes)))
    placements.sort(key=lambda p: (p.step_s, layout.order not in p.orders, p.order))
    return ForecastRanking(job, layout, cluster, tuple(placements), sum(len(p.orders) for p in placements),
                           tuple(skipped), tuple(unpaired), time.perf_counter() - began)


def _partition(nodes: tuple[int, ...]) -> tuple[int, ...]:
    """`nodes` with the nodes renamed in order of first appearance: equal for maps that differ in names only."""
    names: dict[int, int] = {}
    return tuple(names.setdefault(n, len(names)) for n in nodes)


def _crossing(job: TracedJob, rank: int, cluster: ClusterSpec, nodes: tuple[int, ...]) -> dict[str, int]:
    """Per axis, how many calls of traced rank `rank`'s step cross nodes under `nodes`."""
    out: dict[str, int] = {}
    for item in job.programs[rank]:
        if item[0] == ISSUE:
            e = job.ledgers[rank][item[1]]
            try:
                crosses = collective_time(e, cluster, nodes.__getitem__).link == INTER
            except ValueError:  # an op the cost model does not time (the forecast notes it)
                crosses = False
            out[e.axis] = out.get(e.axis, 0) + crosses
    return out
