"""MoE dispatch and combine: token order <-> expert order through AllToAllV.

The chapter's MoE data flow (docs/chapter.md, Q19): Dispatch packs tokens by destination expert and
all-to-alls them; Combine all-to-alls the expert outputs back to their source and restores the token order.
Variable splits are the router's load: the router's counts are the split arrays (skewed 7:1: input_splits
[56, 8], expert rank 0 receives [56, 56]; docs/chapter.md, Q20). The combine uses the dispatch's splits
swapped, and so does each backward (chapter Q21: how an all-to-all's backward swaps the splits) -
`collectives.AllToAllV` does that; nothing here writes another all-to-all.

Placement: expert e lives on EP rank e // L (L local experts per rank), so sorting assignments by
expert id also sorts them by destination rank, and a destination's block holds its L experts in order.

Padding (GShard/Switch fixed-size buffers, the chapter's "capacity buffer"): with ``pad_to`` every expert
gets exactly that many rows from every source, zeros where no token fills them. The splits are then
known statically; without padding the receiver learns them by an all-to-all of the counts first.

Legend: T tokens on this source, D model dim, A kept assignments, P rows of the packed send buffer,
R rows received, E experts, G = ep group size, L = E / G local experts, S = G source ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.groups import AxisGroup
from ..collectives import AllToAllV
from .router import Routing


@dataclass(frozen=True)
class Packing:
    """Where each kept assignment sits in the packed send buffer."""

    slot_A: torch.Tensor
    """Row of each assignment in the buffer (long)."""
    rows_E: tuple[int, ...]
    """Rows per expert in the buffer: its kept assignments, or `pad_to` when padded."""

    def input_splits(self, ep: int) -> list[int]:
        """Rows sent to each EP rank: the sum over its L consecutive experts."""
        return destination_splits(self.rows_E, ep)


def destination_splits(rows_E, ep: int) -> list[int]:
    """Per-expert rows -> per-destination-rank rows (experts placed in contiguous blocks of L)."""
    local = len(rows_E) // ep
    return [sum(rows_E[j * local:(j + 1) * local]) for j in range(ep)]


def pack_plan(expert_A: torch.Tensor, experts: int, pad_to: int | None = None) -> Packing:
    """Stable sort by expert: assignments of one expert keep their priority (token) order."""
    kept_E = torch.bincount(expert_A, minlength=experts)
    order = torch.argsort(expert_A, stable=True)
    expert_sorted = expert_A[order]
    first_of_E = torch.cumsum(kept_E, 0) - kept_E  # index of each expert's first sorted assignment
    position = torch.arange(expert_A.numel(), device=expert_A.device) - first_of_E[expert_sorted]
    rows_E = kept_E if pad_to is None else torch.full_like(kept_E, pad_to)
    start_E = torch.cumsum(rows_E, 0) - rows_E
    slot_A = torch.empty_like(expert_A)
    slot_A[order] = start_E[expert_sorted] + position
    return Packing(slot_A, tuple(rows_E.tolist()))


def exchange_counts(rows_E, group: AxisGroup, device) -> torch.Tensor:
    """All-to-all of the per-expert row counts, so that each rank learns what it will receive.

    Sends row j (this source's counts for rank j's L experts) to rank j: splits [1] * G, int64.
    Returns counts_SL: row s = what source s sends to each of this rank's L experts.
    """
    counts_GL = torch.tensor(rows_E, dtype=torch.int64, device=device).view(group.size, -1)
    ones = [1] * group.size
    return AllToAllV.apply(counts_GL, group, ones, ones)


def dispatch(x_TD: torch.Tensor, routing: Routing, packing: Packing, counts_SL: torch.Tensor,
             group: AxisGroup) -> torch.Tensor:
    """Pack by destination and all-to-all: x_TD -> received_RD (rows grouped by source, then expert).

    The packed buffer is built from x_TD differentiably, so the reverse dispatch runs in backward
    exactly when x_TD requires grad (chapter Q22: why the first MoE had only 3 A2A kernels).
    """
    rows = sum(packing.rows_E)
    packed_PD = x_TD.new_zeros(rows, x_TD.shape[1]).index_copy(0, packing.slot_A, x_TD[routing.token_A])
    output_splits = counts_SL.sum(1).tolist()
    return AllToAllV.apply(packed_PD, group, packing.input_splits(group.size), output_splits)


def combine(y_RD: torch.Tensor, packing: Packing, counts_SL: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    """Expert outputs back to their sources: the dispatch's splits swapped. y_RD -> returned_PD."""
    return AllToAllV.apply(y_RD, group, counts_SL.sum(1).tolist(), packing.input_splits(group.size))


def unpack(returned_PD: torch.Tensor, routing: Routing, packing: Packing, tokens: int) -> torch.Tensor:
    """Restore token order: each token sums its kept assignments' outputs, times the gate weight.

    Padding rows are never read; a dropped assignment adds nothing (Switch: the token passes on
    through the residual, which this single layer does not model).
    """
    y_AD = returned_PD[packing.slot_A]
    if routing.weight_A is not None:
        y_AD = y_AD * routing.weight_A[:, None]
    return returned_PD.new_zeros(tokens, returned_PD.shape[1]).index_add(0, routing.token_A, y_AD)
