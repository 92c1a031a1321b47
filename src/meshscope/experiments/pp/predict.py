"""The pipeline's predicted ledger: each stage's P2P program (the schedule the ranks execute) with
message sizes from the boundary shapes, then the DP sync of the stage weight."""

from __future__ import annotations

from ...core.events import CommEvent
from ...core.mesh import Layout
from ...models.data_parallel import predict_grad_sync
from ...models.pipeline.schedules import Exchange, program
from ...predict.ledger import Ledger
from .config import ORDER, PPConfig, widths


# -- predictor ---------------------------------------------------------------------------------------
def predict_step(cfg: PPConfig) -> list[CommEvent]:
    """Each rank's P2P program (the schedule shared with the runtime) with message sizes from the
    boundary shapes, then the DP sync of its stage weight (seed steps 3, 4 and 6)."""
    layout = Layout(cfg.world, pp=cfg.pp, order=ORDER)
    ledger, d, rows = Ledger(layout), widths(cfg), cfg.batch // cfg.microbatches
    for rank in range(cfg.world):
        stage, ranks = layout.coords(rank)["pp"], layout.group_of("pp", rank)
        for step in program(cfg.schedule, cfg.pp, stage, cfg.microbatches):
            if not isinstance(step, Exchange):
                continue
            for msg in step.messages:
                op = "send" if msg.sender == stage else "recv"
                ledger.emit(rank, op, "pp", msg.phase, numel=rows * d[msg.boundary + 1], region=msg.region,
                            microbatch=msg.microbatch, peer=ranks[step.peer_stage])
        predict_grad_sync(ledger, rank, "dp", [(f"stage{stage}.weight", d[stage + 1] * d[stage])])
    return ledger.events
