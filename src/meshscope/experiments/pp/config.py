"""The parameters of the ``pp_*`` experiments (world = pp x dp, pp fastest: `ORDER`), their
validation, the stage widths and the knobs of the planted P2P faults."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from ...core.errors import UsageError
from ...core.faults import FAULT_RANK
from ...core.mesh import Layout
from ...core.sizes import check_choice, check_positive, world_and_dp
from ...models.pipeline.schedules import SCHEDULES, Exchange, program

ORDER = "pp-tp-cp-ep-dp"
"""pp varies fastest: consecutive ranks form a pipeline replica (the chapter's rank 0 -> 1, 2 -> 3)."""


@dataclass(frozen=True)
class PPConfig:
    world: int | None = None
    """Number of ranks; None: pp * dp, or the chapter's 4 when --dp is not given either."""
    pp: int = 2
    """Pipeline stages P (one Linear layer each); at least 2 and a divisor of the world."""
    dp: int | None = None
    """Pipeline replicas (stage DP size); None: world / pp. Given with --world, the two must agree."""
    batch: int = 64
    """Rows N of each replica's batch per step (the chapter's 64), split into M equal microbatches."""
    microbatches: int = 1
    """Microbatches M per step; must divide --batch."""
    schedule: str = "gpipe"
    """gpipe (fill-drain) or 1f1b (warmup, steady one-forward-one-backward, cooldown)."""
    hidden: int = 512
    """D: width of the input and of every even boundary."""
    ffn: int = 1024
    """H: width of every odd layer's input (stage 0's output h [N, H] in the chapter)."""
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
    (the chapter's "PP hang": send/recv order mismatch; docs/chapter.md, Faults the doctor names). Needs an
    exchange carrying messages both ways (1F1B, M >= 2)."""
    fault_pp_no_grad: bool = False
    """FAULT INJECTION, not a CLI flag: FAULT_RANK's stage never sends the activation gradient back, so
    its upstream stage waits in its receive until the timeout (docs/chapter.md, Q14 and Q15)."""

    @cached_property
    def layout(self) -> Layout:
        """The mesh this configuration runs on (once validation has filled in every size)."""
        return Layout(self.world, pp=self.pp, order=ORDER)


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
