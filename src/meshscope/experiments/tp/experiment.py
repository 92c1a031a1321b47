"""``tp_ar_b32``, ``tp_ar_b128``, ``tp_sp_b128``: the chapter's tensor/sequence-parallel MLP, end to end.

World = tp x dp (the chapter's 4 = 2 x 2, TP [0,1],[2,3], DP [0,2],[1,3]; docs/chapter.md, Q1); each DP replica
trains the sharded MLP of `models.tp_mlp` on its own batch of `batch` rows, syncs shard gradients in its DP
group, and takes plain SGD steps. One step is captured and diffed against `predict`, which derives the ledger
from the model's placement boundaries with the chapter's six steps of predicting a trace from the model's shapes
(docs/chapter.md, Q27).

Verification is against an unsharded MLP built from the same full weights, trained on the same DP
batches with the DP-averaged gradient: outputs, every shard's weight gradient vs its slice of the full
gradient (this is what sees the T x gradient of an undivided summed-loss, which output and replica
checks cannot), the input gradient, the weights after `steps` steps, finite losses, and DP replicas.

Legend: B batch rows of one replica, D --hidden, H --ffn, T tp size, R dp size; suffixes as in
`models.tp_mlp`.
"""

from __future__ import annotations

import torch

from ...core.events import CommEvent
from ...core.result import Check
from ...models.data_parallel import sgd_step, sync_grads
from ...models.tp_mlp import TensorParallelMLP
from ...predict.placement import Partial, Replicate, grad_placement
from .. import register
from ..numerics import TOLERANCE, Worst, bound, digest
from ..template import RankTrainer, TrainedExperiment
from .config import TPConfig, resolve
from .predict import predict_step
from .reference import init_weights, reference_step, replica_batch


class TensorParallel(TrainedExperiment):
    Config = TPConfig
    faults = {"dp-wrong-group": {"dp_group_fault": True}}

    def config(self, overrides: dict) -> TPConfig:
        return resolve(super().config(overrides))

    def predict(self, cfg) -> list[CommEvent]:
        return predict_step(cfg)

    def trainer(self, ctx, cfg) -> TPTrainer:
        return TPTrainer(ctx, cfg)

    def step_fn(self, ctx, cfg):
        mesh = ctx.mesh(cfg.layout)
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



class TPTrainer(RankTrainer):
    """This rank's column/row shard of the MLP in its DP replica, and the unsharded MLP on every
    replica's batch with the DP-averaged gradient."""

    def __init__(self, ctx, cfg: TPConfig):
        self.ctx, self.cfg = ctx, cfg
        mesh = ctx.mesh(cfg.layout)
        tp_g, self.dp_g = mesh["tp"], mesh["dp"]
        self.sync_group = tp_g if cfg.dp_group_fault else self.dp_g
        self.replica, shard = self.dp_g.local_rank(ctx.rank), tp_g.local_rank(ctx.rank)
        self.hs = slice(shard * cfg.ffn // cfg.tp, (shard + 1) * cfg.ffn // cfg.tp)  # this rank's hidden features
        self.w1_HD, self.w2_DH = init_weights(cfg)
        self.model = TensorParallelMLP(self.w1_HD, self.w2_DH, tp_g, ctx.rank, cfg.semantics,
                                       cfg.sequence_parallel).to(ctx.device)
        # Summed-loss issues no collective for X.grad: each rank holds its hidden shard's contribution.
        self.x_grad_partial = isinstance(grad_placement(Replicate(), cfg.semantics), Partial)

    def train(self, step: int) -> float:
        self.xs_BD = [replica_batch(self.cfg, step, r) for r in range(self.cfg.dp)]
        self.x_BD = self.xs_BD[self.replica].to(self.ctx.device).requires_grad_(self.cfg.input_grad)
        self.y_BD, loss = train_step(self.model, self.x_BD, self.sync_group)
        return loss.item()

    def compare(self, step: int, worst: Worst) -> None:
        cfg, hs, model = self.cfg, self.hs, self.model
        ref, (g1_HD, g2_DH) = reference_step(self.w1_HD, self.w2_DH, self.xs_BD)
        y_ref, dx_ref, da_ref = ref[self.replica]
        worst.add("output", self.y_BD, y_ref)
        worst.add("grad", model.fc1.weight.grad, g1_HD[hs])
        worst.add("grad", model.fc2.weight.grad, g2_DH[:, hs])
        if cfg.input_grad:
            worst.add("input_grad", self.x_BD.grad, da_ref[:, hs] @ self.w1_HD[hs] if self.x_grad_partial else dx_ref)
        sgd_step(model.parameters(), cfg.lr)
        self.w1_HD, self.w2_DH = self.w1_HD - cfg.lr * g1_HD, self.w2_DH - cfg.lr * g2_DH

    def finish(self, worst: Worst) -> list[Check]:
        worst.add("weights", self.model.fc1.weight, self.w1_HD[self.hs])
        worst.add("weights", self.model.fc2.weight, self.w2_DH[:, self.hs])
        checks = [
            bound("output == unsharded MLP", worst.abs["output"], TOLERANCE),
            worst.check("weight grads == unsharded slices", "grad"),
            bound(f"weights after {self.cfg.steps} SGD steps == unsharded", worst.abs["weights"], TOLERANCE),
        ]
        if self.cfg.input_grad:
            checks.append(worst.check("input grad == unsharded", "input_grad"))
        return checks

    def replicas(self) -> dict:
        return {"tp shard weights": (self.dp_g.ranks, digest([p.detach() for p in self.model.parameters()]))}


register(TensorParallel, "tp_ar_b32", "TP MLP D=512 H=1024, batch 32, row output all-reduced", batch=32)
register(TensorParallel, "tp_ar_b128", "TP MLP D=512 H=1024, batch 128, row output all-reduced", batch=128)
register(TensorParallel, "tp_sp_b128", "TP MLP batch 128, row output reduce-scattered then all-gathered (SP)",
         batch=128, sequence_parallel=True)
