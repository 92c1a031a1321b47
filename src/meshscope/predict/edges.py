"""The one predictor mechanism: a stage's edges walked through its schedule (chapter steps 1-5).

A model is described, for prediction, by the places where a tensor changes layout, in forward order:

  PlacementEdge  a placement change over a group (tp): the collective of `placement.collective`
                 forward; backward, the gradient's placement change (`grad_placement`), pruned when
                 the tensor needs no gradient;
  AllToAllEdge   token order <-> expert order over the ep group: an all_to_all forward with the
                 router's splits, its dual backward with the splits swapped, pruned likewise;

and the P2P of a pipeline is the schedule's `Exchange` items. `walk` runs one rank's program: each
forward pass emits its edges in order, each backward pass in reverse, each exchange its sends and
receives with the peer stage; a step without a pipeline is `WHOLE_BATCH` (one forward, one backward).
Step 6, the orthogonal gradient sync, is `models.data_parallel.predict_grad_sync`, twin of the sync
the ranks run. TP, PP, EP and the N-D composition all predict this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .ledger import Ledger
from .placement import SUMMED, collective, grad_placement, local_numel


@dataclass(frozen=True)
class PlacementEdge:
    """A point where an activation changes placement over the `axis` group (step 1).

    The forward collective turns `src` into `dst`; the backward one turns the gradient of `dst` into
    the gradient `src` needs. `grad_in` overrides the incoming gradient's placement where the consuming
    layer fixes it (a column-parallel layer hands back a partial sum of its input's gradient).
    """

    region: str
    shape: tuple[int, int]
    """Global shape of the tensor [rows, cols]."""
    src: object
    dst: object
    needs_grad: bool
    """False where autograd prunes the backward edge (the input needs no gradient)."""
    grad_in: object | None = None
    axis: str = "tp"

    def forward(self, ledger: Ledger, rank: int, mb: int | None, semantics: str) -> None:
        op = collective(self.src, self.dst)
        if op:
            ledger.emit(rank, op, self.axis, "forward", region=self.region, microbatch=mb,
                        numel=local_numel(self.shape, self.src, ledger.layout.size(self.axis)))

    def backward(self, ledger: Ledger, rank: int, mb: int | None, semantics: str) -> None:
        if not self.needs_grad:
            return
        g_in = self.grad_in or grad_placement(self.dst, semantics)
        op = collective(g_in, grad_placement(self.src, semantics))
        if op:
            ledger.emit(rank, op, self.axis, "backward", region=self.region, microbatch=mb,
                        numel=local_numel(self.shape, g_in, ledger.layout.size(self.axis)))


@dataclass(frozen=True)
class AllToAllEdge:
    """Token order <-> expert order over the `axis` group; backward swaps the splits (the EP rule)."""

    region: str
    splits: Callable[[int, int | None], tuple[list[int], list[int]]]
    """(rank, microbatch) -> (input_splits, output_splits) of the forward all_to_all, in rows."""
    row_numel: int
    needs_grad: bool
    axis: str = "ep"
    dtype: str | None = None
    """The payload's dtype when it is not the ledger's (routing counts are int64)."""

    def forward(self, ledger: Ledger, rank: int, mb: int | None, semantics: str) -> None:
        send, recv = self.splits(rank, mb)
        ledger.emit(rank, "all_to_all", self.axis, "forward", region=self.region, microbatch=mb, input_splits=send,
                    output_splits=recv, row_numel=self.row_numel, dtype=self.dtype)

    def backward(self, ledger: Ledger, rank: int, mb: int | None, semantics: str) -> None:
        if self.needs_grad:
            send, recv = self.splits(rank, mb)
            ledger.emit(rank, "all_to_all", self.axis, "backward", region=self.region, microbatch=mb,
                        input_splits=recv, output_splits=send, row_numel=self.row_numel, dtype=self.dtype)


@dataclass(frozen=True)
class Pass:
    """A forward (``F``) or backward (``B``) pass over the stage's edges, of one microbatch or of the
    whole batch (microbatch None), as a pipeline schedule's compute actions are."""

    kind: str
    microbatch: int | None = None


WHOLE_BATCH = (Pass("F"), Pass("B"))
"""The program of a step without a pipeline: one forward, then its backward."""


def walk(ledger: Ledger, rank: int, edges, program: Iterable = WHOLE_BATCH, *, semantics: str = SUMMED,
         message_numel: Callable | None = None, stage_ranks: tuple[int, ...] = ()) -> None:
    """Emit one rank's collectives of one step: its `program`'s passes over `edges` and its exchanges.

    program: `Pass`-like items (``kind`` F or B, ``microbatch``) and, for a pipeline stage, the
    schedule's exchanges (items with ``messages`` and ``peer_stage``); message_numel(message) gives
    the elements of one message, stage_ranks the global rank of every stage of this rank's pipeline.
    """
    edges = list(edges)
    for item in program:
        if hasattr(item, "messages"):  # stage i <-> i +/- 1: the schedule's sends and receives, in order
            stage = stage_ranks.index(rank)
            for msg in item.messages:
                ledger.emit(rank, "send" if msg.sender == stage else "recv", "pp", msg.phase,
                            numel=message_numel(msg), region=msg.region, microbatch=msg.microbatch,
                            peer=stage_ranks[item.peer_stage])
        elif item.kind == "F":
            for edge in edges:
                edge.forward(ledger, rank, item.microbatch, semantics)
        else:
            for edge in reversed(edges):
                edge.backward(ledger, rank, item.microbatch, semantics)
