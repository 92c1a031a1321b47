"""``pp_mb1``, ``pp_mb8``, ``pp_1f1b_mb8``: the chapter's two-stage pipeline, its P2P boundary and schedules.

The chapter's pipeline communication boundary and microbatch experiment (docs/chapter.md, Q14-Q18): world 4 =
two pipeline replicas of two stages, rank 0 -> rank 1 and rank 2 -> rank 3, stage DP groups [0, 2] and [1, 3].
That is the mesh with pp varying fastest (order ``pp-tp-cp-ep-dp``); P2P peers come from the mesh's pp group.
Each replica trains a chain of pp Linear layers (GELU after every one but the last, MSE loss) on its own batch
of `batch` rows, split into M microbatches, under a GPipe or 1F1B schedule; then each stage's weight gradient is
all-reduced in its stage DP group (2 MiB at the defaults) and SGD steps.

Layer widths alternate D, H, D, H, ... (--hidden, --ffn): the chapter's 512 -> 1024 -> 512 for two stages,
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

import torch
import torch.distributed as dist

from ...core.events import CommEvent
from ...core.result import Check
from ...models.data_parallel import sgd_step, sync_grads
from ...models.pipeline import timeline
from ...models.pipeline.schedules import check_matched, program, stash_bound
from ...models.pipeline.stage import StageBoundary, chain_stage, run_program
from .. import register
from ..numerics import TOLERANCE, Worst, bound, digest
from ..template import RankOutput, RankTrainer, TrainedExperiment
from .config import PPConfig, fault_knobs, resolve, widths
from .predict import predict_step
from .reference import init_weights, reference_step, replica_batch


class Pipeline(TrainedExperiment):
    Config = PPConfig
    faults = {"p2p-shape": {"fault_p2p_shape": True}, "p2p-order": {"fault_p2p_order": True},
              "pp-no-grad": {"fault_pp_no_grad": True}}

    def config(self, overrides: dict) -> PPConfig:
        return resolve(super().config(overrides))


    def predict(self, cfg) -> list[CommEvent]:
        return predict_step(cfg)

    def trainer(self, ctx, cfg) -> PPTrainer:
        return PPTrainer(ctx, cfg)

    def step_fn(self, ctx, cfg):
        mesh = ctx.mesh(cfg.layout)
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

    def summarize(self, cfg, outputs: list[RankOutput], label: str) -> dict:
        """The ``timeline`` section (one step's spans per rank, bubble vs theory, peak stash, and each
        stage's weight digest so runs under different schedules can be compared) and the files it is
        drawn in (`timeline.paths`: Chrome trace and Gantt PNG under ``figures/``, named after the
        run's label), which the report layer writes: the ranks only measure."""
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
        section["files"] = timeline.paths(label)
        return {"timeline": section}



class PPTrainer(RankTrainer):
    """This rank's stage of its pipeline replica, run by the schedule's program, and the unsharded
    chain of every stage on every replica's batch. The last step is recorded as the timeline."""

    def __init__(self, ctx, cfg: PPConfig):
        self.ctx, self.cfg = ctx, cfg
        mesh = ctx.mesh(cfg.layout)
        pp_g, self.dp_g = mesh["pp"], mesh["dp"]
        self.stage, self.replica, m = pp_g.local_rank(ctx.rank), self.dp_g.local_rank(ctx.rank), cfg.microbatches
        check_matched(cfg.schedule, cfg.pp, m)  # fail fast on a schedule that could deadlock
        self.prog = program(cfg.schedule, cfg.pp, self.stage, m)
        self.ws = init_weights(cfg)
        self.w_OI = self.ws[self.stage].clone().to(ctx.device).requires_grad_()
        self.boundary = StageBoundary(pp_g, self.stage, widths(cfg), cfg.batch // m, ctx.device,
                                      **fault_knobs(cfg, cfg.layout, ctx.rank))
        self.boundary.check_shapes(m)
        self.recorder = timeline.Recorder(ctx.device)
        self.spans, self.step_bytes, self.peak = [], None, 0

    def prepare(self, step: int) -> None:
        if step == self.cfg.steps - 1:  # the timed step: common time zero on every rank, right after a barrier
            dist.barrier(group=self.ctx.control)
        self.recorder.start()

    def train(self, step: int) -> float | None:
        cfg, m, last = self.cfg, self.cfg.microbatches, self.stage == self.cfg.pp - 1
        self.batches = [replica_batch(cfg, step, r) for r in range(cfg.dp)]
        x_ND, t_NO = (t.to(self.ctx.device) for t in self.batches[self.replica])
        # every microbatch's F and B with their P2P, then the DP sync
        forward = chain_stage(self.w_OI, t_NO.chunk(m), last, m)
        self.outs, mb_losses, self.peak = run_program(self.prog, self.boundary, forward, x_ND.chunk(m), self.recorder)
        sync_grads([(f"stage{self.stage}.weight", self.w_OI)], self.dp_g)
        return sum(mb_losses).item() if last else None

    def compare(self, step: int, worst: Worst) -> None:
        if step == self.cfg.steps - 1:
            self.spans, self.step_bytes = self.recorder.spans(), self.recorder.peak_step_bytes()
        ref_outs, ref_grads = reference_step(self.ws, self.batches)
        worst.add("output", torch.cat(self.outs), ref_outs[self.replica][self.stage])
        worst.add("grad", self.w_OI.grad, ref_grads[self.stage])
        sgd_step([self.w_OI], self.cfg.lr)
        self.ws = [w - self.cfg.lr * g for w, g in zip(self.ws, ref_grads)]

    def finish(self, worst: Worst) -> list[Check]:
        cfg = self.cfg
        worst.add("weights", self.w_OI, self.ws[self.stage])
        self.want = stash_bound(cfg.schedule, cfg.pp, self.stage, cfg.microbatches)
        return [
            bound("stage output == unsharded chain", worst.abs["output"], TOLERANCE),
            worst.check("stage weight grad == unsharded chain", "grad"),
            bound(f"weights after {cfg.steps} SGD steps == unsharded", worst.abs["weights"], TOLERANCE),
            Check("peak stashed activations == schedule bound", self.peak == self.want,
                  f"stage {self.stage}: {self.peak} stashed, bound {self.want} ({cfg.schedule}, M={cfg.microbatches})"),
        ]

    def replicas(self) -> dict:
        return {"stage weights": (self.dp_g.ranks, digest([self.w_OI]))} if self.dp_g.size > 1 else {}

    def extra(self) -> dict:
        extra = {"stage": self.stage, "spans": self.spans, "peak_stash": self.peak, "stash_bound": self.want,
                 "weights_digest": digest([self.w_OI]), "clock": self.recorder.clock}
        if self.step_bytes is not None:
            extra["peak_step_bytes"] = self.step_bytes
        return extra


register(Pipeline, "pp_mb1", "2-stage pipeline x 2 replicas, batch 64 as 1 microbatch, GPipe", microbatches=1)
register(Pipeline, "pp_mb8", "2-stage pipeline x 2 replicas, batch 64 as 8 microbatches, GPipe", microbatches=8)
register(Pipeline, "pp_1f1b_mb8", "pp_mb8 under the 1F1B schedule", microbatches=8, schedule="1f1b")
