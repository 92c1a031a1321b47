"""The MoE step's predicted ledger: the layer's all-to-all edges walked by `predict.edges.walk`,
then the expert sync in edp and the gate sync in dp (step 6).

The splits come from the router itself, run symbolically on every source's step-0 tokens (the
routing is what the chapter's "how an unbalanced router becomes splits" question is about): each
source sends the rows routed to every EP member and receives what every member routed to it.
Forward, the dispatch takes token order to expert order and the combine takes it back; backward,
each one's dual runs with the splits swapped, newest first, and the dispatch's exists only when the
tokens need a gradient (the chapter's "why only 3 SendRecv"). Learned routing first exchanges the
per-expert counts (int64), which needs no gradient.
"""

from __future__ import annotations

import torch

from ...core.events import CommEvent
from ...models.data_parallel import predict_grad_sync
from ...models.moe.dispatch import destination_splits, pack_plan
from ...predict.edges import AllToAllEdge, walk
from ...predict.ledger import Ledger
from .config import EPConfig
from .model import capacity, initial_weights, make_router, route, source_tokens, static_rows


def predict_step(cfg: EPConfig) -> list[CommEvent]:
    layout, ledger = cfg.layout, Ledger(cfg.layout)
    _, gate = initial_weights(cfg)
    router = make_router(cfg, gate)
    pad_to = capacity(cfg) if cfg.pad else None
    with torch.no_grad():
        rows = {r: pack_plan(route(cfg, 0, r, source_tokens(cfg, 0, r), router).expert_A, cfg.experts, pad_to).rows_E
                for r in range(cfg.world)}

    def dispatch(rank: int, mb) -> tuple[list[int], list[int]]:
        members = layout.group_of("ep", rank)
        return (destination_splits(rows[rank], len(members)),
                [destination_splits(rows[s], len(members))[members.index(rank)] for s in members])

    local = cfg.experts // cfg.ep
    edges = [AllToAllEdge("moe.dispatch", dispatch, cfg.hidden, needs_grad=cfg.input_grad),
             AllToAllEdge("moe.combine", lambda r, mb: dispatch(r, mb)[::-1], cfg.hidden, needs_grad=True)]
    if static_rows(cfg) is None:  # the routed counts are exchanged before the tokens
        ones = [1] * cfg.ep
        edges.insert(0, AllToAllEdge("moe.counts", lambda r, mb: (ones, ones), local, needs_grad=False, dtype="int64"))
    for r in range(cfg.world):
        walk(ledger, r, edges)
        first = layout.group_of("ep", r).index(r) * local
        predict_grad_sync(ledger, r, "edp", [(f"expert{first + e}.weight", cfg.hidden ** 2) for e in range(local)],
                          label="edp.grad_sync")
        if gate is not None:
            predict_grad_sync(ledger, r, "dp", [("gate.weight", gate.numel())], label="dp.grad_sync")
    return ledger.events
