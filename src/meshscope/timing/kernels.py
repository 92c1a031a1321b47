"""NCCL kernel fingerprints: which GPU kernels NCCL really launched, from a torch.profiler trace.

The chapter's Nsight communication fingerprint (docs/chapter.md, Q25) counts, per rank and config, the NCCL
kernels by family (AllReduce, AllGather, ReduceScatter, SendRecv) and finds that a logical all-to-all
appears as ``ncclDevKernel_SendRecv``, not as an "AllToAll" kernel (a search by kernel name for AllToAll
wrongly finds no MoE traffic). So a fingerprint is a count per *family*, the predictor's logical events map
to the families they must launch (`expected_kernels`), and the profiler's comm metadata (`comm_records`:
collective name, split sizes, group ranks) tells an EP all-to-all from PP P2P where both are SendRecv
kernels.

Kernel names differ across NCCL versions; the family is the collective word in the name:
``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (NCCL >= 2.19), ``ncclKernel_AllReduce_RING_LL_Sum_float``
(older), ``ncclAllReduceRingLLKernel_sum_f32`` (2.4-2.6), symmetric-memory kernels such as
``ncclSymkDevKernel_AllGather_LL`` (2.27+), and P2P as ``ncclDevKernel_SendRecv`` or ``ncclSendRecvKernel``.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("AllReduce", "AllGather", "ReduceScatter", "SendRecv", "Broadcast", "Reduce", "NcclOther")
"""Kernel families, in report order. NcclOther: an NCCL kernel without a known collective word (shown,
never dropped, so an unexpected kernel fails the comparison instead of vanishing)."""

# Longest words first at each position, so "ReduceScatter" is not read as "Reduce" and "SendRecv" not as
# "Send"; the earliest word in the name wins (the collective word follows the prefix in every version).
_WORDS = re.compile(r"ReduceScatter|AllReduce|AllGather|SendRecv|Broadcast|Reduce|Send|Recv", re.IGNORECASE)
_FAMILY_OF_WORD = {w.lower(): w for w in FAMILIES} | {"send": "SendRecv", "recv": "SendRecv"}

EXPECTED_FAMILY = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
                   "all_to_all": "SendRecv", "send": "SendRecv", "recv": "SendRecv", "broadcast": "Broadcast",
                   "barrier": "AllReduce"}
"""Logical op -> the NCCL kernel family it launches. all_to_all is a group of ncclSend/ncclRecv (one
SendRecv kernel), as the chapter found (docs/chapter.md, Q25); barrier is ProcessGroupNCCL's all-reduce
of one element."""

COLLECTIVE_OP = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "send": "send", "recv": "recv", "broadcast": "broadcast", "_broadcast_oop": "broadcast", "barrier": "barrier",
}
"""ProcessGroupNCCL's "Collective name" (RECORD_PARAM_COMMS_DATA in ProcessGroupNCCL.cpp) -> logical op.
Names not listed ("wait", "coalesced", "reduce", "gather", "scatter") keep their own name."""


def classify(name: str) -> str | None:
    """The NCCL kernel family of a GPU kernel name; None if it is not an NCCL kernel."""
    if "nccl" not in name.lower():
        return None
    m = _WORDS.search(name.lower().replace("nccl", "____", 1))  # the prefix never counts as a word
    return _FAMILY_OF_WORD[m.group(0).lower()] if m else "NcclOther"


def _events(trace) -> list[dict]:
    """The event list of a Chrome trace given as a path, the loaded document, or the list itself."""
    if isinstance(trace, (str, Path)):
        trace = json.loads(Path(trace).read_text())
    return trace["traceEvents"] if isinstance(trace, dict) else list(trace)


def fingerprint(trace) -> dict[str, int]:
    """{family: kernel count} over the GPU kernels of a torch.profiler Chrome trace, in `FAMILIES` order.

    Counts launches (events with ``"cat": "kernel"``), not logical ops: a grouped launch of several
    P2P ops is one SendRecv kernel and counts once, as Nsight would show it.
    """
    c = Counter(classify(e.get("name", "")) for e in _events(trace) if str(e.get("cat", "")).lower() == "kernel")
    return {f: c[f] for f in FAMILIES if c[f]}


def kernel_seconds_per_step(trace, steps: int) -> list[float]:
    """NCCL kernel seconds of each of `steps` profiled steps that launched the same kernels: the
    kernels in start order, cut into `steps` equal runs (one run per step). With a count that does
    not divide (a fingerprint mismatch, reported on its own) every step gets the mean.

    A kernel's duration includes the time it waits for its peers, so on the critical rank it is the
    communication time a step pays, not the transfer time alone. Per step, so that a caller can take
    the median: the first step's first kernel also waits out the ranks' skew at the start of the
    window, which is not communication.
    """
    kernels = sorted((float(e.get("ts", 0.0)), float(e.get("dur", 0.0)) / 1e6) for e in _events(trace)
                     if str(e.get("cat", "")).lower() == "kernel" and classify(e.get("name", "")))
    if steps < 1:
        raise ValueError(f"steps {steps} must be at least 1")
    if len(kernels) % steps:
        return [sum(d for _, d in kernels) / steps] * steps
    per = len(kernels) // steps
    return [sum(d for _, d in kernels[i * per:(i + 1) * per]) for i in range(steps)]


def expected_kernels(events, batches=()) -> dict[str, int]:
    """{family: kernel count} one rank's logical events must launch, in `FAMILIES` order.

    Assumption, stated: every collective is one kernel, and so is every send and every recv issued on its
    own (blocking ``send``/``recv`` or a lone ``isend``/``irecv``: ProcessGroupNCCL launches each as its
    own ncclSend/ncclRecv). `batches` lists groups of send/recv events issued together in one NCCL group
    (``batch_isend_irecv``): each such group is ONE SendRecv kernel, however many ops it holds.
    """
    batched = {id(e) for b in batches for e in b}
    c = Counter(EXPECTED_FAMILY[e.op] for e in events if id(e) not in batched)
    for b in batches:
        ops = {e.op for e in b}
        if not b or not ops <= {"send", "recv"}:
            raise ValueError(f"a P2P batch holds only send/recv events; got {sorted(ops) or 'none'}")
        c["SendRecv"] += 1
    return {f: c[f] for f in FAMILIES if c[f]}


def compare_fingerprints(expected: dict[str, int], measured: dict[str, int]) -> list[str]:
    """One line per family whose kernel count differs; empty when the fingerprint equals the prediction."""
    return [f"{f}: predicted {expected.get(f, 0)} kernels, profiled {measured.get(f, 0)}"
            for f in FAMILIES if expected.get(f, 0) != measured.get(f, 0)]


@dataclass(frozen=True)
class CommRecord:
    """One ``record_param_comms`` event: the profiler's metadata of one c10d call (NCCL backend)."""

    op: str
    """Logical op (`COLLECTIVE_OP`) or the raw collective name if it has none."""
    collective: str
    """The raw "Collective name"."""
    group_ranks: tuple[int, ...] | None
    group_name: str
    in_splits: tuple[int, ...]
    """"In split size": rows sent to each member (empty when even or not an all-to-all)."""
    out_splits: tuple[int, ...]
    in_nelems: int
    out_nelems: int
    dtype: str


def _int_list(value) -> tuple[int, ...] | None:
    """"[0, 1]" (a string in the trace) or a list -> tuple of ints; None when absent or unparsable."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    return tuple(int(v) for v in value)


def comm_records(trace) -> list[CommRecord]:
    """The comm metadata torch's profiler attaches to ``record_param_comms`` CPU events, in trace order.

    ProcessGroupNCCL emits them (keys "Collective name", "In split size", "Out split size", "Process
    Group Ranks", "Process Group Name", "In msg nelems", "dtype"; see torch/csrc/profiler/util.h);
    gloo emits none, so on CPU this is empty. An EP all-to-all (op all_to_all with its splits on the ep
    group) and a PP send/recv (op send/recv on the pp group) both launch SendRecv kernels; these records
    are what tells them apart.
    """
    out = []
    for e in _events(trace):
        if e.get("name") != "record_param_comms":
            continue
        a = e.get("args", {})
        name = str(a.get("Collective name", ""))
        out.append(CommRecord(op=COLLECTIVE_OP.get(name, name), collective=name,
                              group_ranks=_int_list(a.get("Process Group Ranks")),
                              group_name=str(a.get("Process Group Name", "")),
                              in_splits=_int_list(a.get("In split size")) or (),
                              out_splits=_int_list(a.get("Out split size")) or (),
                              in_nelems=int(a.get("In msg nelems", 0)), out_nelems=int(a.get("Out msg nelems", 0)),
                              dtype=str(a.get("dtype", ""))))
    return out


def comm_counts(records) -> dict[str, dict[tuple[int, ...] | None, int]]:
    """{op: {group ranks: count}}: the logical ops behind the kernels, per group ("wait" records skipped)."""
    out: dict = {}
    for r in records:
        if r.collective != "wait":
            per_group = out.setdefault(r.op, {})
            per_group[r.group_ranks] = per_group.get(r.group_ranks, 0) + 1
    return out


@contextmanager
def profiled(path: Path, device):
    """Profile the enclosed code with torch.profiler (CPU, plus CUDA on a GPU) and export a Chrome trace.

    The device is synchronised before the profiler stops so that every launched kernel is in the trace.
    Yields the profiler; the trace is at `path` after the block.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield prof
        if cuda:
            torch.cuda.synchronize(device)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def profile_call(fn, path: Path, device) -> dict:
    """Run `fn()` once under `profiled`; return the exported trace's kernel fingerprint and comm records."""
    with profiled(path, device):
        fn()
    trace = json.loads(Path(path).read_text())
    return {"trace": str(path), "kernels": fingerprint(trace), "comm": comm_records(trace)}
