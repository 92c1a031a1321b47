"""``nd_mlp``: TP x PP x DP (with an MoE stage inside) on one world, predicted, captured and verified.

The chapter ran each mode alone (no configuration ran TP and PP together; real 3-D parallelism adds an
independent PP coordinate); here they run together, as in real training. World 8 = tp 2 x pp 2 x dp 2 by
default: every pipeline stage is the TP MLP block of `models.tp_mlp` on the stage's tp group, microbatches flow
through the GPipe or 1F1B program of `models.pipeline` between the ranks of a pp group (same tp and dp
coordinates), and each TP shard's gradient is averaged in its dp group. ``--pp-scatter-gather`` sends 1/T of
each boundary tensor and all-gathers it in the receiver's tp group (`models.nd_stage`). ``--moe`` turns the last
stage into the EP experiment's MoE layer, experts over the expert groups of the mesh (etp 1, ep carved from dp),
expert gradients averaged in edp.

The mesh (`nd_predict.ORDER`) keeps the default order's dense groups and carves ep from dp. The predictor
(`nd_predict`) composes the per-mode rules and never special-cases ``nd_mlp``. Verification is against the
unsharded chain trained the same way (`nd_model.reference_step`): every stage's outputs, every TP shard's and
expert's gradient, the weights after --steps SGD steps, replica equality in every dp and edp group, finite
losses. The ``axes`` section lists rank 0's collectives per mesh axis, so that a slow or hung collective is
placed on its dimension (the chapter: a hang or a slow collective must be traced to its dimension;
docs/chapter.md, Faults the doctor names); ``--inject pp-no-grad`` plants a hang at a pipeline boundary that
spreads to the tp and dp peers, and the doctor names the pp boundary first.

Legend: b microbatch rows, D --hidden, H --ffn, T tp size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.events import CommEvent
from ...core.faults import FAULT_RANK
from ...core.result import Check
from ...models.data_parallel import sgd_step, sync_grads
from ...models.pipeline.schedules import check_matched, program
from ...models.pipeline.stage import StageBoundary, run_program
from .. import register
from ..numerics import TOLERANCE, Worst, bound, digest
from ..template import RankOutput, RankTrainer, TrainedExperiment
from .config import NDConfig, resolve
from .model import StageModel, expert_grad_scale, init_weights, loss_scale, reference_step, replica_batch, route
from .predict import axis_breakdown, predict_step


# -- runtime -------------------------------------------------------------------------------------------
class NDParallel(TrainedExperiment):
    Config = NDConfig
    faults = {"pp-no-grad": {"fault_pp_no_grad": True}, "dp-wrong-group": {"dp_group_fault": True}}

    def config(self, overrides: dict) -> NDConfig:
        return resolve(super().config(overrides))


    def predict(self, cfg) -> list[CommEvent]:
        return predict_step(cfg)

    def trainer(self, ctx, cfg) -> NDTrainer:
        return NDTrainer(ctx, cfg)

    def step_fn(self, ctx, cfg):
        mesh = ctx.mesh(cfg.layout)
        model = StageModel(cfg, init_weights(cfg), mesh, ctx.rank).to(ctx.device)
        if model.moe is not None:
            model.moe.record_durations = False
        boundary = stage_boundary(ctx, cfg, model, mesh)
        batch = tuple(t.to(ctx.device) for t in replica_batch(cfg, 0, model.replica))  # once: no copy per step

        def step():
            train_step(ctx, cfg, model, boundary, 0, batch)
            sgd_step(model.parameters(), cfg.lr)

        return step

    def has_experts(self, cfg) -> bool:
        return cfg.moe

    def graph_blocker(self, cfg) -> str | None:
        if cfg.moe:
            return "the MoE stage packs each microbatch's routing, reading per-expert counts on the host"
        return None

    def summarize(self, cfg, outputs: list[RankOutput], label: str) -> dict:
        """``axes``: rank 0's collectives per mesh axis (count, logical bytes), its group on each axis,
        and the other dimensions each communicator serves (``aliases``: with ep = dp the MoE
        all_to_alls run on the dp communicator), so that a slow or hung collective is placed on its
        dimension, not only on a global rank."""
        events = [e for o in outputs for e in o.events]
        groups = {e.axis: list(e.group) for e in events if e.rank == 0}
        return {"axes": {"rank": 0, "groups": dict(sorted(groups.items())), "ops": axis_breakdown(events, 0),
                         "aliases": cfg.layout.aliases()}}


class NDTrainer(RankTrainer):
    """This rank's stage (TP shards or its experts) of its pipeline replica, and the unsharded chain of
    every replica with the same routing."""

    def __init__(self, ctx, cfg: NDConfig):
        self.ctx, self.cfg = ctx, cfg
        mesh, self.weights = ctx.mesh(cfg.layout), init_weights(cfg)
        self.model = StageModel(cfg, self.weights, mesh, ctx.rank).to(ctx.device)
        self.boundary = stage_boundary(ctx, cfg, self.model, mesh)
        self.boundary.check_shapes(cfg.microbatches)  # P2P shapes agreed once, before any blocking recv

    def train(self, step: int) -> float | None:
        self.batches = [replica_batch(self.cfg, step, r) for r in range(self.cfg.dp)]
        self.outs, mb_losses = train_step(self.ctx, self.cfg, self.model, self.boundary, step,
                                          self.batches[self.model.replica])
        return sum(mb_losses).item() if self.model.last else None

    def compare(self, step: int, worst: Worst) -> None:
        model, cfg = self.model, self.cfg
        ref_outs, ref_grads = reference_step(cfg, self.weights, self.batches, step)
        worst.add("output", torch.cat(self.outs), ref_outs[model.replica][model.stage])
        for name, p in model.named_dense() + model.named_experts():
            worst.add("grad", p.grad, model.shard_of(name, ref_grads[name]))
        sgd_step(model.parameters(), cfg.lr)
        self.weights = self.weights.sgd(cfg, ref_grads, cfg.lr)

    def finish(self, worst: Worst) -> list[Check]:
        model, full = self.model, self.weights.named(self.cfg)
        for name, p in model.named_dense() + model.named_experts():
            worst.add("weights", p, model.shard_of(name, full[name]))
        return [
            bound("stage outputs == unsharded chain", worst.abs["output"], TOLERANCE),
            worst.check("shard and expert grads == unsharded slices", "grad"),
            bound(f"weights after {self.cfg.steps} SGD steps == unsharded", worst.abs["weights"], TOLERANCE),
        ]

    def replicas(self) -> dict:
        model = self.model
        return {name: (group.ranks, digest([p for _, p in params]))
                for name, group, params in (("dense shards", model.dp, model.named_dense()),
                                            ("experts", model.edp, model.named_experts()))
                if params and group.size > 1}


def stage_boundary(ctx, cfg: NDConfig, model: StageModel, mesh) -> StageBoundary:
    """The stage's P2P over its pp group; every message is [b, D], or its 1/T slab with scatter/gather."""
    check_matched(cfg.schedule, cfg.pp, cfg.microbatches)  # fail fast on a schedule that could deadlock
    rows = cfg.batch // cfg.microbatches // (cfg.tp if cfg.pp_scatter_gather else 1)
    silent = False
    if cfg.fault_pp_no_grad:  # the stage after FAULT_RANK's, in FAULT_RANK's pipeline, drops its gradients
        layout = cfg.layout
        silent = ctx.rank == layout.group_of("pp", FAULT_RANK)[max(layout.coords(FAULT_RANK)["pp"], 1)]
    return StageBoundary(mesh["pp"], model.stage, [cfg.hidden] * (cfg.pp + 1), rows, ctx.device,
                         drop_gradients=silent)


def train_step(ctx, cfg: NDConfig, model: StageModel, boundary: StageBoundary, step: int, batch):
    """One step of this rank's stage: its schedule program over the pp boundary, then the dense shards'
    dp sync and the experts' (scaled) edp sync. Returns (stage outputs, microbatch losses)."""
    m, replica = cfg.microbatches, model.replica
    x_mbD, t_mbD = ([c.to(ctx.device) for c in t.chunk(m)] for t in batch)

    def forward(i, x_bD):
        y_bD = model(x_bD, route(cfg, step, replica, i) if model.moe is not None else None)
        if model.last:
            return y_bD, F.mse_loss(y_bD, t_mbD[i]) * loss_scale(cfg)
        return y_bD, model.outgoing(y_bD)

    prog = program(cfg.schedule, cfg.pp, model.stage, m)
    outs, losses, _ = run_program(prog, boundary, forward, x_mbD)
    for _, p in model.named_experts():
        p.grad.mul_(expert_grad_scale(cfg))
    sync_grads(model.named_dense(), model.tp if cfg.dp_group_fault else model.dp)
    sync_grads(model.named_experts(), model.edp, label="edp.grad_sync")
    return outs, losses


register(NDParallel, "nd_mlp", "TP x PP x DP MLP chain (world 8 = 2 x 2 x 2); --moe: last stage an EP MoE layer")
