"""The predictor of ``nd_mlp``: the per-mode rules composed over a stage's edges and schedule program.

Nothing here knows ``nd_mlp``'s model beyond its shapes: a stage is a list of `predict.edges` in
forward order (the TP layer's placement edges between the pipeline's gather and scatter edges, or the
MoE layer's dispatch and combine), walked by `predict.edges.walk` forward for every F and backward
for every B of the stage's schedule program, the same program (`models.pipeline.program`) that gives
the boundary P2P and that the ranks execute; then the grad sync of every parameter in its group
(step 6). `axis_breakdown` sums one rank's ledger per mesh axis.

Mesh order ``tp-cp-dp-ep-pp``: the dense family skips ep, so tp, dp and pp groups are exactly those of
the default ``tp-cp-ep-dp-pp`` (golden: tp [[0,1],...], dp [[0,2],[1,3],...], pp [[0,4],...]). With
etp 1 the position of ep only shapes the expert family: after dp, an ep group holds ranks of one tp
coordinate and different dp coordinates, i.e. different tokens ("ep carved from dp"); before dp it
would hold the TP ranks of one replica, which carry the same replicated tokens.
"""

from __future__ import annotations

from collections import defaultdict

from ...core.events import OPS, CommEvent
from ...core.mesh import Layout
from ...models.data_parallel import predict_grad_sync
from ...models.moe.dispatch import destination_splits
from ...models.nd_stage import scatter_gather_boundaries
from ...models.pipeline.schedules import program
from ...models.tp_mlp import boundaries, shard_shapes
from ...predict.edges import AllToAllEdge, walk
from ...predict.ledger import Ledger
from ...predict.placement import Replicate, Shard, local_numel
from .config import NDConfig
from .model import rows_per_expert


def dispatch_splits(cfg: NDConfig, layout: Layout):
    """(rank, mb) -> dispatch (input_splits, output_splits): rows to each ep member, rows from each."""
    rows = lambda r, mb: destination_splits(rows_per_expert(cfg, 0, layout.coords(r)["dp"], mb), cfg.ep)  # noqa: E731

    def splits(rank: int, mb: int):
        members = layout.group_of("ep", rank)
        return rows(rank, mb), [rows(s, mb)[members.index(rank)] for s in members]

    return splits


def stage_edges(cfg: NDConfig, layout: Layout, stage: int) -> list:
    """The stage's layout-changing edges in forward order: gather, its layer, scatter."""
    rows, last = cfg.batch // cfg.microbatches, stage == cfg.pp - 1
    before, after = scatter_gather_boundaries(rows, cfg.hidden, cfg.pp_scatter_gather and stage > 0,
                                              cfg.pp_scatter_gather and not last)
    input_grad = stage > 0  # the stage-0 input is data; a received activation is a leaf needing grad
    if cfg.moe and last:
        dispatch = dispatch_splits(cfg, layout)
        combine = lambda r, mb: dispatch(r, mb)[::-1]  # noqa: E731  (the dispatch's splits swapped)
        layer = [AllToAllEdge("moe.dispatch", dispatch, cfg.hidden, needs_grad=input_grad),
                 AllToAllEdge("moe.combine", combine, cfg.hidden, needs_grad=True)]
    else:
        layer = boundaries(rows, cfg.hidden, False, input_grad)
    return before + layer + after


def predict_step(cfg: NDConfig) -> list[CommEvent]:
    """Every rank's collectives of one step: its stage's program walked over its edges, per microbatch,
    with the boundary P2P, then the grad sync of each parameter in its group (step 6)."""
    layout = cfg.layout
    ledger = Ledger(layout)
    rows = cfg.batch // cfg.microbatches
    message = Shard(0) if cfg.pp_scatter_gather else Replicate()
    for rank in range(cfg.world):
        stage = layout.coords(rank)["pp"]
        walk(ledger, rank, stage_edges(cfg, layout, stage), program(cfg.schedule, cfg.pp, stage, cfg.microbatches),
             semantics=cfg.semantics, message_numel=lambda msg: local_numel((rows, cfg.hidden), message, cfg.tp),
             stage_ranks=tuple(layout.group_of("pp", rank)))
        if cfg.moe and stage == cfg.pp - 1:
            local = cfg.experts // cfg.ep
            first = layout.coords(rank)["ep"] * local
            predict_grad_sync(ledger, rank, "edp", [(f"expert{e}.weight", cfg.hidden ** 2)
                                                    for e in range(first, first + local)], label="edp.grad_sync")
        else:
            predict_grad_sync(ledger, rank, "dp", [(f"stage{stage}.{n}", r * c)
                                                   for n, (r, c) in shard_shapes(cfg.hidden, cfg.ffn, cfg.tp)])
    return ledger.events


def axis_breakdown(events, rank: int) -> dict[str, dict[str, dict[str, int]]]:
    """{axis: {op: {count, bytes_in, bytes_out}}} of one rank's events: the dimension each belongs to."""
    out: dict = defaultdict(lambda: defaultdict(lambda: {"count": 0, "bytes_in": 0, "bytes_out": 0}))
    for e in events:
        if e.rank == rank:
            slot = out[e.axis][e.op]
            slot["count"] += 1
            slot["bytes_in"] += e.bytes_in
            slot["bytes_out"] += e.bytes_out
    return {axis: {op: dict(ops[op]) for op in OPS if op in ops} for axis, ops in sorted(out.items())}
