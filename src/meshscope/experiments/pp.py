"""``pp_mb1``, ``pp_mb8``, ``pp_1f1b_mb8``: the seed's two-stage pipeline, its P2P boundary and schedules.

The seed ("Pipeline Parallel 的通信边界", "Microbatch 参数实验"): world 4 = two pipeline replicas of two
stages, rank 0 -> rank 1 and rank 2 -> rank 3, stage DP groups [0, 2] and [1, 3]. That is the mesh with
pp varying fastest (order ``pp-tp-cp-ep-dp``); P2P peers come from the mesh's pp group. Each replica
trains a chain of pp Linear layers (GELU after every one but the last, MSE loss) on its own batch of
`batch` rows, split into M microbatches, under a GPipe or 1F1B schedule; then each stage's weight
gradient is all-reduced in its stage DP group (2 MiB at the defaults) and SGD steps.

Layer widths alternate D, H, D, H, ... (--hidden, --ffn): the seed's 512 -> 1024 -> 512 for two stages,
so every boundary of an even stage carries [b, H] and of an odd stage [b, D].

Prediction per rank and step: M activation messages forward and M gradient messages backward across
each boundary the stage touches (b x width x 4 bytes: 32 KiB at mb8, 256 KiB at mb1 -- the total
unchanged), in the order of the stage's P2P program, plus one DP all-reduce of the stage weight.
Verification is against the unsharded chain trained on the same batches: every stage's outputs and
weight gradient each step, the weights after `steps`, DP replica equality and finite losses. The last
step's per-microbatch F/B spans form the ``timeline`` section (bubble, peak stash) and its files.

Legend: b microbatch rows, D --hidden, H --ffn, I/O a stage's input/output width, N = batch rows.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import timeline
from ..capture import Capture
from ..errors import UsageError
from ..events import CommEvent
from ..faults import FAULT_RANK
from ..mesh import Layout
from ..models.data_parallel import predict_grad_sync, sgd_step, sync_grads
from ..models.pipeline import (SCHEDULES, Exchange, StageBoundary, chain_stage, check_matched, program, run_program,
                               stage_forward, stash_bound)
from ..predict import Ledger
from ..verify import digest
from . import Check, Experiment, RankOutput, bound, register
from .numerics import TOLERANCE, Worst, finite
from .sizes import check_choice, check_positive, world_and_dp

ORDER = "pp-tp-cp-ep-dp"
"""pp varies fastest: consecutive ranks form a pipeline replica (the seed's rank 0 -> 1, 2 -> 3)."""


@dataclass(frozen=True)
class PPConfig:
    world: int | None = None
    """Number of ranks; None: pp * dp, or the seed's 4 when --dp is not given either."""
    pp: int = 2
    """Pipeline stages P (one Linear layer each); at least 2 and a divisor of the world."""
    dp: int | None = None
    """Pipeline replicas (stage DP size); None: world / pp. Given with --world, the two must agree."""
    batch: int = 64
    """Rows N of each replica's batch per step (the seed's 64), split into M equal microbatches."""
    microbatches: int = 1
    """Microbatches M per step; must divide --batch."""
    schedule: str = "gpipe"
    """gpipe (fill-drain) or 1f1b (warmup, steady one-forward-one-backward, cooldown)."""
    hidden: int = 512
    """D: width of the input and of every even boundary."""
    ffn: int = 1024
    """H: width of every odd layer's input (stage 0's output h [N, H] in the seed)."""
    steps: int = 3
    """SGD steps; the first is captured, the last is timed for the timeline."""
    lr: float = 0.5
    """SGD learning rate, the same for the pipeline and the reference."""
    fault_p2p_shape: bool = False
    """FAULT INJECTION, not a CLI flag: rank FAULT_RANK (a receiving stage) expects one activation row
    too many. The run must stop with a clear P2P shape error instead of hanging or crashing the transport."""
    fault_p2p_order: bool = False
    """FAULT INJECTION, not a CLI flag: in FAULT_RANK's replica, both ends of the boundary between
    FAULT_RANK's stage and its upstream neighbour send first, each blocking until its send is received
    (seed, "PP hang": send/recv顺序不一致). Needs an exchange carrying messages both ways (1F1B, M >= 2)."""
    fault_pp_no_grad: bool = False
    """FAULT INJECTION, not a CLI flag: FAULT_RANK's stage never sends the activation gradient back, so
    its upstream stage waits in its receive until the timeout (seed: PP反向无gradient)."""


def resolve(cfg: PPConfig) -> PPConfig:
    """Fill world and dp from each other through pp; UsageError (one line, with the values) otherwise."""
    check_positive(cfg, ("world", "pp", "dp", "batch", "microbatches", "hidden", "ffn", "steps"))
    check_choice("schedule", cfg.schedule, SCHEDULES)
    if cfg.pp < 2:
        raise UsageError(f"--pp {cfg.pp} has no stage boundary; a pipeline needs --pp 2 or more")
    if cfg.batch % cfg.microbatches:
        raise UsageError(f"--batch {cfg.batch} is not divisible by --microbatches {cfg.microbatches}; "
                         f"microbatches must be equal (pick a divisor of {cfg.batch})")
    if cfg.fault_p2p_order and not _two_way(cfg):
        raise UsageError(f"the p2p-order fault needs an exchange carrying messages both ways, which "
                         f"{cfg.schedule} with M={cfg.microbatches} never posts; use --schedule 1f1b "
                         f"--microbatches 2 or more (e.g. pp_1f1b_mb8)")
    world, dp = world_and_dp(cfg.world, cfg.dp, cfg.pp, "pp", 4)
    return replace(cfg, world=world, dp=dp)


def _two_way(cfg: PPConfig) -> bool:
    """Whether stage 0's program has an exchange with messages in both directions (1F1B steady state)."""
    return any(isinstance(ex, Exchange) and len({m.sender for m in ex.messages}) == 2
               for ex in program(cfg.schedule, cfg.pp, 0, cfg.microbatches))


def fault_knobs(cfg: PPConfig, layout: Layout, rank: int) -> dict:
    """The StageBoundary fault knobs of `rank` (all off unless a FAULT INJECTION field is set).

    Every planted fault sits in FAULT_RANK's pipeline replica only, so the other replicas run
    healthily into the DP sync and the doctor must still name the planted boundary first."""
    if rank not in layout.group_of("pp", FAULT_RANK):
        return {}
    stage, faulty = layout.coords(rank)["pp"], layout.coords(FAULT_RANK)["pp"]
    upstream = max(faulty - 1, 0)  # the boundary (upstream, upstream + 1) touching FAULT_RANK's stage
    knobs = {"expect_extra_rows": int(cfg.fault_p2p_shape and rank == FAULT_RANK),
             "drop_gradients": cfg.fault_pp_no_grad and rank == FAULT_RANK}
    if cfg.fault_p2p_order and stage in (upstream, upstream + 1):
        knobs["send_first_with"] = upstream + 1 if stage == upstream else upstream
    return knobs


def widths(cfg: PPConfig) -> list[int]:
    """Boundary widths d_0..d_P: layer s maps d_s -> d_{s+1}; alternating D, H, D, H, ..."""
    return [cfg.hidden if k % 2 == 0 else cfg.ffn for k in range(cfg.pp + 1)]


def init_weights(cfg: PPConfig) -> list[torch.Tensor]:
    """Full W_s [d_{s+1}, d_s] of every stage, identical on every rank (fixed seed)."""
    g, d = torch.Generator().manual_seed(0), widths(cfg)
    return [torch.randn(d[s + 1], d[s], generator=g) / d[s] ** 0.5 for s in range(cfg.pp)]


def replica_batch(cfg: PPConfig, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_ND, target_NO) of pipeline replica `replica` at `step`; every rank can build every replica's."""
    g = torch.Generator().manual_seed(1 + step * cfg.dp + replica)
    return torch.randn(cfg.batch, cfg.hidden, generator=g), torch.randn(cfg.batch, widths(cfg)[-1], generator=g)


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


# -- the unsharded reference -------------------------------------------------------------------------
def reference_step(ws, batches) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """The whole chain in one process on each replica's full batch: per replica every layer's output;
    weight gradients of the mean loss averaged over replicas, as the DP sync does."""
    params = [w.detach().requires_grad_() for w in ws]
    outs, grads = [], [torch.zeros_like(w) for w in ws]
    for x_ND, t_NO in batches:
        h, layer_outs = x_ND, []
        for s, w in enumerate(params):
            h = stage_forward(h, w, s == len(params) - 1)
            layer_outs.append(h.detach())
        for g, dw in zip(grads, torch.autograd.grad(F.mse_loss(h, t_NO), params)):
            g += dw / len(batches)
        outs.append(layer_outs)
    return outs, grads




class Pipeline(Experiment):
    Config = PPConfig
    faults = {"p2p-shape": {"fault_p2p_shape": True}, "p2p-order": {"fault_p2p_order": True},
              "pp-no-grad": {"fault_pp_no_grad": True}}

    def config(self, overrides: dict) -> PPConfig:
        return resolve(super().config(overrides))

    def layout(self, cfg) -> Layout:
        return Layout(cfg.world, pp=cfg.pp, order=ORDER)

    def predict(self, cfg) -> list[CommEvent]:
        return predict_step(cfg)

    def run_rank(self, ctx, cfg) -> RankOutput:
        mesh = ctx.mesh(self.layout(cfg))
        pp_g, dp_g = mesh["pp"], mesh["dp"]
        stage, replica, m = pp_g.local_rank(ctx.rank), dp_g.local_rank(ctx.rank), cfg.microbatches
        check_matched(cfg.schedule, cfg.pp, m)  # fail fast on a schedule that could deadlock
        prog = program(cfg.schedule, cfg.pp, stage, m)
        ws = init_weights(cfg)
        w_OI = ws[stage].clone().to(ctx.device).requires_grad_()
        boundary = StageBoundary(pp_g, stage, widths(cfg), cfg.batch // m, ctx.device,
                                 **fault_knobs(cfg, self.layout(cfg), ctx.rank))
        boundary.check_shapes(m)
        recorder = timeline.Recorder(ctx.device)
        worst = Worst()
        losses, events, spans, peak = [], [], [], 0
        for step in range(cfg.steps):
            batches = [replica_batch(cfg, step, r) for r in range(cfg.dp)]
            x_ND, t_NO = (t.to(ctx.device) for t in batches[replica])
            timed = step == cfg.steps - 1
            if timed:  # common time zero on every rank: right after a barrier
                dist.barrier(group=ctx.control)
            recorder.start()
            capture = Capture() if step == 0 else contextlib.nullcontext()
            with capture:  # one full step: every microbatch's F and B with their P2P, then DP sync
                forward = chain_stage(w_OI, t_NO.chunk(m), stage == cfg.pp - 1, m)
                outs, mb_losses, peak = run_program(prog, boundary, forward, x_ND.chunk(m), recorder)
                sync_grads([(f"stage{stage}.weight", w_OI)], dp_g)
            if step == 0:
                events = capture.events
            if timed:
                spans, step_bytes = recorder.spans(), recorder.peak_step_bytes()
            ref_outs, ref_grads = reference_step(ws, batches)
            worst.add("output", torch.cat(outs), ref_outs[replica][stage])
            worst.add("grad", w_OI.grad, ref_grads[stage])
            if stage == cfg.pp - 1:
                losses.append(sum(mb_losses).item())
            sgd_step([w_OI], cfg.lr)
            ws = [w - cfg.lr * g for w, g in zip(ws, ref_grads)]
        worst.add("weights", w_OI, ws[stage])
        want = stash_bound(cfg.schedule, cfg.pp, stage, m)
        checks = [
            bound("stage output == unsharded chain", worst.abs["output"], TOLERANCE),
            worst.check("stage weight grad == unsharded chain", "grad"),
            bound(f"weights after {cfg.steps} SGD steps == unsharded", worst.abs["weights"], TOLERANCE),
            Check("peak stashed activations == schedule bound", peak == want,
                  f"stage {stage}: {peak} stashed, bound {want} ({cfg.schedule}, M={m})"),
        ]
        if losses:
            checks.append(Check("losses finite", all(map(finite, losses)),
                                f"{len(losses)} losses, last {losses[-1]:.6g}"))
        replicas = {"stage weights": (dp_g.ranks, digest([w_OI]))} if dp_g.size > 1 else {}
        extra = {"stage": stage, "spans": spans, "peak_stash": peak, "stash_bound": want, "losses": losses,
                 "weights_digest": digest([w_OI]), "clock": recorder.clock, "run_dir": str(ctx.run_dir)}
        if step_bytes is not None:
            extra["peak_step_bytes"] = step_bytes
        return RankOutput(ctx.rank, events, checks=checks, replicas=replicas, extra=extra,
                          numerics=worst.numerics())

    def step_fn(self, ctx, cfg):
        mesh = ctx.mesh(self.layout(cfg))
        pp_g, dp_g = mesh["pp"], mesh["dp"]
        stage, m = pp_g.local_rank(ctx.rank), cfg.microbatches
        prog = program(cfg.schedule, cfg.pp, stage, m)
        w_OI = init_weights(cfg)[stage].clone().to(ctx.device).requires_grad_()
        boundary = StageBoundary(pp_g, stage, widths(cfg), cfg.batch // m, ctx.device)
        x_ND, t_NO = (t.to(ctx.device) for t in replica_batch(cfg, 0, dp_g.local_rank(ctx.rank)))

        def step():  # no timeline recorder: its CUDA events and memory statistics are not the step's work
            run_program(prog, boundary, chain_stage(w_OI, t_NO.chunk(m), stage == cfg.pp - 1, m), x_ND.chunk(m))
            sync_grads([(f"stage{stage}.weight", w_OI)], dp_g)
            sgd_step([w_OI], cfg.lr)

        return step

    def summarize(self, cfg, outputs: list[RankOutput]) -> dict:
        """The ``timeline`` section (one step's spans per rank, bubble vs theory, peak stash, and each
        stage's weight digest so runs under different schedules can be compared), and its files
        (Chrome trace, Gantt PNG) written into rank 0's run directory."""
        keys = ("stage", "peak_stash", "stash_bound", "peak_step_bytes", "spans")
        ranks = [{"rank": o.rank, **{k: o.extra[k] for k in keys if k in o.extra}}
                 for o in sorted(outputs, key=lambda o: o.rank)]
        section = {
            "schedule": cfg.schedule, "pp": cfg.pp, "microbatches": cfg.microbatches,
            "clock": outputs[0].extra["clock"],
            "ranks": ranks,
            "bubble_fraction": timeline.bubble_fraction([r["spans"] for r in ranks]),
            "bubble_theory": timeline.bubble_theory(cfg.pp, cfg.microbatches),
            "weights_digest": [next(o.extra["weights_digest"] for o in outputs if o.extra["stage"] == s)
                               for s in range(cfg.pp)],
        }
        stem = self.name if cfg == self.config({}) else f"{self.name}-pp{cfg.pp}-dp{cfg.dp}-{cfg.schedule}-mb{cfg.microbatches}"
        section["files"] = timeline.write_files(outputs[0].extra["run_dir"], stem, section)
        return {"timeline": section}


register(Pipeline, "pp_mb1", "2-stage pipeline x 2 replicas, batch 64 as 1 microbatch, GPipe", microbatches=1)
register(Pipeline, "pp_mb8", "2-stage pipeline x 2 replicas, batch 64 as 8 microbatches, GPipe", microbatches=8)
register(Pipeline, "pp_1f1b_mb8", "pp_mb8 under the 1F1B schedule", microbatches=8, schedule="1f1b")
