"""The TP MLP's predicted ledger, from the model's placement boundaries (`models.tp_mlp.boundaries`)
walked with the shared edges of `predict.edges`."""

from __future__ import annotations

from ...core.events import CommEvent
from ...core.mesh import Layout
from ...models.data_parallel import predict_grad_sync
from ...models.tp_mlp import SUMMED, boundaries, shard_shapes
from ...predict.ledger import Ledger
from ...predict.placement import Partial, Replicate, Shard, transition
from .config import TPConfig


# -- predictor ---------------------------------------------------------------------------------------
def grad_placement(p, semantics: str):
    """Placement of the gradient of a tensor placed `p` over the TP group.

    A partial sum's summands each need the whole gradient: Replicate. A shard's gradient is a shard.
    A replicated tensor's gradient is replicated under replicated-loss (one loss), but a partial sum
    under summed-loss (each rank's loss is a separate summand: the torch.distributed.nn view).
    """
    if isinstance(p, Partial):
        return Replicate()
    if isinstance(p, Replicate) and semantics == SUMMED:
        return Partial()
    return p


def collective(src, dst) -> str | None:
    """Step 3 with the two free cases: no change, and Replicate -> Shard (a local slice)."""
    if src == dst or (isinstance(src, Replicate) and isinstance(dst, Shard)):
        return None
    return transition(src, dst)


def _local_numel(shape: tuple[int, int], p, tp: int) -> int:
    rows, cols = shape
    return rows * cols // tp if isinstance(p, Shard) else rows * cols


def predict_step(cfg: TPConfig) -> list[CommEvent]:
    """Every rank's collectives of one training step, derived from the MLP's placement boundaries."""
    layout = Layout(cfg.world, tp=cfg.tp)
    ledger = Ledger(layout)
    plan = boundaries(cfg.batch, cfg.hidden, cfg.sequence_parallel, cfg.input_grad)
    params = [(name, rows * cols) for name, (rows, cols) in shard_shapes(cfg.hidden, cfg.ffn, cfg.tp)]
    for rank in range(cfg.world):
        for b in plan:  # steps 1-4: forward placement changes, local bytes
            op = collective(b.src, b.dst)
            if op:
                ledger.emit(rank, op, "tp", "forward", numel=_local_numel(b.shape, b.src, cfg.tp), region=b.region)
        for b in reversed(plan):  # step 5: walk autograd backwards, pruning edges without grad
            if not b.needs_grad:
                continue
            g_in = b.grad_in or grad_placement(b.dst, cfg.semantics)
            op = collective(g_in, grad_placement(b.src, cfg.semantics))
            if op:
                ledger.emit(rank, op, "tp", "backward", numel=_local_numel(b.shape, g_in, cfg.tp), region=b.region)
        predict_grad_sync(ledger, rank, "dp", params)  # step 6: orthogonal DP sync of every shard
    return ledger.events
