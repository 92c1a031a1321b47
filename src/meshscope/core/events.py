"""CommEvent: the one record type shared by the predictor and the capture, and the ledger diff.

Payload is always *logical* bytes: ``bytes_in`` is what the caller hands to the collective and ``bytes_out``
what it gets back on this rank. Chapter Q27, step 4 (multiply by the dtype size, keeping input and output
bytes apart) insists these are neither the same figure (an all-gather takes 128 KiB in and gives 256 KiB
out) nor wire bytes on NVLink or the NIC.

Ordering: NCCL and gloo order collectives per communicator, so a ledger is compared per rank and per
group, event by event, in issue order (``seq`` counts per rank and group). Order across different
groups is not part of the contract.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, fields
from enum import Enum

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "broadcast", "barrier", "reduce",
       "gather", "scatter")
"""Every op name a ledger uses. The ``*_object`` calls and ``monitored_barrier`` are recorded as the
ops torch issues for them (an object all-gather is an all_gather of sizes, then of the bytes)."""

P2P = ("send", "recv")
"""Point-to-point ops: paired between two ranks, not agreed on by a group."""

ROOTED = ("broadcast", "reduce", "gather", "scatter")
"""Ops with a root (``CommEvent.peer`` holds it)."""

WORLD = "world"
"""The axis label of the default group."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1, "uint8": 1}


@dataclass(frozen=True, slots=True)
class CommEvent:
    """One collective or point-to-point call, as issued by one rank."""

    rank: int
    """Global rank that issued the call."""
    seq: int
    """Position of this call among this rank's calls on the same group (0-based)."""
    op: str
    """One of `OPS`."""
    axis: str
    """Mesh axis name of the group (``tp``, ``dp``, ``ep``...; ``world`` for the default group)."""
    group: tuple[int, ...]
    """Global ranks of the group, ascending."""
    phase: str
    """``forward`` (inside a module's forward), ``backward`` (inside the autograd engine),
    ``optimizer`` (inside ``optimizer.step``) or, for traced jobs, ``other``."""
    dtype: str
    bytes_in: int
    """Logical input bytes on this rank."""
    bytes_out: int
    """Logical output bytes on this rank."""
    region: str = ""
    """User label of the code region (layer name), empty if none."""
    microbatch: int | None = None
    input_splits: tuple[int, ...] | None = None
    """all_to_all: rows sent to each group member, in group order."""
    output_splits: tuple[int, ...] | None = None
    """all_to_all: rows received from each group member, in group order."""
    peer: int | None = None
    """send/recv: the global rank on the other end; broadcast, reduce, gather, scatter: the root."""
    step: int | None = None
    """Traced jobs: the training step (step k: after the k-th ``optimizer.step()`` returned)."""
    t_issue: float | None = None
    """Traced jobs: when the call was issued, seconds since the trace started on this rank."""
    t_done: float | None = None
    """Traced jobs: when it was known to have completed (the next call on its group, or its step's end)."""
    assumed: tuple[str, ...] = ()
    """Fields whose value this rank could not know, filled in by something else: in a fake world, what an
    all-to-all receives (``output_splits``, ``bytes_out``: what peers would send, which the fake backend
    fills in with this rank's own input) and uneven input splits (computed from such counts), as
    `trace.fake.backend.assumed` decides; and the ``bytes_in``, ``bytes_out`` of an object collective's call
    sized from a stand-in for objects of ranks it had not traced (`trace.fake.objects`). Empty for a real run.
    Comparisons leave these fields out (`compared`)."""
    t_complete: float | None = None
    """Traced jobs: when this rank saw its work complete (its Work's future finished), on the clock of
    `t_issue`; None where the recorder could not see it (a fake world, gloo's send and recv). On NCCL the
    future completes once the work is enqueued, its CUDA events standing for the GPU."""
    gpu_ms: float | None = None
    """Traced jobs on NCCL: the call's time on the GPU, from torch's Flight Recorder entry of it with
    ``TORCH_NCCL_ENABLE_TIMING=1`` (its start and end CUDA events; `trace.fr_dump.gpu_durations`)."""
    t_gpu: float | None = None
    """Traced jobs on a GPU: when the issuing stream reached the call on the GPU (a CUDA event recorded
    before the op ran, placed on the clock of `t_issue` through a reference event; capture/native_recorder.cpp
    says how). Later than `t_issue` by what the GPU still had queued: a slow kernel shows here, not there."""

    def to_json(self) -> dict:
        # by hand, not dataclasses.asdict: the flight log serialises every call, and asdict's deep
        # copy costs more than the collective's own Python overhead
        out = {name: getattr(self, name) for name in _FIELD_NAMES}
        for key in ("group", "input_splits", "output_splits", "assumed"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out

    @classmethod
    def from_json(cls, d: dict) -> "CommEvent":
        d = dict(d)
        for key in ("group", "input_splits", "output_splits", "assumed"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


_FIELD_NAMES = tuple(f.name for f in fields(CommEvent))

COMPARED_FIELDS = ("op", "axis", "group", "phase", "dtype", "bytes_in", "bytes_out", "region", "microbatch",
                   "input_splits", "output_splits", "peer")
"""Fields a captured event must share with its predicted twin (rank and seq are the match key); a field
either side has `CommEvent.assumed` is left out."""


def orders_members(e: CommEvent) -> bool:
    """Whether `e` tells its group's members apart beyond first or not: a point-to-point call (a pipeline's
    stages, a ring), or a rooted call whose root is not the group's first member. Everywhere else the
    first member is the one that differs (the root of torch's and Megatron-core's rooted calls, logging
    on a group's rank 0), which is how a fake world classes ranks and a budget names its classes."""
    return e.op in P2P or (e.peer is not None and bool(e.group) and e.peer != e.group[0])


def compared(a: CommEvent, b: CommEvent, names=COMPARED_FIELDS) -> tuple[str, ...]:
    """The fields of `names` two events are held to: all but those either one assumed."""
    return tuple(f for f in names if f not in a.assumed and f not in b.assumed)


def payload_bytes(op: str, numel_in: int, group_size: int, elem_bytes: int) -> tuple[int, int]:
    """Logical (bytes_in, bytes_out) of an even collective whose input holds `numel_in` elements.

    all_gather multiplies by the group size, reduce_scatter divides by it (and must divide evenly),
    all_reduce, all_to_all (even splits) and broadcast keep the size.
    """
    b = numel_in * elem_bytes
    if op == "all_gather":
        return b, b * group_size
    if op == "reduce_scatter":
        if numel_in % group_size:
            raise ValueError(f"reduce_scatter input of {numel_in} elements does not split over {group_size} ranks")
        return b, b // group_size
    if op == "send":
        return b, 0
    if op == "recv":
        return 0, b
    if op == "barrier":
        return 0, 0
    return b, b


def by_group(events) -> dict[tuple[int, str, tuple[int, ...]], list[CommEvent]]:
    """Events keyed by (rank, axis, group ranks), each list in seq order."""
    out: dict = defaultdict(list)
    for e in sorted(events, key=lambda e: (e.rank, e.axis, e.group, e.seq)):
        out[(e.rank, e.axis, e.group)].append(e)
    return dict(out)


def counts(events) -> dict[str, int]:
    """Number of events per op, in `OPS` order, only ops that occur."""
    c = Counter(e.op for e in events)
    return {op: c[op] for op in OPS if c[op]}


def diff(predicted, captured, limit: int = 10) -> list[str]:
    """Differences between two ledgers, event by event per rank and group; empty when they match.

    Each line names the rank, the group, the seq and the first differing fields, so that a mismatch
    points at the first divergent call rather than at a count.
    """
    p, c = by_group(predicted), by_group(captured)
    problems: list[str] = []
    for key in sorted(set(p) | set(c)):
        rank, axis, group = key
        pl, cl = p.get(key, []), c.get(key, [])
        where = f"rank {rank} {axis}{list(group)}"
        for i in range(max(len(pl), len(cl))):
            if i >= len(pl):
                problems.append(f"{where} #{i}: captured {_brief(cl[i])} that was not predicted")
            elif i >= len(cl):
                problems.append(f"{where} #{i}: predicted {_brief(pl[i])} was not issued")
            else:
                bad = [f for f in compared(pl[i], cl[i]) if getattr(pl[i], f) != getattr(cl[i], f)]
                if bad:
                    detail = ", ".join(f"{f} predicted {getattr(pl[i], f)!r} captured {getattr(cl[i], f)!r}" for f in bad)
                    problems.append(f"{where} #{i} {pl[i].op}: {detail}")
            if len(problems) >= limit:
                return problems
    return problems


def _brief(e: CommEvent) -> str:
    extra = f" peer {e.peer}" if e.peer is not None else ""
    return f"{e.op} {e.phase} {e.bytes_in}->{e.bytes_out} B{extra}"


class Word(str, Enum):
    """A verdict's word (a trace's outcome, a check's status, a diff's or a budget's verdict): compared as
    the member it is, written to JSON and text as its value (``passed``), read back by ``Kind(value)``."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


def rank_ranges(ranks) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)


def parse_rank_ranges(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]: the inverse of `rank_ranges`."""
    out = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def human_bytes(n: int) -> str:
    """1024-based size as the chapter writes it: 64 KiB, 1 MiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"
