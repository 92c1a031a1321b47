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

import torch

from ...capture.recorder import Capture
from ...core.events import CommEvent
from ...core.result import Check
from ...models.data_parallel import sgd_step, sync_grads
from ...models.tp_mlp import TensorParallelMLP
from ...predict.placement import Partial, Replicate
from .. import register
from ..numerics import TOLERANCE, Worst, bound, digest, finite
from ..template import Experiment, RankOutput
from .config import TPConfig, resolve
from .predict import grad_placement, predict_step
from .reference import init_weights, reference_step, replica_batch


class TensorParallel(Experiment):
    Config = TPConfig
    faults = {"dp-wrong-group": {"dp_group_fault": True}}

    def config(self, overrides: dict) -> TPConfig:
        return resolve(super().config(overrides))


    def predict(self, cfg) -> list[CommEvent]:
        return predict_step(cfg)

    def run_rank(self, ctx, cfg) -> RankOutput:
        mesh = ctx.mesh(cfg.layout)
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


register(TensorParallel, "tp_ar_b32", "TP MLP D=512 H=1024, batch 32, row output all-reduced", batch=32)
register(TensorParallel, "tp_ar_b128", "TP MLP D=512 H=1024, batch 128, row output all-reduced", batch=128)
register(TensorParallel, "tp_sp_b128", "TP MLP batch 128, row output reduce-scattered then all-gathered (SP)",
         batch=128, sequence_parallel=True)
