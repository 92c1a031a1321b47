"""The predicted ledger: every rank's events in issue order, with ``seq`` assigned per rank and group
so that it can be diffed against a capture event by event."""

from __future__ import annotations

from ..core.events import DTYPE_BYTES, CommEvent, payload_bytes
from ..core.mesh import Layout


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
