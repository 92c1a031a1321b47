"""The TP MLP's predicted ledger: the model's placement edges (`models.tp_mlp.boundaries`) walked
over one forward and one backward (`predict.edges.walk`), then the DP sync of every shard (step 6)."""

from __future__ import annotations

from ...core.events import CommEvent
from ...models.data_parallel import predict_grad_sync
from ...models.tp_mlp import boundaries, shard_shapes
from ...predict.edges import walk
from ...predict.ledger import Ledger
from .config import TPConfig


def predict_step(cfg: TPConfig) -> list[CommEvent]:
    """Every rank's collectives of one training step, derived from the MLP's placement edges."""
    ledger = Ledger(cfg.layout)
    edges = boundaries(cfg.batch, cfg.hidden, cfg.sequence_parallel, cfg.input_grad)
    params = [(name, rows * cols) for name, (rows, cols) in shard_shapes(cfg.hidden, cfg.ffn, cfg.tp)]
    for rank in range(cfg.world):
        walk(ledger, rank, edges, semantics=cfg.semantics)
        predict_grad_sync(ledger, rank, "dp", params)
    return ledger.events
