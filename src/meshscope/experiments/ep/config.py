"""The parameters of the ``ep_*`` experiments, validated; field names are the CLI override names."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ...core.mesh import Layout

ROUTINGS = ("balanced", "skewed", "learned")


@dataclass(frozen=True)
class EPConfig:
    """Parameters of the ``ep_*`` experiments; field names are the CLI override names."""

    world: int = 4
    """Number of ranks; every rank is a token source and an expert owner."""
    ep: int = 2
    """Expert-parallel size; edp = world / ep replicas of each expert."""
    experts: int = 2
    """Number of experts, experts / ep on each EP rank."""
    batch: int = 64
    """Tokens per source rank."""
    hidden: int = 512
    """Model dim D; each expert is Linear D x D + GELU."""
    routing: str = "balanced"
    """balanced | skewed (deterministic top-1) | learned (gate + top-k)."""
    skew: str = "7:1"
    """skewed: token ratio, one weight per expert or hot:rest."""
    topk: int = 1
    """Experts per token (learned routing)."""
    capacity_factor: float = 0.0
    """Switch capacity factor; capacity = ceil(factor * batch * topk / experts) per source; 0 = unlimited."""
    pad: bool = False
    """Pad every expert's buffer to its capacity, making the splits static (needs a capacity)."""
    input_grad: bool = True
    """Tokens require grad; off, autograd prunes the reverse dispatch."""
    aux_coef: float = 0.01
    """Weight of the Switch load-balancing loss (learned routing)."""
    lr: float = 0.1
    """SGD learning rate."""
    steps: int = 2
    """Training steps; step 0 is captured."""
    seed: int = 0
    """RNG seed of tokens, weights and fixed routing."""
    fault_split_mismatch: bool = False
    """FAULT INJECTION, not a CLI flag: rank FAULT_RANK expects one dispatch row more from its first EP
    peer than that peer sends (its output_splits off by one, its buffer sized to match). gloo takes the
    short dispatch silently and aborts on the combine; the doctor must name the split mismatch."""
    fault_no_input_grad: bool = False
    """FAULT INJECTION, not a CLI flag: the tokens need no grad although --input-grad (and so the
    prediction) says they do: autograd prunes the reverse dispatch, 3 all_to_all instead of 4."""

    @cached_property
    def layout(self) -> Layout:
        """The mesh this configuration runs on (once validation has filled in every size)."""
        return Layout(self.world, ep=self.ep)



def tokens_need_grad(cfg: EPConfig) -> bool:
    """Whether the run's tokens require grad: --input-grad, unless the no-input-grad fault is planted."""
    return cfg.input_grad and not cfg.fault_no_input_grad
