"""torch's Flight Recorder in every traced worker, and its dumps in the run directory.

The recorder keeps, in C++, the last entries of every process group (op, sizes, dtypes, sequence
numbers, state); `meshscope doctor` reads its dumps beside meshscope's own flight log. `enable`
sets its environment before the script creates a process group (torch reads it then):
``TORCH_FR_BUFFER_SIZE`` (kept if the user set it or its alias), ``TORCH_FR_DUMP_TEMP_FILE`` =
``RUN_DIR/fr/rank_`` (NCCL writes ``rank_<R>`` there itself on a timeout with
``TORCH_NCCL_DUMP_ON_TIMEOUT=1``). gloo has no dump on timeout, so the rank calls `dump` itself when
a collective timed out, the script failed, or the launcher stopped it: ``rank_<R>`` holds the pickle
of ``_dump_fr_trace()``, ``rank_<R>.json`` the JSON of ``_dump_fr_trace_json()``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.rundir import RunDir, write_atomic

BUFFER_SIZE = "2000"
"""Entries kept per process (torch's ring buffer): a few steps of a large job."""


def enable(run_dir: RunDir) -> None:
    """Turn the recorder on for this process, dumping into `run_dir`; call before init_process_group."""
    if not (os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        os.environ["TORCH_FR_BUFFER_SIZE"] = BUFFER_SIZE
    run_dir.fr.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(run_dir.fr_prefix)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


def dump(run_dir: RunDir, rank: int) -> list[Path]:
    """Write this rank's recorder entries (pickle, and JSON where torch has it); keeps a dump NCCL
    already wrote. Returns the files written, none if the recorder is off or torch lacks it."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return []
    base = run_dir.fr_dump(rank)
    written = []
    for path, name in ((base, "_dump_fr_trace"), (base.with_name(base.name + ".json"), "_dump_fr_trace_json")):
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
