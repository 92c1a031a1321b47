"""One typed record per Flight Recorder entry and per dump, whatever format version torch wrote.

Format versions (the ``version`` key; torch bumps the minor when it adds a field, the major when it
changes one), read from torch's ``NCCLUtils.hpp`` / ``TraceUtils.h`` (2.2, 2.3), ``FlightRecorder.hpp``
(2.4, 2.7, 2.10) and torchfrtrace's ``components/`` (``utils.py``: no all_to_all sizes before 2.4;
``builder.py``: coalesced groups of collectives from 2.7):

  2.2   torch 2.4: pg_config, entries with collective_seq_id / p2p_seq_id / is_p2p / timeout_ms; no pg_status
  2.3   + pg_status; the JSON dump appears
  2.4   + all_to_all input/output sizes
  2.5-2.9  + nccl_version (top level), coalesced collectives recorded as one entry
  2.10  torch 2.9 to 2.13: comm_lib_version replaces nccl_version; entries gain thread_name, thread_id;
        gloo records too (measured on 2.13)

Every later field is optional here, so each version maps onto the same records. The JSON form differs
from the pickle: no frames, 0 for an unset time, pg_status values as strings, process_group a list.
Each entry becomes a `CommEvent` (op, axis from the group's description, group ranks, dtype, logical
bytes, peer), kept with the recorder's own fields, so nothing downstream reads the dict again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from math import prod

from ..core.axes import axis_of
from ..core.errors import UsageError
from ..core.events import DTYPE_BYTES, CommEvent

VERSIONS = ("2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10")
"""Format versions torch 2.4 through 2.13 write (module docstring)."""

DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
          "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}
"""torch's ScalarType names, as the recorder writes them, -> meshscope's dtype names."""

_ELEM = DTYPE_BYTES | {"int16": 2, "bool": 1}

_OPS = (("allgather", "all_gather"), ("all_gather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
        ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"), ("alltoall", "all_to_all"),
        ("all_to_all", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"), ("reduce", "reduce"),
        ("gather", "gather"), ("scatter", "scatter"), ("send", "send"), ("recv", "recv"))
"""Substring of a profiling name -> op, first match wins (``nccl:_allgather_base`` is an all_gather)."""


@dataclass(frozen=True, slots=True)
class FrGroup:
    """A process group as one rank's recorder names it."""

    name: str
    """torch's group name (``"0"`` for the default group, a global counter or hash for the others)."""
    desc: str
    """The group's description (``default_pg``, ``mesh_tp``, a Megatron name): gives its axis."""
    ranks: tuple[int, ...] | None
    """Global ranks, ascending; None where neither ``pg_config`` nor the job's other dumps tell."""
    listed: bool = False
    """The ranks come from ``pg_config`` (NCCL); False: inferred from which dumps name the group (gloo),
    which misses a member that never issued a call on it."""


@dataclass(frozen=True, slots=True)
class FrEntry:
    """One recorded call of one rank: its `CommEvent` and what only the recorder knows about it."""

    event: CommEvent
    """The call as meshscope records any call (seq: its position among this rank's entries on the group)."""
    group: FrGroup
    profiling_name: str
    """torch's name for the call, e.g. ``gloo:all_reduce``, ``nccl:send 0->1``."""
    record_id: int
    collective_seq_id: int
    """1-based position among the group's collectives, the same on every member (0 for P2P)."""
    p2p_seq_id: int
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    state: str
    """``scheduled``, ``started`` or ``completed``; gloo leaves every entry ``scheduled``."""
    retired: bool
    """Gone from the backend's work list: finished on gloo, finished or timed out on NCCL."""
    time_created_ns: int
    timeout_ms: int | None
    frame: str
    """Innermost user frame ('fn at file:line'), empty where the dump has none (JSON, no stacks)."""
    duration_ms: float | None = None
    """NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``: the time between the work's start and end CUDA events
    on its stream (the kernel, its wait for the peers inside it included); None otherwise."""

    @property
    def done(self) -> bool:
        """Known to have finished: NCCL marks it completed; gloo only retires it."""
        return self.state == "completed" or (self.retired and self.profiling_name.startswith("gloo:"))


@dataclass(frozen=True, slots=True)
class FrDump:
    """One rank's dump."""

    rank: int
    version: str
    backend: str
    """The library of its entries' profiling names (``gloo``, ``nccl``), '' with no entry."""
    comm_lib_version: str
    groups: dict[str, FrGroup]
    """pg_config by group name (empty on gloo)."""
    entries: tuple[FrEntry, ...]
    """In record order (oldest first; a full ring buffer has dropped the oldest)."""
    pg_status: dict[str, dict[str, int]]
    """Per group id: last_enqueued/started/completed_collective ({} before 2.3)."""


def _ranks(text) -> tuple[int, ...] | None:
    ranks = json.loads(text) if isinstance(text, str) else list(text)
    return tuple(sorted(int(r) for r in ranks)) or None


def _op(profiling_name: str) -> str:
    call = profiling_name.split(":", 1)[-1].split(" ")[0]
    return next((op for sub, op in _OPS if sub in call), call)


def _bytes(sizes, dtypes) -> int:
    return sum(prod(s) * _ELEM.get(DTYPES.get(d, ""), 0) for s, d in zip(sizes, dtypes))


def _frame(raw: dict) -> str:
    user = [f for f in raw.get("frames") or () if "torch/distributed" not in f.get("filename", "")]
    return f"{user[0]['name']} at {user[0]['filename']}:{user[0]['line']}" if user else ""


def check_version(doc: dict, where: str) -> str:
    """The dump's format version; UsageError naming it and the known ones if meshscope cannot read it."""
    version = str(doc.get("version"))
    if version not in VERSIONS:
        raise UsageError(f"{where}: Flight Recorder format version {version!r} is not one meshscope reads "
                         f"(known: {', '.join(VERSIONS)}, written by torch 2.4 to 2.13)")
    return version


def parse(rank: int, doc: dict, where: str, members: dict[str, tuple[int, ...]],
          axes: dict[str, str] | None = None) -> FrDump:
    """The typed dump of one rank's decoded file. `members`: group name -> ranks, for the groups whose
    ranks the dump leaves out (gloo writes no pg_config); `axes`: group name -> axis where a trace
    labelled the group (a 1-D DeviceMesh reuses the default group, whose description says nothing)."""
    axes = axes or {}
    version = check_version(doc, where)
    groups = {str(k): FrGroup(str(v.get("name", k)), str(v.get("desc", "")), _ranks(v.get("ranks", "[]")), True)
              for k, v in (doc.get("pg_config") or {}).items() if k}
    entries, seq = [], {}
    for raw in doc.get("entries") or ():
        name, desc = (str(x) for x in raw["process_group"])
        listed = name in groups and groups[name].ranks is not None
        entries.append((raw, FrGroup(name, desc, groups[name].ranks if listed else members.get(name), listed)))
    backend = next((raw["profiling_name"].split(":")[0] for raw, _ in entries), "")
    out = []
    for raw, group in entries:
        op = _op(raw["profiling_name"])
        ins, outs = (tuple(tuple(int(d) for d in s) for s in raw.get(k) or ()) for k in ("input_sizes", "output_sizes"))
        b_in, b_out = _bytes(ins, raw.get("input_dtypes") or ()), _bytes(outs, raw.get("output_dtypes") or ())
        if op == "all_to_all" and version in ("2.2", "2.3"):
            b_in = b_out = 0  # not recorded before 2.4: no size to compare
        k = seq[group.name] = seq.get(group.name, -1) + 1
        out.append(FrEntry(
            CommEvent(rank=rank, seq=k, op=op, axis=axes.get(group.name) or axis_of(group.desc, group.name == "0"),
                      group=group.ranks or (), phase="other",
                      dtype=DTYPES.get(next(iter(raw.get("input_dtypes") or raw.get("output_dtypes") or ()), ""), ""),
                      bytes_in=b_in if op != "recv" else 0, bytes_out=b_out if op != "send" else 0,
                      peer=_peer(raw["profiling_name"], group.ranks), t_issue=int(raw["time_created_ns"]) / 1e9),
            group, raw["profiling_name"], int(raw["record_id"]), int(raw.get("collective_seq_id", 0)),
            int(raw.get("p2p_seq_id", 0)), ins, outs, str(raw.get("state", "")), bool(raw.get("retired", False)),
            int(raw["time_created_ns"]), raw.get("timeout_ms"), _frame(raw),
            float(raw["duration_ms"]) if raw.get("duration_ms") is not None else None))
    status = {str(g): {k: int(v) for k, v in s.items()} for g, s in (doc.get("pg_status") or {}).items()}
    return FrDump(rank, version, backend, str(doc.get("comm_lib_version", doc.get("nccl_version", ""))),
                  groups, tuple(out), status)


def _peer(profiling_name: str, ranks: tuple[int, ...] | None) -> int | None:
    """The global rank at the other end of ``send a->b`` / ``recv b<-a`` (group ranks, in group order)."""
    meta = profiling_name.split(" ", 1)[1] if " " in profiling_name else ""
    ends = meta.replace("<-", "->").split("->")
    if len(ends) != 2 or not ranks:
        return None
    other = int(ends[1])  # send src->dst and recv dst<-src both name the other end second
    return ranks[other] if other < len(ranks) else None
