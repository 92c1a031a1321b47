"""The run directory: what a run writes into it, and how a directory is taken for a new run.

A run directory holds ``spec.json`` (what was asked), ``flight/`` (per-rank flight logs, appended to),
``errors/``, ``launcher.log``, ``result.json``, ``figures/`` (a pipeline run's timeline, and the
suite's charts; drawn from result.json, `report.timelines`) and, for the suite, ``report.md``,
``records/`` and ``traces/``. A directory given with ``--out`` must be new, empty, or an earlier
meshscope run directory (it has ``spec.json``): the earlier run's files are removed first, so that the
doctor never reads two runs' logs mixed, and nothing else of the user's is ever touched.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from ..core.errors import UsageError

ARTEFACTS = ("spec.json", "flight", "errors", "traces", "records", "figures", "result.json", "report.md",
             "launcher.log", "failure.txt", "ledgers", "ranks", "trace.json", "INCOMPLETE",
             "groups", "fr", "logs", "imports")  # a trace's: group creations, Flight Recorder dumps, fake-world logs

MAX_TIMEOUT_S = 7 * 24 * 3600.0


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `path` whole or not at all: a reader (the doctor, a fork server, a node's rank 0) never
    sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    tmp.replace(path)


def check_timeout(seconds: float) -> float:
    """A collective timeout must be a finite number of seconds, more than 0 and at most a week."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise UsageError(f"--timeout {seconds} must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]")
    return seconds


def check(run_dir: Path) -> None:
    """Refuse a directory that a run must not write into (before anything is written anywhere)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir} is a file; give a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not (run_dir / "spec.json").exists():
        raise UsageError(f"--out {run_dir} is a non-empty directory that holds no meshscope run (no spec.json); "
                         f"give a new or empty directory")


def start(run_dir: Path, spec: dict) -> None:
    """Take `run_dir` for a new run: remove an earlier run's artefacts, then write the spec."""
    check(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ARTEFACTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=1))
