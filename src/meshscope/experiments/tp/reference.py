"""The unsharded reference of the TP MLP: full weights, each DP replica's batch, and one step of the
plain MLP with the DP-averaged gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import TPConfig


# -- the unsharded reference -------------------------------------------------------------------------
def init_weights(cfg: TPConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Full W1 [H, D] and W2 [D, H], identical on every rank (fixed RNG seed)."""
    g = torch.Generator().manual_seed(0)
    w1_HD = torch.randn(cfg.ffn, cfg.hidden, generator=g) / cfg.hidden ** 0.5
    w2_DH = torch.randn(cfg.hidden, cfg.ffn, generator=g) / cfg.ffn ** 0.5
    return w1_HD, w2_DH


def replica_batch(cfg: TPConfig, step: int, replica: int) -> torch.Tensor:
    """x_BD of DP replica `replica` at `step`; every rank can build every replica's batch."""
    g = torch.Generator().manual_seed(1 + step * cfg.dp + replica)
    return torch.randn(cfg.batch, cfg.hidden, generator=g)


def reference_step(w1_HD, w2_DH, xs_BD):
    """Unsharded MLP on each replica's batch with the plain loss: per replica (y_BD, dX_BD, dA_BH);
    weight gradients averaged over replicas, as the DP sync does."""
    w1, w2 = w1_HD.detach().requires_grad_(), w2_DH.detach().requires_grad_()
    per_replica, g1, g2 = [], 0, 0
    for x_BD in xs_BD:
        x = x_BD.detach().requires_grad_()
        a_BH = F.linear(x, w1)
        y_BD = F.linear(F.gelu(a_BH), w2)
        dx, da, d1, d2 = torch.autograd.grad(y_BD.square().mean(), [x, a_BH, w1, w2])
        per_replica.append((y_BD.detach(), dx, da))
        g1, g2 = g1 + d1 / len(xs_BD), g2 + d2 / len(xs_BD)
    return per_replica, (g1, g2)
