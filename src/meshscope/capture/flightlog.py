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

A traced job (`trace.recording`) writes its calls as compact JSON arrays instead, since its flusher runs
inside the user's job: ``["i", t, rank, seq, step, group name, op, phase, dtype, bytes_in, bytes_out, region,
input_splits, output_splits, peer]`` for an issued call, ``["c", t, group name, seq]`` once the rank went past
it (its next call on the group, or its step's end), ``["d", t, group name, seq]`` when its work completed (its
Work's future), the group named by an earlier ``group`` line (which then carries ``name``);
``["x", t, [us, ...], [n, ...]]`` for moves of one flush, the k-th at ``t`` plus the k-th number of microseconds (``t`` as
every compact line's: "Times" below), into the (phase, module) that an earlier ``["s", n, phase, module]``
names with the k-th number (a line per flush and source, the C++ recorder's or the Python list's, not per
move: a step of a job with module hooks moves dozens of times, and its flusher holds the job's GIL; a flush
may write one source's moves after another's later ones); a ``start`` line first (its ``t`` is the trace's
start), and step marks with their ``step``. `read` returns them as the dict lines above, so readers see one
format.

**Times.** A line's ``t`` is wall-clock seconds (the process's ``time.time()`` at its trace's start plus its
monotonic clock since then, so the lines of one rank are in order even if the wall clock is stepped); a
compact line's is whole microseconds after the ``start`` line's instead, which `read` turns into wall-clock
seconds (the repr of an epoch float, the shortest that reads back, takes Python's big-number conversion: 409
ns against 125 ns for an int's on the box, and 0.85 M of the 4.56 M instructions per step the trace added to
bench_trace.py's FSDP2 x TP step, whose 45 calls make 135 timed lines: benchmarks/bench_instructions.py,
2026-12-05). A traced rank's ledger counts seconds from its start instead (``CommEvent.t_issue``), and Flight
Recorder dumps epoch seconds. `read_flight` is the one reader of a rank's log that keeps both: every time in
its `Flight` is seconds since the rank's start (as the ledger's), and `Flight.start` turns them back into
wall-clock time. It reads a file once per process while the file is unchanged: the trace's assembly and the
doctor's rules share one reading.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
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
    out, groups, states, start = [], {}, {}, None
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
            if isinstance(record, list):
                out += _expand(record, groups, states, start)
                continue
            if record.get("kind") == "group" and "name" in record:
                groups[record["name"]] = record
            elif record.get("kind") == "start":
                start = record["t"]
        except (json.JSONDecodeError, KeyError, ValueError, TypeError, IndexError):
            if i == len(lines) - 1:
                continue
            raise UsageError(f"{path} line {i + 1} is not a flight-log record: {line[:60]!r}") from None
        out.append(record)
    return out


ISSUED = ("t", "rank", "seq", "step", "name", "op", "phase", "dtype", "bytes_in", "bytes_out", "region", "input_splits",
          "output_splits", "peer")
"""Fields of a compact ``"i"`` line after its tag."""


def _wall(t: int | float, start: float | None) -> float:
    """A compact line's time in wall-clock seconds: microseconds after the ``start`` line's (a float: the
    wall-clock seconds of a log written before 2026-12-05, read as they are)."""
    if isinstance(t, float):
        return t
    if start is None:
        raise ValueError("a compact line's time before the log's start line")
    return start + t * 1e-6


def _expand(record: list, groups: dict, states: dict, start: float | None) -> list[dict]:
    """The dict lines a compact line stands for (its group's axis and ranks, its moves' phase and module
    filled in, its time in wall-clock seconds): one, or one per move of an ``"x"`` line."""
    tag, *values = record
    if tag in ("c", "d"):
        t, name, seq = values
        g = groups[name]
        return [{"t": _wall(t, start), "kind": "completed" if tag == "c" else "done", "axis": g["axis"],
                 "group": g["ranks"], "seq": seq}]
    if tag == "s":
        number, phase, module = values
        states[number] = (phase, module)
        return [{"kind": "state", "n": number, "phase": phase, "module": module}]
    if tag == "x":
        t0, after_us, numbers = values
        if len(after_us) != len(numbers):
            raise ValueError(f"a moves line with {len(after_us)} times and {len(numbers)} states")
        first = _wall(t0, start)
        return [{"t": first + us / 1e6, "kind": "move", "phase": states[n][0], "module": states[n][1]}
                for us, n in zip(after_us, numbers)]
    if tag != "i" or len(values) != len(ISSUED):
        raise ValueError(f"unknown compact record {tag!r}")
    d = dict(zip(ISSUED, values))
    g = groups[d.pop("name")]
    return [{**d, "t": _wall(d["t"], start), "kind": "issued", "axis": g["axis"], "group": g["ranks"]}]


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
    with open(path) as lines:  # line by line: a 1,024-rank job's is 18,297 lines (1.7 MB, torchtitan 0.3.0)
        for line in lines:
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


@dataclass
class Flight:
    """One rank's flight log, read once (`read_flight`): times in seconds since the rank's start."""

    rank: int
    start: float | None
    """The rank's start in wall-clock seconds (None: a log without a ``start`` line, meshscope's own runs,
    whose times then stay wall-clock)."""
    groups: list[dict] = field(default_factory=list)
    """Its ``group`` lines in order (axis, ranks, index; a trace's also name and desc)."""
    issued: list = field(default_factory=list)
    """Every call (`CommEvent`) in issue order, with `t_issue`, `t_done` and `t_complete` where logged."""
    completed: set = field(default_factory=set)
    """(axis, group, seq) of the calls the rank went past."""
    issued_at: dict = field(default_factory=dict)
    """(axis, group, seq) -> when the call was issued, in wall-clock seconds (the doctor dates findings so)."""
    marks: list[tuple[float, str, int | None]] = field(default_factory=list)
    """(t, text, step) of every mark; ``step`` for a step's end."""
    queued: dict[int, float] = field(default_factory=dict)
    """Step -> how long the rank's main thread had waited for a CPU by that step's end, in seconds
    (a trace's step marks, where Linux tells it: `trace.recording.RunQueue`)."""
    moves: list[tuple[float, str, str]] = field(default_factory=list)
    """(t, phase, module) of every move between phases and modules, in time order."""

    def wall(self, t: float) -> float:
        """A time of this log in wall-clock seconds."""
        return t + (self.start or 0.0)


_read: dict[Path, tuple[tuple, Flight]] = {}


def read_flight(path: Path, rank: int) -> Flight:
    """Rank `rank`'s flight log at `path`, as a `Flight` (read again only if the file changed)."""
    path = Path(path)
    stat = os.stat(path)
    stamp = (stat.st_mtime_ns, stat.st_size)
    known = _read.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    from ..core.events import CommEvent

    lines = read(path)
    start = next((ln["t"] for ln in lines if ln.get("kind") == "start"), None)
    zero = start or 0.0
    flight = Flight(rank, start)
    at: dict[tuple, int] = {}
    for ln in lines:
        kind = ln.get("kind")
        if kind == "issued":
            e = CommEvent.from_json(ln)
            if start is not None:
                e = replace(e, t_issue=ln["t"] - start)
            at[(e.axis, e.group, e.seq)] = len(flight.issued)
            flight.issued_at[(e.axis, e.group, e.seq)] = ln["t"]
            flight.issued.append(e)
        elif kind in ("completed", "done"):
            k = (ln["axis"], tuple(ln["group"]), ln["seq"])
            index = at.get(k)
            if kind == "completed":
                flight.completed.add(k)
            if index is not None and start is not None:
                name = "t_done" if kind == "completed" else "t_complete"
                flight.issued[index] = replace(flight.issued[index], **{name: ln["t"] - zero})
        elif kind == "group":
            flight.groups.append(ln)
        elif kind == "mark":
            flight.marks.append((ln["t"] - zero, ln["text"], ln.get("step")))
            if ln.get("queued") is not None:
                flight.queued[ln["step"]] = ln["queued"]
        elif kind == "move":
            flight.moves.append((ln["t"] - zero, ln["phase"], ln["module"]))
    flight.moves.sort(key=lambda m: m[0])  # stable: in the log's order where times tie
    _read[path] = (stamp, flight)
    return flight
