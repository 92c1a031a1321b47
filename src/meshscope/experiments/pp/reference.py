"""The unsharded reference of the pipeline: every stage's full weight, every replica's batch, and one
step of the whole chain on one rank."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...models.pipeline.stage import stage_forward
from .config import PPConfig, widths


def init_weights(cfg: PPConfig) -> list[torch.Tensor]:
    """Full W_s [d_{s+1}, d_s] of every stage, identical on every rank (fixed RNG seed)."""
    g, d = torch.Generator().manual_seed(0), widths(cfg)
    return [torch.randn(d[s + 1], d[s], generator=g) / d[s] ** 0.5 for s in range(cfg.pp)]


def replica_batch(cfg: PPConfig, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_ND, target_NO) of pipeline replica `replica` at `step`; every rank can build every replica's."""
    g = torch.Generator().manual_seed(1 + step * cfg.dp + replica)
    return torch.randn(cfg.batch, cfg.hidden, generator=g), torch.randn(cfg.batch, widths(cfg)[-1], generator=g)


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
