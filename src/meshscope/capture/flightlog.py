"""Per-rank flight log: every group creation and every collective, written as it happens.

The chapter's production-diagnosis checklist (docs/chapter.md, "Faults the doctor names"): a hang is
explained by comparing what each rank issued, in which group, in which order. Each rank appends JSON lines
to ``RUN_DIR/flight/rank<R>.jsonl`` and flushes every line, so a rank that hangs or is killed still leaves
its log: a collective logged as ``issued`` without ``completed`` is where that rank is stuck. The doctor
reads these files.

Line kinds: ``group`` (axis, ranks, index in the creation sequence), ``issued`` (a CommEvent: seq per
group, op, group, phase, dtype, bytes, splits, peer, region, microbatch), ``completed`` (axis, group
and seq of the issued call that returned),
``mark`` (free-form progress, e.g. an experiment starting).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .recorder import Capture


class FlightLog:
    def __init__(self, run_dir: Path, rank: int):
        path = Path(run_dir) / "flight" / f"rank{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1)  # line-buffered: each line reaches the OS at once
        self._groups = 0

    def _write(self, kind: str, **fields) -> None:
        self._file.write(json.dumps({"t": time.time(), "kind": kind, **fields}) + "\n")

    def group_created(self, axis: str, ranks) -> None:
        self._write("group", axis=axis, ranks=list(ranks), index=self._groups)
        self._groups += 1

    def mark(self, text: str) -> None:
        self._write("mark", text=text)

    def capture(self) -> Capture:
        """A capture that logs every collective of this rank as issued (in full), then completed (its
        key: axis, group and seq identify the call)."""
        return Capture(on_issue=lambda e: self._write("issued", **e.to_json()),
                       on_complete=lambda e: self._write("completed", axis=e.axis, group=list(e.group), seq=e.seq))

    def close(self) -> None:
        self._file.close()


def read(path: Path) -> list[dict]:
    """The lines of one rank's flight log. Only a torn LAST line (a rank killed mid-write) is skipped;
    any other unreadable line means the log is not a flight log, and raises `UsageError`."""
    from ..core.errors import UsageError

    lines = Path(path).read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue
            raise UsageError(f"{path} line {i + 1} is not a flight-log record: {line[:60]!r}") from None
    return out
