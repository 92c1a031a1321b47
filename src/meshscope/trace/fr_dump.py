"""torch's Flight Recorder in every traced worker, and its dumps in the run directory.

The recorder keeps, in C++, the last entries of every process group (op, sizes, dtypes, sequence
numbers, state); `meshscope doctor` reads its dumps beside meshscope's own flight log. `enable`
sets its environment before the script creates a process group (torch reads it then):
``TORCH_FR_BUFFER_SIZE`` (kept if the user set it or its alias), ``TORCH_FR_DUMP_TEMP_FILE`` =
``RUN_DIR/fr/rank_`` (NCCL writes ``rank_<R>`` there itself on a timeout with
``TORCH_NCCL_DUMP_ON_TIMEOUT=1``). gloo has no dump on timeout, so the rank calls `dump` itself when
a collective timed out, the script failed, or the launcher stopped it: ``rank_<R>`` holds the pickle
of ``_dump_fr_trace()``, ``rank_<R>.json`` the JSON of ``_dump_fr_trace_json()`` (NCCL's own recorder's
``_dump_nccl_trace*`` instead where it holds entries, `_recorder`).

On NCCL it also gives each call its time on the GPU (`gpu_durations`): ``TORCH_NCCL_ENABLE_TIMING=1``
(set unless the user set it) makes ProcessGroupNCCL record a start event beside its end event on the
work's stream, and the recorder's entry of a completed work carries the time between them
(``duration_ms``; read in torch 2.11's ProcessGroupNCCL.cpp, seen on one H200 with torch 2.11). At the rank's end the
entries are matched to the traced calls: per group, the k-th collective the trace saw is the entry
with ``collective_seq_id`` k (1-based, torch counts them on every member alike), the k-th
point-to-point call the one with ``p2p_seq_id`` k, each kept only where the ops agree (NCCL records a
batch of coalesced sends and receives as one entry, which then matches none).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.errors import UsageError
from ..core.events import P2P
from ..core.rundir import RunDir, write_atomic
from ..doctor.fr_records import FrDump, parse

BUFFER_SIZE = "2000"
"""Entries kept per process (torch's ring buffer): a few steps of a large job."""


def enable(run_dir: RunDir) -> None:
    """Turn the recorder on for this process, dumping into `run_dir`; call before init_process_group."""
    if not (os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        os.environ["TORCH_FR_BUFFER_SIZE"] = BUFFER_SIZE
    run_dir.fr.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(run_dir.fr_prefix)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")


def _recorder(c10d) -> tuple[str, str]:
    """The names of the (pickle, JSON) dump functions of the recorder holding this job's entries. A CUDA
    build of torch keeps NCCL's entries in a recorder of their own (``_dump_nccl_trace``,
    torch/csrc/distributed/c10d/FlightRecorderCuda.cpp, torch 2.6 to 2.11); every other backend's go to
    ``_dump_fr_trace``'s. A job with both (Megatron's gloo twins beside its NCCL groups) gets NCCL's."""
    nccl = getattr(c10d, "_dump_nccl_trace_json", None)
    if nccl is not None:
        try:
            if json.loads(nccl()).get("entries"):
                return "_dump_nccl_trace", "_dump_nccl_trace_json"
        except (RuntimeError, ValueError):  # the recorder is off, or wrote nothing readable
            pass
    return "_dump_fr_trace", "_dump_fr_trace_json"


def gpu_durations(calls: list[tuple[str, str]], rank: int) -> dict[int, float]:
    """Index in `calls` ((group name, op) of each traced call, in issue order) -> its time on the GPU in
    ms, from this rank's NCCL recorder (`matched`); {} on a CPU build of torch or with no recorder."""
    try:
        from torch._C import _distributed_c10d as c10d

        doc = json.loads(c10d._dump_nccl_trace_json())
        return matched(calls, parse(rank, doc, "this rank's Flight Recorder", {}))
    except (ImportError, AttributeError, RuntimeError, ValueError, UsageError):  # no NCCL or recorder, or unreadable
        return {}


def matched(calls: list[tuple[str, str]], dump: FrDump) -> dict[int, float]:
    """Index in `calls` -> the GPU time of the NCCL entry that is that call (module docstring)."""
    if dump.backend != "nccl":
        return {}
    entries = {(e.group.name, e.event.op in P2P, e.p2p_seq_id if e.event.op in P2P else e.collective_seq_id): e
               for e in dump.entries if e.duration_ms is not None}
    out, counts = {}, {}
    for index, (group, op) in enumerate(calls):
        key = (group, op in P2P)
        counts[key] = counts.get(key, 0) + 1
        entry = entries.get((*key, counts[key]))
        if entry is not None and entry.event.op == op:
            out[index] = entry.duration_ms
    return out


def dump(run_dir: RunDir, rank: int) -> list[Path]:
    """Write this rank's recorder entries (pickle, and JSON where torch has it); keeps a dump NCCL
    already wrote. Returns the files written, none if the recorder is off or torch lacks it."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return []
    base = run_dir.fr_dump(rank)
    written = []
    pickled, as_json = _recorder(c10d)
    for path, name in ((base, pickled), (base.with_name(base.name + ".json"), as_json)):
        fn = getattr(c10d, name, None)
        if fn is None or path.exists():
            continue
        try:
            data = fn()
        except RuntimeError:  # the recorder is off (no buffer size) or has nothing to say
            continue
        write_atomic(path, data if isinstance(data, bytes) else str(data).encode())
        written.append(path)
    return written
