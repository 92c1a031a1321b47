"""The parameters of ``nd_mlp`` and its mesh: world = tp x pp x dp, ep carved from dp."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from ...core.errors import UsageError
from ...core.mesh import Layout
from ...core.sizes import check_choice, check_positive, world_and_dp
from ...models.pipeline.schedules import SCHEDULES
from ...predict.placement import SEMANTICS, SUMMED

ROUTINGS = ("balanced", "skewed")


@dataclass(frozen=True)
class NDConfig:
    world: int | None = None
    """Number of ranks; None: tp * pp * dp, or 8 when --dp is not given either."""
    tp: int = 2
    """Tensor-parallel size T of every dense stage; must divide --ffn."""
    pp: int = 2
    """Pipeline stages."""
    dp: int | None = None
    """Data-parallel replicas; None: world / (tp * pp). Given with --world, they must agree."""
    batch: int = 32
    """Rows of each replica's batch per step, split into equal microbatches."""
    microbatches: int = 2
    """Microbatches M per step; must divide --batch."""
    schedule: str = "gpipe"
    """Pipeline schedule: gpipe or 1f1b."""
    hidden: int = 128
    """Model dim D: every stage boundary carries [b, D]."""
    ffn: int = 256
    """FFN dim H of each dense stage, sharded over tp."""
    semantics: str = SUMMED
    """TP gradient semantics: summed-loss or replicated-loss."""
    pp_scatter_gather: bool = False
    """Send 1/T of each boundary tensor and all-gather it in the receiver's tp group (Megatron)."""
    moe: bool = False
    """The last stage is an MoE layer over the mesh's expert groups instead of a TP MLP."""
    ep: int | None = None
    """Expert-parallel size (--moe only), a divisor of dp; None: dp."""
    experts: int | None = None
    """Number of experts (--moe only), a multiple of ep; None: ep."""
    routing: str = "balanced"
    """Deterministic top-1 routing: balanced or skewed."""
    skew: str = "7:1"
    """skewed: token ratio, hot:rest or one weight per expert."""
    steps: int = 2
    """SGD steps; the first is captured."""
    lr: float = 0.5
    """SGD learning rate, the same for the ranks and the reference."""
    fault_pp_no_grad: bool = False
    """FAULT INJECTION, not a CLI flag: in FAULT_RANK's pipeline, the stage after FAULT_RANK's never sends
    the activation gradient back (docs/chapter.md, Q14 and Q15). The hang spreads to the tp and dp peers that
    wait for the stuck rank; the doctor must still place its cause on the pp axis."""
    dp_group_fault: bool = False
    """FAULT INJECTION, not a CLI flag: dense shard gradients are averaged over the tp group (ranks
    holding different shards: the chapter's "DP over [0,1]", docs/chapter.md Q2) instead of the dp group."""

    @cached_property
    def layout(self) -> Layout:
        """The mesh this configuration runs on (once validation has filled in every size)."""
        return Layout(self.world, tp=self.tp, pp=self.pp, ep=self.ep, order=ORDER)


def resolve(cfg: NDConfig) -> NDConfig:
    """Fill world, dp, ep and experts; UsageError (one line, with the values) otherwise."""
    check_positive(cfg, ("world", "tp", "pp", "dp", "batch", "microbatches", "hidden", "ffn", "ep", "experts", "steps"))
    check_choice("semantics", cfg.semantics, SEMANTICS)
    check_choice("schedule", cfg.schedule, SCHEDULES)
    check_choice("routing", cfg.routing, ROUTINGS)
    if cfg.ffn % cfg.tp:
        raise UsageError(f"--tp {cfg.tp} does not divide --ffn {cfg.ffn}; pick a divisor of {cfg.ffn}")
    if cfg.batch % cfg.microbatches:
        raise UsageError(f"--batch {cfg.batch} is not divisible by --microbatches {cfg.microbatches}")
    rows = cfg.batch // cfg.microbatches
    if cfg.pp_scatter_gather and rows % cfg.tp:
        raise UsageError(f"--pp-scatter-gather splits each microbatch's {rows} rows over --tp {cfg.tp}; "
                         f"make batch/microbatches a multiple of tp")
    world, dp = world_and_dp(cfg.world, cfg.dp, cfg.tp * cfg.pp, f"tp x pp ({cfg.tp} x {cfg.pp})", 8)
    cfg = replace(cfg, world=world, dp=dp)
    if cfg.fault_pp_no_grad and cfg.pp < 2:
        raise UsageError(f"the pp-no-grad fault needs a stage boundary; --pp {cfg.pp} has none (use --pp 2 or more)")
    if not cfg.moe:
        if cfg.ep is not None or cfg.experts is not None:
            raise UsageError("--ep and --experts need --moe (the dense chain has no experts)")
        return replace(cfg, ep=1)
    ep = cfg.ep or cfg.dp
    if cfg.dp % ep:
        raise UsageError(f"--ep {ep} does not divide dp {cfg.dp}: ep is carved from dp; pick a divisor of {cfg.dp}")
    experts = cfg.experts or ep
    if experts % ep:
        raise UsageError(f"--experts {experts} is not a multiple of --ep {ep} (experts per EP rank)")
    return replace(cfg, ep=ep, experts=experts)

ORDER = "tp-cp-dp-ep-pp"
"""Dense groups as the default order; ep carved from dp in the expert family (module docstring)."""

