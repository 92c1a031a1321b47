"""The parameters of the ``tp_*`` experiments and their validation: world = tp x dp (the chapter's
world of 4 when neither is given), tp divides the FFN dim, SP divides the batch."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from ...core.errors import UsageError
from ...core.mesh import Layout
from ...core.sizes import check_choice, check_positive, world_and_dp
from ...predict.placement import SEMANTICS, SUMMED

CHAPTER_WORLD = 4
"""The chapter's world when neither --world nor --dp is given."""


@dataclass(frozen=True)
class TPConfig:
    world: int | None = None
    """Number of ranks; None: tp * dp, or the chapter's 4 when --dp is not given either."""
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
    shards: the chapter's "DP over [0,1]", docs/chapter.md Q2) instead of the DP group. The gradient and
    replica checks must fail."""

    @cached_property
    def layout(self) -> Layout:
        """The mesh this configuration runs on (once validation has filled in every size)."""
        return Layout(self.world, tp=self.tp)




def resolve(cfg: TPConfig) -> TPConfig:
    """Fill world and dp from each other through tp; UsageError (one line, with the values) when the
    parameters cannot form the MLP's layout."""
    check_positive(cfg, ("world", "tp", "dp", "batch", "hidden", "ffn", "steps"))
    check_choice("semantics", cfg.semantics, SEMANTICS)
    if cfg.ffn % cfg.tp:
        raise UsageError(f"--tp {cfg.tp} does not divide --ffn {cfg.ffn}: W1 rows and W2 columns are sharded "
                         f"over tp; pick a divisor of {cfg.ffn}")
    world, dp = world_and_dp(cfg.world, cfg.dp, cfg.tp, "tp", CHAPTER_WORLD)
    cfg = replace(cfg, world=world, dp=dp)
    if cfg.sequence_parallel and cfg.batch % cfg.tp:
        raise UsageError(f"--batch {cfg.batch} is not divisible by --tp {cfg.tp}: sequence parallel "
                         f"reduce-scatters the batch rows over tp")
    return cfg
