"""Data-parallel gradient sync: the orthogonal step 6 of the chapter's method (docs/chapter.md, Q27).

TP, PP and EP distribute the model's computation; DP must still sync the gradient of the parameters at the same
coordinate (docs/chapter.md, Q24): after backward, each parameter's gradient is averaged over the ranks that
hold the *same* shard (the dp group for dense shards, the edp group for experts), one all_reduce per parameter,
in parameter order, phase ``optimizer``. Never over ranks holding different shards (chapter Q2: DP over [0,1]
would add unrelated gradients).

`sync_grads` runs it; `predict_grad_sync` emits the same calls into a predicted `Ledger`, so the two
cannot drift apart.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..capture.recorder import phase, region
from ..core.groups import AxisGroup
from ..predict.ledger import Ledger


def sync_grads(named_params, group: AxisGroup, label: str = "dp.grad_sync") -> None:
    """Average each parameter's .grad over `group` (no-op on a one-rank group)."""
    if group.size == 1:
        return
    with phase("optimizer"):
        for name, p in named_params:
            with region(f"{label}:{name}"):
                dist.all_reduce(p.grad, group=group.pg)
            p.grad.div_(group.size)


def predict_grad_sync(ledger: Ledger, rank: int, axis: str, named_numels, label: str = "dp.grad_sync") -> None:
    """Predicted twin of `sync_grads`: one all_reduce per (name, numel), in order."""
    for name, numel in named_numels:
        ledger.emit(rank, "all_reduce", axis, "optimizer", numel=numel, region=f"{label}:{name}")


@torch.no_grad()
def sgd_step(params, lr: float) -> None:
    """Plain SGD, identical on the sharded model and the unsharded reference."""
    for p in params:
        p.add_(p.grad, alpha=-lr)
        p.grad = None
