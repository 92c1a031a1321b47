"""The pipeline's predicted ledger: each stage's schedule program (the one the ranks execute) walked
by `predict.edges.walk`, its exchanges sized from the boundary widths, then the DP sync of the stage
weight (steps 3, 4 and 6). A plain stage changes no placement, so it has no edges."""

from __future__ import annotations

from ...core.events import CommEvent
from ...models.data_parallel import predict_grad_sync
from ...models.pipeline.schedules import program
from ...predict.edges import walk
from ...predict.ledger import Ledger
from .config import PPConfig, widths


def predict_step(cfg: PPConfig) -> list[CommEvent]:
    layout = cfg.layout
    ledger, d, rows = Ledger(layout), widths(cfg), cfg.batch // cfg.microbatches
    for rank in range(cfg.world):
        stage = layout.coords(rank)["pp"]
        walk(ledger, rank, (), program(cfg.schedule, cfg.pp, stage, cfg.microbatches),
             message_numel=lambda msg: rows * d[msg.boundary + 1], stage_ranks=tuple(layout.group_of("pp", rank)))
        predict_grad_sync(ledger, rank, "dp", [(f"stage{stage}.weight", d[stage + 1] * d[stage])])
    return ledger.events
