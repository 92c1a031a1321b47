"""``ep_*``: expert-parallel MoE training, predicted, captured and checked (seed, "Expert Parallel / MoE").

Seed defaults: world 4 = ep 2 x edp 2, FP32; every rank is a source of 64 tokens x 512 that require
grad (they stand for a trainable upstream activation); 2 experts, one per EP rank, each Linear 512x512
+ GELU; loss = mean(out^2). Per rank per step the seed counts 4 all_to_all (dispatch, combine and their
backwards) + 1 all_reduce (the expert's gradient in its expert-DP group); without input grad the
reverse dispatch is pruned: 3 all_to_all ("为什么最初只有3个 A2A Kernel").

``ep_learned`` adds the real router (gate, top-k, capacity, Switch aux loss). Its splits are not known
before routing, so the counts go first in an all_to_all of int64 (splits [1] * ep); with ``--pad`` the
buffers are fixed-size and that exchange disappears. The gate is a dense parameter: its gradient is
averaged in the dense dp group, the experts' in edp.

The predictor recomputes the routing on the CPU from the seeds and the initial weights (the router is
a pure function of them), packs it with the same `pack_plan`, and walks forward and backward: dispatch
-> combine, reverse combine -> reverse dispatch if the tokens need grad, then the grad syncs.
Step 0 is the captured step. Legend: T tokens per source, D model dim, E experts, L local experts.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch

from ...capture.recorder import Capture
from ...core.errors import UsageError
from ...core.events import CommEvent
from ...core.faults import FAULT_RANK
from ...core.result import Check
from ...core.sizes import check_positive
from ...models.data_parallel import predict_grad_sync, sgd_step, sync_grads
from ...models.moe.dispatch import destination_splits, pack_plan
from ...models.moe.layer import MoELayer
from ...predict.ledger import Ledger
from .. import register
from ..numerics import TOLERANCE, Worst, bound, digest, finite
from ..template import Experiment, RankOutput
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


def backward_note(cfg: EPConfig) -> str:
    """Why the step has the all_to_alls it has, in plain words (seed: autograd prunes, NCCL does not skip)."""
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


class ExpertParallel(Experiment):
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
        layout, ledger = cfg.layout, Ledger(cfg.layout)
        experts, gate = initial_weights(cfg)
        router = make_router(cfg, gate)
        pad_to = capacity(cfg) if cfg.pad else None
        with torch.no_grad():
            rows = {r: pack_plan(route(cfg, 0, r, source_tokens(cfg, 0, r), router).expert_A, cfg.experts, pad_to).rows_E
                    for r in range(cfg.world)}
        exchange = static_rows(cfg) is None
        row = cfg.hidden
        for r in range(cfg.world):
            members = layout.group_of("ep", r)
            ep, me = len(members), members.index(r)
            local = cfg.experts // ep
            send = destination_splits(rows[r], ep)
            recv = [destination_splits(rows[s], ep)[me] for s in members]
            if exchange:
                ledger.emit(r, "all_to_all", "ep", "forward", region="moe.counts", input_splits=[1] * ep,
                            output_splits=[1] * ep, row_numel=local, dtype="int64")
            # Forward: token order -> expert order (dispatch), expert order -> token order (combine).
            ledger.emit(r, "all_to_all", "ep", "forward", region="moe.dispatch", input_splits=send,
                        output_splits=recv, row_numel=row)
            ledger.emit(r, "all_to_all", "ep", "forward", region="moe.combine", input_splits=recv,
                        output_splits=send, row_numel=row)
            # Backward (step 5): each A2A's dual with the splits swapped, newest first; the dispatch's
            # input is x, so its edge exists only if x requires grad.
            ledger.emit(r, "all_to_all", "ep", "backward", region="moe.combine", input_splits=send,
                        output_splits=recv, row_numel=row)
            if cfg.input_grad:
                ledger.emit(r, "all_to_all", "ep", "backward", region="moe.dispatch", input_splits=recv,
                            output_splits=send, row_numel=row)
            # Step 6: expert replicas in edp, the replicated gate in the dense dp group.
            first = me * local
            predict_grad_sync(ledger, r, "edp", [(f"expert{first + l}.weight", row * row) for l in range(local)],
                              label="edp.grad_sync")
            if gate is not None:
                predict_grad_sync(ledger, r, "dp", [("gate.weight", gate.numel())], label="dp.grad_sync")
        return ledger.events

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

    def run_rank(self, ctx, cfg: EPConfig) -> RankOutput:
        layout = cfg.layout
        m = _Model(ctx, cfg, ctx.mesh(layout))
        layer, router, named = m.layer, m.router, m.named
        edp_group, dp_group = m.edp_group, m.dp_group
        ref = reference_training(cfg, layout, ctx.rank)
        losses, step_s, records, worst = [], [], [], Worst()
        for step in range(cfg.steps):
            x_TD = source_tokens(cfg, step, ctx.rank).to(ctx.device).requires_grad_(tokens_need_grad(cfg))
            start = time.perf_counter()
            with Capture() if step == 0 else contextlib.nullcontext() as cap:
                routing, out_TD, record, loss = m.train_step(step, x_TD)
            ctx.synchronize()
            step_s.append(time.perf_counter() - start)
            losses.append(loss.item())
            records.append(record)
            if step == 0:
                events, first_routing, x_grad = cap.events, routing, x_TD.grad
                worst.add("output", out_TD, ref["output"])
                for n, p in named:
                    worst.add("grad", p.grad, ref["grads"][n])
                if cfg.input_grad:
                    worst.add("input_grad", x_grad, ref["x_grad"])
            sgd_step([p for _, p in named], cfg.lr)
        for n, p in named:
            worst.add("weights", p, ref["weights"][n])
        checks = [
            bound("outputs match the dense reference (step 0)", worst.abs["output"], TOLERANCE),
            worst.check("expert and gate gradients match the reference", "grad"),
            *([worst.check("x gradient matches the reference", "input_grad")] if cfg.input_grad else []),
            bound(f"weights match the reference after {cfg.steps} SGD steps", worst.abs["weights"], TOLERANCE),
            Check("losses finite", all(map(finite, losses)), f"losses {losses}"),
            _x_grad_check(cfg, x_grad),
        ]
        replicas = {"experts": (edp_group.ranks, digest([w for _, w in layer.named_expert_weights()]))}
        if router is not None:
            replicas["gate"] = (dp_group.ranks, digest([router.gate.weight]))
        numerics = worst.numerics()
        return RankOutput(ctx.rank, events, checks, numerics, replicas,
                          {**ep_records.rank_extra(layer, first_routing, records, step_s), "losses": losses})

    def summarize(self, cfg: EPConfig, outputs: list[RankOutput], label: str) -> dict:
        """The seed's production records per EP group and rank (`ep_records`), and why the step has
        the all_to_alls it has."""
        return {"experts": ep_records.summarize(cfg, cfg.layout, outputs) | {"note": backward_note(cfg)}}




def _x_grad_check(cfg: EPConfig, x_grad) -> Check:
    """Seed: "EP额外检查上游activation gradient存在且有限" - and absent when the tokens need none."""
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
