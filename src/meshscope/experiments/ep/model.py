"""The seeded MoE problem of the ``ep_*`` experiments and its unsharded reference training.

Everything here is a pure function of the config and its RNG seed, so the ranks, the single-process
reference and the predictor all derive the same tokens, weights and routing from it (the predictor
recomputes the routing on the CPU: predicting the trace from the model's shapes, docs/chapter.md Q27,
needs the router's counts, and a learned router's counts follow from its weights and tokens). The
reference is the chapter's EP result rebuilt from the two real expert weights (docs/chapter.md, Q23),
extended to gradients and to weights after SGD.

Legend: T tokens per source, D model dim, E experts.
"""

from __future__ import annotations

import torch

from ...core.mesh import Layout
from ...models.data_parallel import sgd_step
from ...models.moe.layer import dense_reference
from ...models.moe.router import (
    LearnedRouter,
    Routing,
    apply_capacity,
    apportion,
    capacity_of,
    fixed_routing,
    parse_skew,
)
from .config import EPConfig

_DATA, _EXPERT, _GATE, _ROUTE = range(4)  # RNG seed streams: tokens, experts, gate, routing

def _generator(cfg: EPConfig, *keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash((cfg.seed, *keys)))  # int tuples hash the same in every process


def source_tokens(cfg: EPConfig, step: int, rank: int) -> torch.Tensor:
    """x_TD of a source rank at a step (the upstream activation)."""
    return torch.randn(cfg.batch, cfg.hidden, generator=_generator(cfg, _DATA, step, rank))


def initial_weights(cfg: EPConfig) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Full expert weights w_DD (one per expert) and the gate weight g_ED (learned routing only)."""
    scale = cfg.hidden ** -0.5
    experts = [torch.randn(cfg.hidden, cfg.hidden, generator=_generator(cfg, _EXPERT, e)) * scale
               for e in range(cfg.experts)]
    gate = None
    if cfg.routing == "learned":
        gate = torch.randn(cfg.experts, cfg.hidden, generator=_generator(cfg, _GATE)) * scale
    return experts, gate


def make_router(cfg: EPConfig, gate_ED: torch.Tensor | None, device="cpu") -> LearnedRouter | None:
    if gate_ED is None:
        return None
    router = LearnedRouter(cfg.hidden, cfg.experts, cfg.topk).to(device)
    with torch.no_grad():
        router.gate.weight.copy_(gate_ED)
    return router


def fixed_counts(cfg: EPConfig) -> list[int]:
    """Tokens per expert of the deterministic router: 1:1 or the skew ratio, of `batch` tokens."""
    weights = parse_skew(cfg.skew, cfg.experts) if cfg.routing == "skewed" else [1] * cfg.experts
    return apportion(cfg.batch, weights)


def capacity(cfg: EPConfig) -> int | None:
    return capacity_of(cfg.capacity_factor, cfg.batch, cfg.topk, cfg.experts)


def route(cfg: EPConfig, step: int, rank: int, x_TD: torch.Tensor, router: LearnedRouter | None) -> Routing:
    """One source's routing, capacity applied; the same function serves run, reference and predictor."""
    if router is None:
        routing = fixed_routing(fixed_counts(cfg), _generator(cfg, _ROUTE, step, rank)).to(x_TD.device)
    else:
        routing = router(x_TD)
    return apply_capacity(routing, capacity(cfg))


def static_rows(cfg: EPConfig) -> list[int] | None:
    """Rows every source sends each expert when known without looking at tokens; None if they are not."""
    cap = capacity(cfg)
    if cfg.pad:
        return [cap] * cfg.experts
    if cfg.routing != "learned":
        return [c if cap is None else min(c, cap) for c in fixed_counts(cfg)]
    return None


def step_loss(cfg: EPConfig, out_TD: torch.Tensor, routing: Routing) -> torch.Tensor:
    """The chapter's loss, mean(out^2), plus the weighted Switch aux loss when a gate routes."""
    loss = out_TD.square().mean()
    return loss if routing.aux_loss is None else loss + cfg.aux_coef * routing.aux_loss


def reference_training(cfg: EPConfig, layout: Layout, rank: int) -> dict:
    """The unsharded single-process run: every source's tokens through the full weights, cfg.steps SGD steps.

    Every gradient is that of the mean loss over all source ranks: the sum over the world's losses
    divided by the number of sources (ep * edp ranks feed the experts; dp ranks hold the gate, and
    both products are the world when etp and pp are 1). Returns `rank`'s step-0 output and x.grad,
    the step-0 gradients and the final weights, by parameter name.
    """
    experts_w, gate_w = initial_weights(cfg)
    params = {f"expert{e}.weight": w.clone().requires_grad_() for e, w in enumerate(experts_w)}
    router = make_router(cfg, gate_w)
    if router is not None:
        params["gate.weight"] = router.gate.weight
    weights = [params[f"expert{e}.weight"] for e in range(cfg.experts)]
    out = {}
    for step in range(cfg.steps):
        total = 0.0
        for r in range(cfg.world):
            x_TD = source_tokens(cfg, step, r).requires_grad_(cfg.input_grad)
            routing = route(cfg, step, r, x_TD, router)
            y_TD = dense_reference(x_TD, routing, weights)
            total = total + step_loss(cfg, y_TD, routing)
            if step == 0 and r == rank:
                out["output"], x_mine = y_TD.detach(), x_TD
        total.backward()
        for name, p in params.items():
            p.grad /= layout.dp if name == "gate.weight" else layout.edp * layout.ep
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in params.items()}
            out["x_grad"] = x_mine.grad
        sgd_step(params.values(), cfg.lr)
    out["weights"] = {n: p.detach().clone() for n, p in params.items()}
    return out
