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

A traced job (`trace.rank`) writes its calls as compact JSON arrays instead, since its flusher runs
inside the user's job: ``["i", t, rank, seq, step, group name, op, phase, dtype, bytes_in,
bytes_out, region, input_splits, output_splits, peer]`` for an issued call and ``["c", t, group name,
seq]`` for a completed one, the group named by an earlier ``group`` line (which then carries
``name``). `read` returns them as the dict lines above, so readers see one format.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.rundir import RunDir

if TYPE_CHECKING:
    from .recorder import Capture


class FlightLog:
    def __init__(self, run_dir: Path, rank: int):
        path = RunDir(run_dir).flight(rank)
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
        from .recorder import Capture  # imports torch; the readers of a flight log (doctor, trace) need none

        return Capture(on_issue=lambda e: self._write("issued", **e.to_json()),
                       on_complete=lambda e: self._write("completed", axis=e.axis, group=list(e.group), seq=e.seq))

    def close(self) -> None:
        self._file.close()


def read(path: Path) -> list[dict]:
    """The lines of one rank's flight log. Only a torn LAST line (a rank killed mid-write) is skipped;
    any other unreadable line means the log is not a flight log, and raises `UsageError`."""
    from ..core.errors import UsageError

    lines = Path(path).read_text().splitlines()
    out, groups = [], {}
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
            if isinstance(record, list):
                record = _expand(record, groups)
            elif record.get("kind") == "group" and "name" in record:
                groups[record["name"]] = record
        except (json.JSONDecodeError, KeyError, ValueError, TypeError, IndexError):
            if i == len(lines) - 1:
                continue
            raise UsageError(f"{path} line {i + 1} is not a flight-log record: {line[:60]!r}") from None
        out.append(record)
    return out


ISSUED = ("t", "rank", "seq", "step", "name", "op", "phase", "dtype", "bytes_in", "bytes_out", "region", "input_splits",
          "output_splits", "peer")
"""Fields of a compact ``"i"`` line after its tag."""


def _expand(record: list, groups: dict) -> dict:
    """A compact ``"i"`` or ``"c"`` line as the dict line it stands for (its group's axis and ranks filled in)."""
    tag, *values = record
    if tag == "c":
        t, name, seq = values
        g = groups[name]
        return {"t": t, "kind": "completed", "axis": g["axis"], "group": g["ranks"], "seq": seq}
    if tag != "i" or len(values) != len(ISSUED):
        raise ValueError(f"unknown compact record {tag!r}")
    d = dict(zip(ISSUED, values))
    g = groups[d.pop("name")]
    return {**d, "kind": "issued", "axis": g["axis"], "group": g["ranks"]}


@dataclass
class GroupLog:
    """One traced rank's ``groups/rank<R>.jsonl`` (`trace.created`): whether it initialised the default
    group, and its ``new_group`` calls in order, member or not: {index, desc, ranks, local, done, t}
    (``done``: it returned; ``local``: members-only synchronisation)."""

    initialised: bool
    creations: list[dict]


def read_creations(path: Path) -> GroupLog:
    """A traced rank's group log; a torn last line is skipped."""
    out: dict[int, dict] = {}
    initialised = False
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == "initialised":
            initialised = True
        elif rec.get("kind") == "creating":
            out[rec["index"]] = {"index": rec["index"], "desc": rec["desc"], "ranks": rec["ranks"],
                                 "local": rec.get("local", False), "done": False, "t": rec["t"]}
        elif rec.get("kind") == "created" and rec.get("index") in out:
            out[rec["index"]]["done"] = True
    return GroupLog(initialised, [out[i] for i in sorted(out)])
