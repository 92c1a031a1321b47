"""``tp_ar_b32``, ``tp_ar_b128``, ``tp_sp_b128``: the seed's tensor/sequence-parallel MLP, end to end.

World = tp x dp (seed: 4 = 2 x 2, TP [0,1],[2,3], DP [0,2],[1,3]); each DP replica trains the sharded
MLP of `models.tp_mlp` on its own batch of `batch` rows, syncs shard gradients in its DP group, and
takes plain SGD steps. One step is captured and diffed against `predict`, which derives the ledger
from the model's placement boundaries with the seed's six steps ("从模型 Shape 预测 Trace 的方法").

Verification is against an unsharded MLP built from the same full weights, trained on the same DP
batches with the DP-averaged gradient: outputs, every shard's weight gradient vs its slice of the full
gradient (this is what sees the T x gradient of an undivided summed-loss, which output and replica
checks cannot), the input gradient, the weights after `steps` steps, finite losses, and DP replicas.

Legend: B batch rows of one replica, D --hidden, H --ffn, T tp size, R dp size; suffixes as in
`models.tp_mlp`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..capture import Capture
from ..errors import UsageError
from ..events import CommEvent
from ..mesh import Layout
from ..models.data_parallel import predict_grad_sync, sgd_step, sync_grads
from ..models.tp_mlp import SEMANTICS, SUMMED, TensorParallelMLP, boundaries, shard_shapes
from ..predict import Ledger, Partial, Replicate, Shard, transition
from ..verify import digest
from . import Check, Experiment, RankOutput, bound, register
from .numerics import TOLERANCE, Worst, finite
from .sizes import check_choice, check_positive, world_and_dp

SEED_WORLD = 4
"""The seed's world when neither --world nor --dp is given."""


@dataclass(frozen=True)
class TPConfig:
    world: int | None = None
    """Number of ranks; None: tp * dp, or the seed's 4 when --dp is not given either."""
    tp: int = 2
    """Tensor-parallel size T; must divide --ffn."""
    dp: int | None = None
    """Data-parallel size R; None: world / tp. Given with --world, the two must agree."""
    batch: int = 32
    """Rows of each DP replica's batch B (sequence parallel: divisible by tp)."""
    hidden: int = 512
    """Model dim D: X [B, D], W1 [H, D], W2 [D, H]."""
    ffn: int = 1024
    """FFN dim H, sharded over the TP group."""
    steps: int = 3
    """SGD steps; the first one is captured."""
    semantics: str = SUMMED
    """Gradient semantics of the TP collectives: summed-loss or replicated-loss."""
    input_grad: bool = False
    """Whether X requires grad (replicated-loss prunes the fc1.in backward all-reduce without it)."""
    sequence_parallel: bool = False
    """Row output reduce-scattered to a batch shard and gathered back (tp_sp) instead of all-reduced."""
    lr: float = 0.5
    """SGD learning rate, the same for the sharded model and the reference."""
    dp_group_fault: bool = False
    """FAULT INJECTION, not a CLI flag: sync gradients over the TP group (ranks holding different
    shards: the seed's "DP over [0,1]") instead of the DP group. The gradient and replica checks must fail."""




def resolve(cfg: TPConfig) -> TPConfig:
    """Fill world and dp from each other through tp; UsageError (one line, with the values) when the
    parameters cannot form the MLP's layout."""
    check_positive(cfg, ("world", "tp", "dp", "batch", "hidden", "ffn", "steps"))
    check_choice("semantics", cfg.semantics, SEMANTICS)
    if cfg.ffn % cfg.tp:
        raise UsageError(f"--tp {cfg.tp} does not divide --ffn {cfg.ffn}: W1 rows and W2 columns are sharded "
                         f"over tp; pick a divisor of {cfg.ffn}")
    world, dp = world_and_dp(cfg.world, cfg.dp, cfg.tp, "tp", SEED_WORLD)
    cfg = replace(cfg, world=world, dp=dp)
    if cfg.sequence_parallel and cfg.batch % cfg.tp:
        raise UsageError(f"--batch {cfg.batch} is not divisible by --tp {cfg.tp}: sequence parallel "
                         f"reduce-scatters the batch rows over tp")
    return cfg


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


# -- the unsharded reference -------------------------------------------------------------------------
def init_weights(cfg: TPConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Full W1 [H, D] and W2 [D, H], identical on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(0)
    w1_HD = torch.randn(cfg.ffn, cfg.hidden, generator=g) / cfg.hidden ** 0.5
    w2_DH = torch.randn(cfg.hidden, cfg.ffn, generator=g) / cfg.ffn ** 0.5
    return w1_HD, w2_DH


def replica_batch(cfg: TPConfig, step: int, replica: int) -> torch.Tensor:
    """x_BD of DP replica `replica` at `step`; every rank can build every replica's batch."""
    g = torch.Generator().manual_seed(1 + step * cfg.dp + replica)
    return torch.randn(cfg.batch, cfg.hidden, generator=g)


def reference_step(w1_HD, w2_DH, xs_BD):
    """Unsharded MLP on each replica's batch with the plain loss: per replica (y_BD, dX_BD, dA_BH);
    weight gradients averaged over replicas, as the DP sync does."""
    w1, w2 = w1_HD.detach().requires_grad_(), w2_DH.detach().requires_grad_()
    per_replica, g1, g2 = [], 0, 0
    for x_BD in xs_BD:
        x = x_BD.detach().requires_grad_()
        a_BH = F.linear(x, w1)
        y_BD = F.linear(F.gelu(a_BH), w2)
        dx, da, d1, d2 = torch.autograd.grad(y_BD.square().mean(), [x, a_BH, w1, w2])
        per_replica.append((y_BD.detach(), dx, da))
        g1, g2 = g1 + d1 / len(xs_BD), g2 + d2 / len(xs_BD)
    return per_replica, (g1, g2)




class TensorParallel(Experiment):
    Config = TPConfig
    faults = {"dp-wrong-group": {"dp_group_fault": True}}

    def config(self, overrides: dict) -> TPConfig:
        return resolve(super().config(overrides))

    def layout(self, cfg) -> Layout:
        return Layout(cfg.world, tp=cfg.tp)

    def predict(self, cfg) -> list[CommEvent]:
        return predict_step(cfg)

    def run_rank(self, ctx, cfg) -> RankOutput:
        mesh = ctx.mesh(self.layout(cfg))
        tp_g, dp_g = mesh["tp"], mesh["dp"]
        sync_group = tp_g if cfg.dp_group_fault else dp_g
        replica, shard = dp_g.local_rank(ctx.rank), tp_g.local_rank(ctx.rank)
        hs = slice(shard * cfg.ffn // cfg.tp, (shard + 1) * cfg.ffn // cfg.tp)  # this rank's hidden features
        w1_HD, w2_DH = init_weights(cfg)
        model = TensorParallelMLP(w1_HD, w2_DH, tp_g, ctx.rank, cfg.semantics, cfg.sequence_parallel).to(ctx.device)
        # Summed-loss issues no collective for X.grad: each rank holds its hidden shard's contribution.
        x_grad_partial = isinstance(grad_placement(Replicate(), cfg.semantics), Partial)
        worst, losses, events = Worst(), [], []
        for step in range(cfg.steps):
            xs_BD = [replica_batch(cfg, step, r) for r in range(cfg.dp)]
            x_BD = xs_BD[replica].to(ctx.device).requires_grad_(cfg.input_grad)
            capture = Capture() if step == 0 else contextlib.nullcontext()
            with capture:  # one full step: forward, backward, DP grad sync
                y_BD, loss = train_step(model, x_BD, sync_group)
            if step == 0:
                events = capture.events
            losses.append(loss.item())
            ref, (g1_HD, g2_DH) = reference_step(w1_HD, w2_DH, xs_BD)
            y_ref, dx_ref, da_ref = ref[replica]
            worst.add("output", y_BD, y_ref)
            worst.add("grad", model.fc1.weight.grad, g1_HD[hs])
            worst.add("grad", model.fc2.weight.grad, g2_DH[:, hs])
            if cfg.input_grad:
                worst.add("input_grad", x_BD.grad, da_ref[:, hs] @ w1_HD[hs] if x_grad_partial else dx_ref)
            sgd_step(model.parameters(), cfg.lr)
            w1_HD, w2_DH = w1_HD - cfg.lr * g1_HD, w2_DH - cfg.lr * g2_DH
        worst.add("weights", model.fc1.weight, w1_HD[hs])
        worst.add("weights", model.fc2.weight, w2_DH[:, hs])
        checks = [
            bound("output == unsharded MLP", worst.abs["output"], TOLERANCE),
            worst.check("weight grads == unsharded slices", "grad"),
            bound(f"weights after {cfg.steps} SGD steps == unsharded", worst.abs["weights"], TOLERANCE),
            Check("losses finite", all(map(finite, losses)), f"{len(losses)} losses, last {losses[-1]:.6g}"),
        ]
        if cfg.input_grad:
            checks.append(worst.check("input grad == unsharded", "input_grad"))
        numerics = worst.numerics()
        replicas = {"tp shard weights": (dp_g.ranks, digest([p.detach() for p in model.parameters()]))}
        return RankOutput(ctx.rank, events, checks=checks, numerics=numerics, replicas=replicas,
                          extra={"losses": losses})


    def step_fn(self, ctx, cfg):
        mesh = ctx.mesh(self.layout(cfg))
        model = TensorParallelMLP(*init_weights(cfg), mesh["tp"], ctx.rank, cfg.semantics,
                                  cfg.sequence_parallel).to(ctx.device)
        x_BD = replica_batch(cfg, 0, mesh["dp"].local_rank(ctx.rank)).to(ctx.device).requires_grad_(cfg.input_grad)

        def step():
            x_BD.grad = None
            train_step(model, x_BD, mesh["dp"])
            sgd_step(model.parameters(), cfg.lr)

        return step


def train_step(model: TensorParallelMLP, x_BD: torch.Tensor, sync_group):
    """Forward, loss, backward and DP gradient sync of one step; returns (output, loss)."""
    y_BD = model(x_BD)
    loss = model.loss(y_BD)
    loss.backward()
    sync_grads(model.named_parameters(), sync_group)
    return y_BD, loss


register(TensorParallel, "tp_ar_b32", "TP MLP D=512 H=1024, batch 32, row output all-reduced", batch=32)
register(TensorParallel, "tp_ar_b128", "TP MLP D=512 H=1024, batch 128, row output all-reduced", batch=128)
register(TensorParallel, "tp_sp_b128", "TP MLP batch 128, row output reduce-scattered then all-gathered (SP)",
         batch=128, sequence_parallel=True)
