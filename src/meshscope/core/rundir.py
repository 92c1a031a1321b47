"""The run directory: every path a run or a trace writes, and how a directory is taken for a new one.

One object names each file, so that the rank that writes ``flight/rank3.jsonl``, the launcher that
watches it grow, the assembler and the doctor that read it all spell it once (`RunDir`). What a
directory holds:

- ``spec.json`` (what was asked), ``result.json`` (the verdict), ``INCOMPLETE`` (a trace whose job has
  not finished, or whose launcher was killed);
- per rank: ``flight/rank<R>.jsonl`` (every call as it happens, the doctor's evidence),
  ``errors/rank<R>.json`` (a run's failed rank), ``ledgers/rank<R>.jsonl`` and ``ranks/rank<R>.json``
  (a traced rank's calls and how it ended), ``groups/rank<R>.jsonl`` (a traced rank's group
  creations), ``logs/rank<R>.log`` (what a traced rank printed), ``fr/rank_<R>`` (torch's Flight
  Recorder dump), ``imports/rank<R>.json`` (a fake world's learned imports), ``objects/rank<R>/`` (what
  a fake world's rank sent in its object collectives, read by the ranks traced after it),
  ``work/rank<R>.json`` (what a ``--work`` rank computed between its calls, and its memory: `meshscope forecast`);
- ``launcher.log``, ``failure.txt``, ``report.md``, ``trace.json`` (the Chrome trace), ``figures/``,
  ``records/`` and ``traces/`` (the suite's and the profiler's).

A directory given with ``--out`` must be new, empty, or an earlier meshscope run directory (it has
``spec.json``): the earlier run's files are removed first, so that the doctor never reads two runs'
logs mixed, and nothing else of the user's is ever touched. Every way the path itself can be
unusable (under ``/proc``, below a regular file, not writable) is one `UsageError` naming it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

from .errors import UsageError
from .rank_end import RankEnd
from .trace_spec import TraceSpec

ARTEFACTS = ("spec.json", "flight", "errors", "traces", "records", "figures", "result.json", "report.md",
             "launcher.log", "failure.txt", "ledgers", "ranks", "trace.json", "INCOMPLETE",
             "groups", "fr", "logs", "imports", "objects", "work")
"""Everything an earlier run may have left in a directory (what `RunDir.start` removes)."""

PER_RANK = {"flight": ("flight", ".jsonl"), "errors": ("errors", ".json"), "ledgers": ("ledgers", ".jsonl"),
            "ranks": ("ranks", ".json"), "groups": ("groups", ".jsonl"), "logs": ("logs", ".log"),
            "imports": ("imports", ".json"), "objects": ("objects", ""), "work": ("work", ".json")}
"""kind -> (folder, suffix) of the ``<folder>/rank<R><suffix>`` files."""

MAX_TIMEOUT_S = 7 * 24 * 3600.0

_RANK_FILE = re.compile(r"^rank(\d+)$")


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `path` whole or not at all: a reader (the doctor, a fork server, a node's rank 0) never
    sees half a file. The temporary file is this process's own: two nodes of one job that write the
    same file of a shared directory (result.json, as each assembles the trace) would otherwise move
    each other's temporary file away."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
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


class RunDir:
    """A run or trace directory: the path of every file in it, and taking it for a new run."""

    INCOMPLETE = "INCOMPLETE"

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    # -- the directory's own files -------------------------------------------------------------------
    @property
    def spec(self) -> Path:
        return self.path / "spec.json"

    @property
    def result(self) -> Path:
        return self.path / "result.json"

    @property
    def incomplete(self) -> Path:
        return self.path / self.INCOMPLETE

    @property
    def launcher_log(self) -> Path:
        return self.path / "launcher.log"

    @property
    def failure(self) -> Path:
        return self.path / "failure.txt"

    @property
    def report(self) -> Path:
        return self.path / "report.md"

    @property
    def chrome_trace(self) -> Path:
        return self.path / "trace.json"

    @property
    def figures(self) -> Path:
        return self.path / "figures"

    def profile(self, label: str, rank: int) -> Path:
        """``traces/<label>.rank<R>.json``: the profiler's Chrome trace of one rank of a run."""
        return self.path / "traces" / f"{label}.rank{rank}.json"

    @property
    def fork_server_log(self) -> Path:
        return self.path / "logs" / "fork_server.log"

    @property
    def fr(self) -> Path:
        """``fr/``: torch's Flight Recorder dumps of a trace."""
        return self.path / "fr"

    @property
    def fr_prefix(self) -> Path:
        """``TORCH_FR_DUMP_TEMP_FILE``: torch appends the rank (``fr/rank_<R>``)."""
        return self.fr / "rank_"

    # -- per rank ------------------------------------------------------------------------------------
    def rank_file(self, kind: str, rank: int) -> Path:
        """``<folder>/rank<R><suffix>`` of `kind` (`PER_RANK`)."""
        folder, suffix = PER_RANK[kind]
        return self.path / folder / f"rank{rank}{suffix}"

    def flight(self, rank: int) -> Path:
        return self.rank_file("flight", rank)

    def errors(self, rank: int) -> Path:
        return self.rank_file("errors", rank)

    def ledger(self, rank: int) -> Path:
        return self.rank_file("ledgers", rank)

    def rank_end(self, rank: int) -> Path:
        return self.rank_file("ranks", rank)

    def groups(self, rank: int) -> Path:
        return self.rank_file("groups", rank)

    def log(self, rank: int) -> Path:
        return self.rank_file("logs", rank)

    def imports(self, rank: int) -> Path:
        return self.rank_file("imports", rank)

    def objects(self, rank: int) -> Path:
        """``objects/rank<R>/``: one file per object collective a fake world's rank sent objects in
        (`trace.fake.objects`)."""
        return self.rank_file("objects", rank)

    def work(self, rank: int) -> Path:
        """``work/rank<R>.json``: what a ``--work`` rank computed between its calls and the memory it held
        (`capture.work`)."""
        return self.rank_file("work", rank)

    def fr_dump(self, rank: int) -> Path:
        return Path(f"{self.fr_prefix}{rank}")

    def ranks_with(self, kind: str) -> list[int]:
        """The ranks that have a `kind` file, ascending."""
        folder, suffix = PER_RANK[kind]
        found = []
        for path in (self.path / folder).glob(f"rank*{suffix}"):
            m = _RANK_FILE.match(path.name.removesuffix(suffix))
            if m and path.name.endswith(suffix):
                found.append(int(m[1]))
        return sorted(found)

    def files(self, kind: str) -> list[Path]:
        """Every `kind` file, by rank."""
        return [self.rank_file(kind, r) for r in self.ranks_with(kind)]

    # -- taking the directory ------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse a directory that a run must not write into (before anything is written anywhere): one
        line naming the path and why, for every way it can be unusable."""
        path = self.path
        blocker = next((p for p in [path, *path.parents] if p.exists() and not p.is_dir()), None)
        if blocker == path:
            raise UsageError(f"--out {path} is a file; give a directory")
        if blocker is not None:
            raise UsageError(f"--out {path}: {blocker} is a file, not a directory; give a path below a directory")
        if path.is_dir() and any(path.iterdir()) and not self.spec.exists():
            raise UsageError(f"--out {path} is a non-empty directory that holds no meshscope run (no spec.json); "
                             f"give a new or empty directory")
        _check_writable(path)

    def start(self, spec: dict) -> None:
        """Take the directory for a new run: remove an earlier run's artefacts, then write the spec."""
        self.check()
        self.path.mkdir(parents=True, exist_ok=True)
        for name in ARTEFACTS:
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        self.write_spec(spec)

    def write_spec(self, spec: dict) -> None:
        write_atomic(self.spec, json.dumps(spec, indent=1))

    def read_spec(self) -> dict | None:
        """The spec, None where the directory has none (it is not a meshscope directory)."""
        if not self.spec.is_file():
            return None
        try:
            return json.loads(self.spec.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(f"{self.spec} is not valid JSON ({exc.msg} at line {exc.lineno})") from None

    def kind(self) -> str | None:
        """``trace``, ``suite``, ``sweep``, ``run`` (a run's spec has no kind), None without a spec."""
        spec = self.read_spec()
        return None if spec is None else spec.get("kind", "run")

    def begin(self, spec: TraceSpec) -> None:
        """Take the directory for a trace: `start`, then the `INCOMPLETE` marker until `conclude`."""
        self.start(spec.to_json())
        self.incomplete.write_text("the traced job has not finished; result.json is written when it has\n")

    def trace_spec(self) -> TraceSpec:
        """The spec of a trace directory; UsageError for any other directory."""
        spec = self.read_spec()
        if spec is None or spec.get("kind") != "trace":
            raise UsageError(f"{self.path} is not a meshscope trace directory (no trace spec.json)")
        return TraceSpec.from_json(spec)

    def write_end(self, end: RankEnd) -> None:
        """A traced rank's end (`RankEnd`), written once by the rank itself."""
        path = self.rank_end(end.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(end.to_json(), indent=1))

    def read_end(self, rank: int) -> RankEnd:
        """How a traced rank ended; ``missing`` where it left no record."""
        path = self.rank_end(rank)
        if not path.is_file():
            return RankEnd(rank, "missing", error="no record: the rank was killed before it could write one, "
                                                  "or never started")
        return RankEnd.from_json(json.loads(path.read_text()))

    def conclude(self, doc: dict) -> None:
        """Write the result document, then remove the marker."""
        write_atomic(self.result, json.dumps(doc))
        self.incomplete.unlink(missing_ok=True)

    def log_tail(self, rank: int, lines: int) -> tuple[list[str], int] | None:
        """The last `lines` lines a rank printed and how many it printed in all; None without a log."""
        path = self.log(rank)
        if not path.is_file():
            return None
        text = path.read_text(errors="replace").splitlines()
        return text[-lines:], len(text)

    def read_result(self) -> dict | None:
        """result.json, None where there is none yet."""
        if not self.result.is_file():
            return None
        try:
            return json.loads(self.result.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(f"{self.result} is not valid JSON ({exc.msg} at line {exc.lineno})") from None


def _check_writable(path: Path) -> None:
    """Create the directory (and remove it again if it was new) to learn, before any run starts, that it
    can be written: a path under ``/proc`` or ``/sys``, a read-only mount, a missing permission."""
    created = [p for p in [path, *path.parents] if not p.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".meshscope-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {path} cannot be written ({exc.strerror or type(exc).__name__}); give a "
                         f"directory you can write") from None
    finally:  # nothing is left behind by a check: the run creates the directory itself
        for p in created:
            if p.is_dir():
                p.rmdir()
