"""The MoE router: which expert each token goes to, with what weight, and which assignments are dropped.

The chapter's MoE data flow (docs/chapter.md, Q19): the first of the four MoE steps is the router, where
each token picks its expert, and variable splits are the router's load: the router's per-expert counts
become the AllToAllV split arrays (docs/chapter.md, Q20).
Two routers:

* `fixed_routing` - the chapter's deterministic top-1 routing, which isolates communication and load:
  per-expert token counts from a ratio (balanced 1:1 -> [32, 32], skewed 7:1 -> [56, 8] of 64 tokens),
  tokens picked through a seeded permutation so that packing really reorders them.
* `LearnedRouter` - what the chapter lists as the real thing (gate auxiliary loss, capacity, token
  drop/padding, Top-2): a linear gate, softmax, top-k, and the Switch Transformer load-balancing loss
  aux = E * sum_e f_e * P_e (Fedus et al. 2021, eq. 4), f_e the fraction of assignments routed to e
  before capacity, P_e the mean router probability of e.

`apply_capacity` then keeps at most `capacity` assignments per expert (Switch/GShard: first choices
before second choices, earlier tokens first) and drops the rest; a dropped assignment contributes
nothing to its token's output.

Legend: T tokens on this source rank, D model dim, E experts, K = top-k, A kept assignments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ...core.errors import UsageError


@dataclass
class Routing:
    """One source rank's routing decision: its kept (token, expert, weight) assignments and counts."""

    token_A: torch.Tensor
    """Token index of each kept assignment (long), in priority order."""
    expert_A: torch.Tensor
    """Expert id of each kept assignment (long)."""
    weight_A: torch.Tensor | None
    """Combine weight (the gate probability) of each kept assignment; None for fixed routing (weight 1)."""
    routed_E: list[int]
    """Assignments the router chose per expert, before capacity."""
    dropped_E: list[int]
    """Assignments dropped per expert because the expert was over capacity."""
    capacity: int | None
    """Most assignments an expert accepts from this source; None = unlimited."""
    aux_loss: torch.Tensor | None = None
    """Switch load-balancing loss (scalar, differentiable w.r.t. the gate); None for fixed routing."""

    def to(self, device) -> "Routing":
        """The same routing with its tensors on `device` (fixed routing is drawn on the CPU)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Routing(move(self.token_A), move(self.expert_A), move(self.weight_A), self.routed_E,
                       self.dropped_E, self.capacity, self.aux_loss)

    @property
    def kept_E(self) -> list[int]:
        """Assignments each expert actually receives from this source."""
        return [r - d for r, d in zip(self.routed_E, self.dropped_E)]


def parse_skew(text: str, experts: int) -> list[int]:
    """``"7:1"`` -> per-expert weights. One weight per expert, or two: expert 0 : every other expert."""
    try:
        weights = [int(w) for w in text.split(":")]
    except ValueError:
        raise UsageError(f"--skew {text!r} must be integers separated by ':' (e.g. 7:1)") from None
    if len(weights) == 2 and experts != 2:
        weights = [weights[0]] + [weights[1]] * (experts - 1)
    if len(weights) != experts:
        raise UsageError(f"--skew {text!r} gives {len(weights)} weights; give 2 (hot:rest) or one per expert ({experts})")
    if any(w < 0 for w in weights) or sum(weights) == 0:
        raise UsageError(f"--skew {text!r} needs non-negative weights with a positive sum")
    return weights


def apportion(total: int, weights: list[int]) -> list[int]:
    """Split `total` tokens in proportion to `weights` (largest remainder; ties to the lower expert).

    7:1 of 64 -> [56, 8], the chapter's skewed input_splits (docs/chapter.md, Q20); 1:1 -> [32, 32].
    """
    whole = sum(weights)
    counts = [total * w // whole for w in weights]
    remainders = sorted(range(len(weights)), key=lambda e: (-(total * weights[e] % whole), e))
    for e in remainders[: total - sum(counts)]:
        counts[e] += 1
    return counts


def fixed_routing(counts_E: list[int], generator: torch.Generator) -> Routing:
    """Deterministic top-1: expert e gets `counts_E[e]` tokens, chosen by a seeded permutation."""
    tokens = sum(counts_E)
    perm_T = torch.randperm(tokens, generator=generator)
    expert_T = torch.repeat_interleave(torch.arange(len(counts_E)), torch.tensor(counts_E))
    # Position i of the permutation holds token perm_T[i] and belongs to expert expert_T[i];
    # argsort(perm_T)[t] is token t's position, hence its expert.
    position_T = torch.argsort(perm_T)
    return Routing(token_A=torch.arange(tokens), expert_A=expert_T[position_T], weight_A=None,
                   routed_E=list(counts_E), dropped_E=[0] * len(counts_E), capacity=None)


def capacity_of(capacity_factor: float, tokens: int, topk: int, experts: int) -> int | None:
    """Switch capacity: ceil(factor * assignments / experts) per expert and source; 0 = unlimited."""
    if capacity_factor <= 0:
        return None
    return math.ceil(capacity_factor * tokens * topk / experts)


def apply_capacity(routing: Routing, capacity: int | None) -> Routing:
    """Keep the first `capacity` assignments of each expert in priority order; drop the rest."""
    if capacity is None:
        return routing
    experts = len(routing.routed_E)
    onehot_AE = nn.functional.one_hot(routing.expert_A, experts)
    position_A = (onehot_AE.cumsum(0) * onehot_AE).sum(1) - 1  # rank of each assignment within its expert
    keep_A = position_A < capacity
    dropped = torch.bincount(routing.expert_A[~keep_A], minlength=experts).tolist()
    return Routing(routing.token_A[keep_A], routing.expert_A[keep_A],
                   None if routing.weight_A is None else routing.weight_A[keep_A],
                   routing.routed_E, dropped, capacity, routing.aux_loss)


class LearnedRouter(nn.Module):
    """Linear gate -> softmax -> top-k, with the Switch load-balancing loss.

    The gate is replicated on every rank (a dense parameter: its gradient is averaged in the dense
    dp group). Routing is a pure function of the gate weight and the tokens, so the predictor can
    recompute it on CPU from the same RNG seeds (a prediction from the model, not a capture).
    """

    def __init__(self, dim: int, experts: int, topk: int):
        super().__init__()
        if not 1 <= topk <= experts:
            raise UsageError(f"--topk {topk} must be between 1 and the number of experts ({experts})")
        self.gate = nn.Linear(dim, experts, bias=False)
        self.topk = topk

    def forward(self, x_TD: torch.Tensor) -> Routing:
        tokens, experts = x_TD.shape[0], self.gate.out_features
        probs_TE = torch.softmax(self.gate(x_TD), dim=-1)
        weight_TK, expert_TK = probs_TE.topk(self.topk, dim=-1)
        # Priority order choice-major (all first choices, then all second choices), GShard's rule.
        expert_A = expert_TK.t().reshape(-1)
        token_A = torch.arange(tokens, device=x_TD.device).repeat(self.topk)
        weight_A = weight_TK.t().reshape(-1)
        routed_E = torch.bincount(expert_A, minlength=experts)
        fraction_E = routed_E.to(probs_TE.dtype) / expert_A.numel()
        aux = experts * (fraction_E * probs_TE.mean(0)).sum()
        return Routing(token_A, expert_A, weight_A, routed_E.tolist(), [0] * experts, None, aux)
