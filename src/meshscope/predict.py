"""The predictor's shared machinery: the seed's six steps as reusable rules.

"从模型 Shape 预测 Trace 的方法": (1) annotate each tensor's layout, (2) op shapes, (3) map layout
changes to collectives, (4) multiply by dtype size (input vs output bytes), (5) walk the autograd graph
backwards applying the duals and pruning edges whose input needs no gradient, (6) add the orthogonal
DP gradient sync. Each parallel mode's predictor walks its own model symbolically with these rules;
none of them keeps a table of per-experiment constants.

`Ledger` assigns ``seq`` per rank and group (the order the ranks must issue them), so a mode emits
events in issue order and the ledger can be diffed against a capture.
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import DTYPE_BYTES, CommEvent, payload_bytes
from .mesh import Layout


@dataclass(frozen=True)
class Replicate:
    """Every rank of the group holds the full tensor."""


@dataclass(frozen=True)
class Shard:
    """Each rank holds the slab `dim` / G of the tensor."""

    dim: int


@dataclass(frozen=True)
class Partial:
    """Each rank holds a summand; the tensor is the sum over the group (pending reduction)."""


def transition(src, dst) -> str:
    """Step 3: the collective that turns layout `src` into `dst` (seed's table)."""
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return "all_reduce"
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return "reduce_scatter"
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return "all_gather"
    raise ValueError(f"no single collective turns {src} into {dst}")




class Ledger:
    """Predicted events of every rank, with seq assigned per (rank, group) in emission order."""

    def __init__(self, layout: Layout, dtype: str = "float32"):
        self.layout, self.dtype = layout, dtype
        self.elem = DTYPE_BYTES[dtype]
        self.events: list[CommEvent] = []
        self._seq: dict[tuple, int] = {}

    def group(self, axis: str, rank: int) -> tuple[str, tuple[int, ...]]:
        """(canonical axis name, member ranks) of `rank`'s group on `axis`."""
        return self.layout.canonical(axis), tuple(self.layout.group_of(axis, rank))

    def emit(self, rank: int, op: str, axis: str, phase: str, *, numel: int = 0, region: str = "",
             microbatch: int | None = None, input_splits=None, output_splits=None, row_numel: int = 0,
             peer: int | None = None, group: tuple[int, ...] | None = None,
             dtype: str | None = None) -> CommEvent | None:
        """Emit one event (steps 3-4). Collectives over a one-rank group are not issued: returns None.

        numel: elements of the input tensor (send/collectives) or of the received tensor (recv).
        all_to_all: give input_splits/output_splits in rows and row_numel elements per row.
        group: explicit member ranks (P2P pairs); otherwise `rank`'s group on `axis`.
        dtype: this event's dtype when it differs from the ledger's (e.g. int64 routing counts).
        """
        dtype = dtype or self.dtype
        elem = DTYPE_BYTES[dtype]
        name, ranks = (self.layout.canonical(axis), tuple(group)) if group is not None else self.group(axis, rank)
        if len(ranks) < 2 and op not in ("send", "recv"):
            return None
        if op == "all_to_all":
            b_in, b_out = sum(input_splits) * row_numel * elem, sum(output_splits) * row_numel * elem
        else:
            b_in, b_out = payload_bytes(op, numel, len(ranks), elem)
        key = (rank, name, ranks)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        event = CommEvent(rank, seq, op, name, ranks, phase, dtype, b_in, b_out, region, microbatch,
                          tuple(input_splits) if input_splits is not None else None,
                          tuple(output_splits) if output_splits is not None else None, peer)
        self.events.append(event)
        return event
