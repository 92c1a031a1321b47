"""The expert-parallel MoE layer: route -> dispatch -> local experts -> combine, and its dense reference.

The chapter's MoE data flow (docs/chapter.md, Q19): expert compute, the owner rank runs its local expert; each
expert is ``F.gelu(F.linear(received, expert_weight))`` with a [D, D] weight (Linear 512x512 + GELU). With more
experts than EP ranks each rank owns L consecutive experts and runs one GEMM per local expert over the rows
every source sent it ("per expert GEMM duration" is one of the chapter's production records). `dense_reference`
computes the same layer in one process from the full expert weights and the same routing, with no communication:
the chapter's EP reference rebuilt from the two real expert weights (docs/chapter.md, Q23).

Legend: T tokens per source, D model dim, R rows received, S source ranks (= EP group size),
L local experts, E experts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...capture.recorder import region
from ...core.groups import AxisGroup
from . import dispatch as dsp
from .router import Routing


class Expert(nn.Module):
    """One expert: Linear D x D (no bias, weight [out, in] as F.linear) followed by GELU."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim, bias=False)

    def forward(self, x_ND: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x_ND))


def _timed(on: bool, fn, *args):
    """(fn(*args), seconds), synchronising a GPU around it so the time is the kernel's, not the launch's;
    (fn(*args), 0.0) with no synchronise when `on` is False (a timed or graph-captured step)."""
    if not on:
        return fn(*args), 0.0
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(*args)
    if cuda:
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


@dataclass
class StepRecord:
    """What one MoE forward moved and spent on this rank (the chapter's production list)."""

    input_splits: list[int]
    """Dispatch rows sent to each EP rank (combine: rows received back)."""
    output_splits: list[int]
    """Dispatch rows received from each EP rank (combine: rows sent back)."""
    rows_per_local_expert: list[int]
    """Rows each local expert computed on (padding included)."""
    gemm_s: list[float] = field(default_factory=list)
    """Forward compute time per local expert."""
    all_to_all_s: float = 0.0
    """Forward all-to-all time on this rank (counts exchange, dispatch, combine)."""


class MoELayer(nn.Module):
    """This rank's L experts and the EP communication around them (one layer, no residual)."""

    def __init__(self, dim: int, experts: int, group: AxisGroup, ep_rank: int, expect_extra_row: bool = False):
        super().__init__()
        self.local = experts // group.size
        self.first = ep_rank * self.local
        self.group = group
        self.expect_extra_row = expect_extra_row
        """Fault knob (FAULT INJECTION): expect one row more from EP source 0 for the first local expert
        than it sends, the buffer sized to match (a common mistake the chapter names: input and output splits
        that disagree; docs/chapter.md, Q21)."""
        self.experts = nn.ModuleList(Expert(dim) for _ in range(self.local))
        self.record_durations = True
        """Time each GEMM and all-to-all (the chapter's production records) by synchronising around it.
        Off in the step that `suite` times: those synchronisations are the record's, not the step's."""

    def named_expert_weights(self):
        """(name, weight) with global expert ids, the order the edp gradient sync uses."""
        return [(f"expert{self.first + l}.weight", e.linear.weight) for l, e in enumerate(self.experts)]

    def forward(self, x_TD: torch.Tensor, routing: Routing, pad_to: int | None,
                counts_SL: torch.Tensor | None, packing: dsp.Packing | None = None) -> tuple[torch.Tensor, StepRecord]:
        """x_TD -> out_TD. counts_SL: rows each source sends each local expert, when known statically
        (a CPU tensor reads its splits without a device synchronise); None makes the ranks exchange
        them first (learned routing without padding). `packing`: this routing's `pack_plan`, when the
        caller reuses one routing for every step (it is computed here otherwise)."""
        if packing is None:
            packing = dsp.pack_plan(routing.expert_A, self.local * self.group.size, pad_to)
        counts_s, timed = 0.0, self.record_durations
        if counts_SL is None:
            with region("moe.counts"):
                counts_SL, counts_s = _timed(timed, dsp.exchange_counts, packing.rows_E, self.group, x_TD.device)
        if self.expect_extra_row:
            counts_SL = counts_SL.clone()  # the static counts are shared across steps
            counts_SL[0, 0] += 1
        with region("moe.dispatch"):
            received_RD, dispatch_s = _timed(timed, dsp.dispatch, x_TD, routing, packing, counts_SL, self.group)
        y_RD, gemm_s = self._compute(received_RD, counts_SL)
        with region("moe.combine"):
            returned_PD, combine_s = _timed(timed, dsp.combine, y_RD, packing, counts_SL, self.group)
        record = StepRecord(packing.input_splits(self.group.size), counts_SL.sum(1).tolist(),
                            counts_SL.sum(0).tolist(), gemm_s, counts_s + dispatch_s + combine_s)
        return dsp.unpack(returned_PD, routing, packing, x_TD.shape[0]), record

    def _compute(self, received_RD: torch.Tensor, counts_SL: torch.Tensor):
        """One GEMM per local expert over its rows from every source; outputs back in received order."""
        sources, local = counts_SL.shape
        chunks = received_RD.split(counts_SL.flatten().tolist())  # source-major, local-expert-minor
        pieces, gemm_s = list(chunks), []
        for l, expert in enumerate(self.experts):
            mine = [chunks[s * local + l] for s in range(sources)]
            y_ND, sec = _timed(self.record_durations, expert, torch.cat(mine))
            gemm_s.append(sec)
            for s, y in enumerate(y_ND.split([c.shape[0] for c in mine])):
                pieces[s * local + l] = y
        return torch.cat(pieces), gemm_s


def dense_reference(x_TD: torch.Tensor, routing: Routing, weights_EDD) -> torch.Tensor:
    """The same layer in one process: every kept assignment through its expert's full weight."""
    out_TD = x_TD.new_zeros(x_TD.shape)
    for e, w_DD in enumerate(weights_EDD):
        mine = routing.expert_A == e
        y_ND = F.gelu(F.linear(x_TD[routing.token_A[mine]], w_DD))
        if routing.weight_A is not None:
            y_ND = y_ND * routing.weight_A[mine][:, None]
        out_TD = out_TD.index_add(0, routing.token_A[mine], y_ND)
    return out_TD
