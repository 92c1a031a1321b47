"""``ep_*``: expert-parallel MoE training, predicted, captured and checked (docs/chapter.md, Q19-Q25).

The chapter's defaults: world 4 = ep 2 x edp 2, FP32; every rank is a source of 64 tokens x 512 that
require grad (they stand for a trainable upstream activation); 2 experts, one per EP rank, each Linear
512x512 + GELU; loss = mean(out^2). Per rank per step the chapter counts 4 all_to_all (dispatch, combine
and their backwards) + 1 all_reduce (the expert's gradient in its expert-DP group); without input grad
the reverse dispatch is pruned: 3 all_to_all (chapter Q22: why the first MoE had only 3 A2A kernels).

``ep_learned`` adds the real router (gate, top-k, capacity, Switch aux loss). Its splits are not known
before routing, so the counts go first in an all_to_all of int64 (splits [1] * ep); with ``--pad`` the
buffers are fixed-size and that exchange disappears. The gate is a dense parameter: its gradient is
averaged in the dense dp group, the experts' in edp.

The predictor recomputes the routing on the CPU from the RNG seeds and the initial weights (the router is
a pure function of them), packs it with the same `pack_plan`, and walks forward and backward: dispatch
-> combine, reverse combine -> reverse dispatch if the tokens need grad, then the grad syncs.
Step 0 is the captured step. Legend: T tokens per source, D model dim, E experts, L local experts.
"""

from __future__ import annotations

import math
import time

import torch

from ...core.errors import UsageError
from ...core.events import CommEvent
from ...core.faults import FAULT_RANK
from ...core.result import Check
from ...core.sizes import check_positive
from ...models.data_parallel import sgd_step, sync_grads
from ...models.moe.dispatch import pack_plan
from ...models.moe.layer import MoELayer
from .. import register
from ..numerics import TOLERANCE, Worst, bound, digest
from ..template import RankOutput, RankTrainer, TrainedExperiment
from . import records as ep_records
from .config import ROUTINGS, EPConfig, tokens_need_grad
from .model import (
    capacity,
    fixed_counts,
    initial_weights,
    make_router,
    reference_training,
    route,
    source_tokens,
    static_rows,
    step_loss,
)
from .predict import predict_step


def backward_note(cfg: EPConfig) -> str:
    """Why the step has the all_to_alls it has, in plain words (chapter Q22: autograd prunes, NCCL does not
    skip)."""
    if cfg.ep == 1:
        return "ep is 1: every expert is local to its rank, so no all_to_all is issued at all"
    exchange = "" if static_rows(cfg) is not None else (
        "the router's counts are only known after routing, so an all_to_all of the int64 counts "
        "(splits [1] per rank) precedes the dispatch; ")
    if cfg.input_grad:
        return exchange + ("the tokens require grad, so backward runs the reverse combine (for the expert "
                           "weights) and the reverse dispatch (for x.grad)")
    return exchange + ("the tokens need no grad and nothing upstream of the dispatch does, so autograd prunes "
                       "the reverse dispatch; only the reverse combine runs backward (the expert weights need "
                       "its gradient): one all_to_all fewer")


class ExpertParallel(TrainedExperiment):
    Config = EPConfig
    faults = {"split-mismatch": {"fault_split_mismatch": True}, "no-input-grad": {"fault_no_input_grad": True}}

    def validate(self, cfg: EPConfig) -> None:
        cfg.layout
        if cfg.routing not in ROUTINGS:
            raise UsageError(f"--routing {cfg.routing!r} is not one of {', '.join(ROUTINGS)}")
        check_positive(cfg, ("batch", "hidden", "steps", "experts", "topk"))
        if cfg.experts < cfg.ep or cfg.experts % cfg.ep:
            raise UsageError(f"--experts {cfg.experts} must be a multiple of --ep {cfg.ep} (experts per EP rank)")
        if cfg.routing != "learned" and cfg.topk != 1:
            raise UsageError(f"--topk {cfg.topk} needs --routing learned; the deterministic routers are top-1")
        if not 1 <= cfg.topk <= cfg.experts:
            raise UsageError(f"--topk {cfg.topk} must be between 1 and --experts {cfg.experts}")
        if not (math.isfinite(cfg.capacity_factor) and cfg.capacity_factor >= 0):
            raise UsageError(f"--capacity-factor {cfg.capacity_factor} must be a finite number >= 0 (0 = unlimited)")
        if cfg.pad and cfg.capacity_factor <= 0:
            raise UsageError("--pad needs a --capacity-factor > 0: padding fills each expert's buffer to its capacity")
        fixed_counts(cfg)  # validates --skew
        if cfg.fault_split_mismatch and cfg.ep == 1:
            raise UsageError("the split-mismatch fault needs --ep 2 or more: with ep 1 no all_to_all is issued")
        if cfg.fault_no_input_grad and not cfg.input_grad:
            raise UsageError("the no-input-grad fault needs --input-grad: with --no-input-grad the prediction "
                             "already expects the pruned reverse dispatch (use ep_balanced)")


    def predict(self, cfg: EPConfig) -> list[CommEvent]:
        return predict_step(cfg)

    def step_fn(self, ctx, cfg: EPConfig):
        m = _Model(ctx, cfg, ctx.mesh(cfg.layout))
        m.layer.record_durations = False
        x_TD = source_tokens(cfg, 0, ctx.rank).to(ctx.device).requires_grad_(tokens_need_grad(cfg))
        # Fixed routing does not depend on the weights: route and pack once (host reads included), so
        # the step itself only launches work, as a CUDA graph needs. A gate re-routes every step.
        fixed = None
        if cfg.routing != "learned":
            routing = route(cfg, 0, ctx.rank, x_TD, None)
            fixed = routing, pack_plan(routing.expert_A, cfg.experts, m.pad_to)

        def step():
            x_TD.grad = None
            m.train_step(0, x_TD, fixed)
            sgd_step([p for _, p in m.named], cfg.lr)

        return step

    def has_experts(self, cfg: EPConfig) -> bool:
        return True

    def graph_blocker(self, cfg: EPConfig) -> str | None:
        if cfg.routing == "learned":
            return ("learned routing re-routes every step and reads the routed counts on the host (.tolist()), "
                    "which a CUDA graph cannot replay")
        return None

    def trainer(self, ctx, cfg: EPConfig) -> EPTrainer:
        return EPTrainer(ctx, cfg)

    def summarize(self, cfg: EPConfig, outputs: list[RankOutput], label: str) -> dict:
        """The chapter's production records per EP group and rank (`ep_records`), and why the step has
        the all_to_alls it has."""
        return {"experts": ep_records.summarize(cfg, cfg.layout, outputs) | {"note": backward_note(cfg)}}




def _x_grad_check(cfg: EPConfig, x_grad) -> Check:
    """Chapter Q23: the upstream activation gradient must exist and be finite - and be absent when the
    tokens need none."""
    if cfg.input_grad:
        ok = x_grad is not None and bool(torch.isfinite(x_grad).all())
        return Check("x.grad exists and is finite (reverse dispatch ran)", ok, "present" if x_grad is not None else "missing")
    return Check("x.grad absent (reverse dispatch pruned)", x_grad is None, "absent" if x_grad is None else "present")


register(ExpertParallel, "ep_balanced", "MoE top-1, 64 tokens/source split [32,32]: 4 all_to_all + 1 all_reduce",
         routing="balanced")
register(ExpertParallel, "ep_skewed", "MoE top-1 skewed 7:1, split [56,8]: hot expert receives 112 tokens",
         routing="skewed")
register(ExpertParallel, "ep_nograd", "MoE top-1 with tokens that need no grad: reverse dispatch pruned (3 A2A)",
         routing="balanced", input_grad=False)
register(ExpertParallel, "ep_learned", "MoE with a learned gate, top-k, capacity, Switch aux loss, counts exchange",
         routing="learned", capacity_factor=1.25)


class EPTrainer(RankTrainer):
    """This rank's MoE layer (`_Model`) and the dense reference of every step, computed up front. Step
    0 is compared in full (outputs, expert, gate and token gradients); the weights after the last."""

    def __init__(self, ctx, cfg: EPConfig):
        self.ctx, self.cfg = ctx, cfg
        self.m = _Model(ctx, cfg, ctx.mesh(cfg.layout))
        self.ref = reference_training(cfg, cfg.layout, ctx.rank)
        self.step_s, self.records = [], []

    def train(self, step: int) -> float:
        self.x_TD = source_tokens(self.cfg, step, self.ctx.rank).to(self.ctx.device).requires_grad_(
            tokens_need_grad(self.cfg))
        start = time.perf_counter()
        self.routing, self.out_TD, record, loss = self.m.train_step(step, self.x_TD)
        self.ctx.synchronize()
        self.step_s.append(time.perf_counter() - start)
        self.records.append(record)
        return loss.item()

    def compare(self, step: int, worst: Worst) -> None:
        if step == 0:
            self.first_routing, self.x_grad = self.routing, self.x_TD.grad
            worst.add("output", self.out_TD, self.ref["output"])
            for n, p in self.m.named:
                worst.add("grad", p.grad, self.ref["grads"][n])
            if self.cfg.input_grad:
                worst.add("input_grad", self.x_grad, self.ref["x_grad"])
        sgd_step([p for _, p in self.m.named], self.cfg.lr)

    def finish(self, worst: Worst) -> list[Check]:
        cfg = self.cfg
        for n, p in self.m.named:
            worst.add("weights", p, self.ref["weights"][n])
        return [
            bound("outputs match the dense reference (step 0)", worst.abs["output"], TOLERANCE),
            worst.check("expert and gate gradients match the reference", "grad"),
            *([worst.check("x gradient matches the reference", "input_grad")] if cfg.input_grad else []),
            bound(f"weights match the reference after {cfg.steps} SGD steps", worst.abs["weights"], TOLERANCE),
            _x_grad_check(cfg, self.x_grad),
        ]

    def replicas(self) -> dict:
        m = self.m
        replicas = {"experts": (m.edp_group.ranks, digest([w for _, w in m.layer.named_expert_weights()]))}
        if m.router is not None:
            replicas["gate"] = (m.dp_group.ranks, digest([m.router.gate.weight]))
        return replicas

    def extra(self) -> dict:
        return ep_records.rank_extra(self.m.layer, self.first_routing, self.records, self.step_s)


class _Model:
    """This rank's MoE layer, router and groups, built from the seeded full weights; one training step."""

    def __init__(self, ctx, cfg: EPConfig, mesh):
        self.cfg, self.rank = cfg, ctx.rank
        ep_group, self.edp_group, self.dp_group = mesh["ep"], mesh["edp"], mesh["dp"]
        self.ep_size = ep_group.size
        experts_w, gate_w = initial_weights(cfg)
        self.layer = MoELayer(cfg.hidden, cfg.experts, ep_group, ep_group.local_rank(ctx.rank),
                              expect_extra_row=cfg.fault_split_mismatch and ctx.rank == FAULT_RANK).to(ctx.device)
        with torch.no_grad():
            for l, expert in enumerate(self.layer.experts):
                expert.linear.weight.copy_(experts_w[self.layer.first + l])
        self.router = make_router(cfg, gate_w, ctx.device)
        self.named = self.layer.named_expert_weights() + (
            [("gate.weight", self.router.gate.weight)] if self.router else [])
        rows = static_rows(cfg)
        # On the CPU: the splits are read on the host, which a device tensor would pay with a synchronise.
        self.counts_SL = None if rows is None else torch.tensor(
            [rows[self.layer.first:self.layer.first + self.layer.local]] * ep_group.size)
        self.pad_to = capacity(cfg) if cfg.pad else None

    def train_step(self, step: int, x_TD: torch.Tensor, fixed=None):
        """Route, dispatch, experts, combine, loss, backward, expert sync in edp and gate sync in dp.
        `fixed`: a (routing, packing pack_plan of it) reused instead of routing again (fixed routing only)."""
        routing, packing = fixed if fixed is not None else (route(self.cfg, step, self.rank, x_TD, self.router), None)
        out_TD, record = self.layer(x_TD, routing, self.pad_to, self.counts_SL, packing)
        loss = step_loss(self.cfg, out_TD, routing)
        loss.backward()
        # An expert's local gradient already sums the losses of the ep sources that sent it tokens;
        # averaging over edp alone would leave it ep times the gradient of the mean loss over all
        # ranks that the dense gate gets from its dp average. Scale first, as Megatron scales expert
        # gradients, so that every parameter follows the gradient of one objective.
        for _, w in self.layer.named_expert_weights():
            w.grad.div_(self.ep_size)
        sync_grads(self.layer.named_expert_weights(), self.edp_group, label="edp.grad_sync")
        if self.router is not None:
            sync_grads([("gate.weight", self.router.gate.weight)], self.dp_group, label="dp.grad_sync")
        return routing, out_TD, record, loss
