"""The seeded problem of ``nd_mlp``: weights, batches, routing, one rank's stage, and the unsharded reference.

Model: a chain of pp stages, each the chapter's TP MLP block Y = GELU(X W1^T) W2^T over the stage's TP
group; with ``--moe`` the last stage is instead the EP experiment's MoE layer (E experts, each Linear
D x D + GELU, deterministic top-1 routing), its experts spread over the expert groups of the mesh. The
loss is the MSE of the last stage's output against a target, averaged over microbatches and DP replicas.

Everything here is a pure function of the config and the RNG seeds, so ranks, predictor and reference derive the
same tensors and routing (predicting the trace from the model's shapes, docs/chapter.md Q27). The reference runs
the whole chain in one process on every replica's batch, microbatch by microbatch (routing is per microbatch).

Legend: N batch rows of a replica, b microbatch rows, D --hidden, H --ffn, E experts, T tp size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...models.moe.dispatch import pack_plan
from ...models.moe.layer import MoELayer, dense_reference
from ...models.moe.router import Routing, apportion, fixed_routing, parse_skew
from ...models.nd_stage import gather, scatter
from ...models.tp_mlp import TensorParallelMLP
from ...predict.placement import SUMMED
from .config import NDConfig

_DATA, _DENSE, _EXPERT, _ROUTE = range(4)  # RNG seed streams


def _generator(*keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash(keys))  # int tuples hash the same in every process


@dataclass(frozen=True)
class Weights:
    """The full (unsharded) weights, identical on every rank."""

    dense: list[tuple[torch.Tensor, torch.Tensor]]
    """(w1_HD, w2_DH) of each dense stage, stage order."""
    experts: list[torch.Tensor]
    """w_DD of each expert (empty without --moe)."""

    def named(self, cfg: NDConfig) -> dict[str, torch.Tensor]:
        """Full weights by the parameter names the ranks sync and compare."""
        out = {}
        for s, (w1, w2) in enumerate(self.dense):
            out[f"stage{s}.fc1.weight"], out[f"stage{s}.fc2.weight"] = w1, w2
        out.update({f"expert{e}.weight": w for e, w in enumerate(self.experts)})
        return out

    def sgd(self, cfg: NDConfig, grads: dict[str, torch.Tensor], lr: float) -> "Weights":
        """The weights after one plain SGD step with full gradients by name (the reference's update)."""
        new = {n: w - lr * grads[n] for n, w in self.named(cfg).items()}
        return Weights([(new[f"stage{s}.fc1.weight"], new[f"stage{s}.fc2.weight"]) for s in range(len(self.dense))],
                       [new[f"expert{e}.weight"] for e in range(len(self.experts))])


def init_weights(cfg: NDConfig) -> Weights:
    dense_stages = cfg.pp - 1 if cfg.moe else cfg.pp
    g = _generator(_DENSE)
    dense = [(torch.randn(cfg.ffn, cfg.hidden, generator=g) / cfg.hidden ** 0.5,
              torch.randn(cfg.hidden, cfg.ffn, generator=g) / cfg.ffn ** 0.5) for _ in range(dense_stages)]
    experts = [torch.randn(cfg.hidden, cfg.hidden, generator=_generator(_EXPERT, e)) / cfg.hidden ** 0.5
               for e in range(cfg.experts if cfg.moe else 0)]
    return Weights(dense, experts)


def replica_batch(cfg: NDConfig, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_ND, target_ND) of DP replica `replica` at `step`; every rank can build every replica's."""
    g = _generator(_DATA, step, replica)
    return torch.randn(cfg.batch, cfg.hidden, generator=g), torch.randn(cfg.batch, cfg.hidden, generator=g)


def expert_counts(cfg: NDConfig) -> list[int]:
    """Tokens per expert of one microbatch: 1:1 (balanced) or the --skew ratio (skewed)."""
    weights = parse_skew(cfg.skew, cfg.experts) if cfg.routing == "skewed" else [1] * cfg.experts
    return apportion(cfg.batch // cfg.microbatches, weights)


def route(cfg: NDConfig, step: int, replica: int, microbatch: int) -> Routing:
    """The EP experiment's deterministic top-1 routing of one replica's microbatch. The tp copies of a
    replica hold the same tokens and must route them alike: the RNG seed depends on the replica only."""
    return fixed_routing(expert_counts(cfg), _generator(_ROUTE, step, replica, microbatch))


def rows_per_expert(cfg: NDConfig, step: int, replica: int, microbatch: int) -> tuple[int, ...]:
    """Dispatch rows per expert, packed as the layer packs them (the predictor's split source)."""
    return pack_plan(route(cfg, step, replica, microbatch).expert_A, cfg.experts).rows_E


def loss_scale(cfg: NDConfig) -> float:
    """Weight of one TP rank's copy of the loss: 1/T under summed-loss, whose backward adds the T copies
    (see `models.tp_mlp`), 1 under replicated-loss; and 1/M, so the microbatches average."""
    return 1 / cfg.microbatches / (cfg.tp if cfg.semantics == SUMMED else 1)


def expert_grad_scale(cfg: NDConfig) -> float:
    """Factor on each local expert gradient before its edp average, so that it equals the gradient of
    the loss averaged over the dp replicas, as the dense shards' dp average does.

    An expert's local gradient sums its ep sources (ep replicas) with each TP copy weighting its loss
    by c (1/T summed-loss, 1 replicated-loss); its edp group holds the T TP copies of each of the
    dp/ep ep groups, so the edp average is T*c/edp * (sum over all dp replicas). The mean wants 1/dp:
    factor edp/(dp*T*c) = 1/(ep*c), since edp = T*dp/ep with etp 1.
    """
    return (cfg.tp if cfg.semantics == SUMMED else 1) / cfg.ep


class StageModel(nn.Module):
    """This rank's pipeline stage: the TP MLP block or, on the last stage with --moe, the MoE layer,
    with the boundary gather (receiver) and scatter (sender) when --pp-scatter-gather is on."""

    def __init__(self, cfg: NDConfig, weights: Weights, mesh, rank: int):
        super().__init__()
        self.cfg, self.rank, self.tp, self.dp, self.edp = cfg, rank, mesh["tp"], mesh["dp"], mesh["edp"]
        self.stage, self.replica = mesh["pp"].local_rank(rank), self.dp.local_rank(rank)
        self.last = self.stage == cfg.pp - 1
        self.receive = cfg.pp_scatter_gather and self.stage > 0
        self.send = cfg.pp_scatter_gather and not self.last
        self.mlp = self.moe = None
        if cfg.moe and self.last:
            ep = mesh["ep"]
            self.moe = MoELayer(cfg.hidden, cfg.experts, ep, ep.local_rank(rank))
            full = weights.named(cfg)
            with torch.no_grad():
                for name, w in self.moe.named_expert_weights():
                    w.copy_(full[name])
            # The deterministic router gives every source the same counts, so the splits are static and
            # no counts all_to_all precedes the dispatch (the EP experiment's `static_rows`).
            mine = expert_counts(cfg)[self.moe.first:self.moe.first + self.moe.local]
            self.counts_SL = torch.tensor([mine] * ep.size)  # on the CPU: the host reads the splits
        else:
            self.mlp = TensorParallelMLP(*weights.dense[self.stage], self.tp, rank, cfg.semantics, False)

    def forward(self, x_bD: torch.Tensor, routing: Routing | None) -> torch.Tensor:
        """Stage input (a boundary slab when receiving scattered) -> replicated stage output y_bD."""
        if self.receive:
            x_bD = gather(x_bD, self.tp, self.cfg.semantics)
        if self.mlp is not None:
            return self.mlp(x_bD)
        y_bD, _ = self.moe(x_bD, routing.to(x_bD.device), None, self.counts_SL)
        return y_bD

    def outgoing(self, y_bD: torch.Tensor) -> torch.Tensor:
        """What this stage sends downstream: y_bD, or its slab under scatter/gather."""
        return scatter(y_bD, self.tp, self.rank, self.cfg.semantics) if self.send else y_bD

    def named_dense(self) -> list[tuple[str, torch.Tensor]]:
        """TP shards, synced in the dp group."""
        return [] if self.mlp is None else [(f"stage{self.stage}.{n}", p) for n, p in self.mlp.named_parameters()]

    def named_experts(self) -> list[tuple[str, torch.Tensor]]:
        """Local experts, synced in the edp group."""
        return [] if self.moe is None else self.moe.named_expert_weights()

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full weight (column-parallel fc1 on dim 0, row-parallel fc2 on dim 1)."""
        if name.startswith("expert"):
            return full
        dim = 0 if name.endswith("fc1.weight") else 1
        return full.chunk(self.tp.size, dim=dim)[self.tp.local_rank(self.rank)]


def reference_step(cfg: NDConfig, weights: Weights, batches, step: int):
    """The unsharded chain on every replica: (outputs[replica][stage] as [N, D], gradients by name).

    Loss: mean over replicas of the mean over microbatches of the MSE, so the gradients are what the
    dp (dense) and scaled edp (experts) averages must produce.
    """
    named = {n: w.detach().clone().requires_grad_() for n, w in weights.named(cfg).items()}
    experts = [named[f"expert{e}.weight"] for e in range(len(weights.experts))]
    outs, total = [], 0.0
    for replica, (x_ND, t_ND) in enumerate(batches):
        per_stage = [[] for _ in range(cfg.pp)]
        for i, (h, t_bD) in enumerate(zip(x_ND.chunk(cfg.microbatches), t_ND.chunk(cfg.microbatches))):
            for s in range(cfg.pp):
                if cfg.moe and s == cfg.pp - 1:
                    h = dense_reference(h, route(cfg, step, replica, i), experts)
                else:
                    h = F.linear(F.gelu(F.linear(h, named[f"stage{s}.fc1.weight"])), named[f"stage{s}.fc2.weight"])
                per_stage[s].append(h.detach())
            total = total + F.mse_loss(h, t_bD) / cfg.microbatches / len(batches)
        outs.append([torch.cat(p) for p in per_stage])
    grads = dict(zip(named, torch.autograd.grad(total, list(named.values()))))
    return outs, grads
