"""One traced rank's calls as they happen: recorded cheaply on the hot path, numbered and written
by a flusher thread, turned into `CommEvent`s and the rank's end at the finish.

A call is recorded as a tuple (by the C++ recorder where it is built, `capture.native`, else the
Python kernel, `capture.dispatch`), with a number that its completion (a callback on its Work's future)
names later; streamed to ``flight/rank<R>.jsonl`` by a thread that writes twice a second (so a killed
rank still leaves all but its last half second), with the job's moves between phases and modules
(`JobContext.moves`, or the C++ recorder's) and its step marks, and at the end written as
``ledgers/rank<R>.jsonl`` (every event with its step, and the axis `core.mesh_infer` gives a group the job
named none of) and ``ranks/rank<R>.json`` (`RankEnd`, with this rank's place on the common clock: `clock`).
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import sys
import threading
import time

from ..capture import native
from ..capture.dispatch import GroupInfo, Recorder, undecoded
from ..capture.dispatch import errors as decode_errors
from ..capture.flightlog import read_creations
from ..capture.gpu_arrivals import MAX_MARKS, GpuArrivals
from ..capture.job_context import JobContext
from ..core.axes import GROUP, axis_of
from ..core.events import CommEvent
from ..core.mesh_infer import infer
from ..core.rundir import RunDir, write_atomic
from ..core.rank_end import GroupUse, RankEnd
from . import mesh_dims
from .clock import Estimator

FLUSH_S = 0.5
"""How often the flusher thread writes new calls to the flight log."""
GPU_WAIT_S = 1.0
"""How long a rank's end waits for its GPU to pass its calls' events (`CommEvent.t_gpu`)."""
CLOCK_WAIT_S = 2.0
"""How long a rank's end waits for its clock estimate (rank 0: for the ranks still asking)."""


class RunQueue:
    """How long one thread has waited for a CPU while runnable, in seconds: the second field of Linux's
    schedstat (nanoseconds on the run queue; Documentation/scheduler/sched-stats.rst), of the thread that
    first asks (/proc/thread-self names it when opened). Read at each step's end on the job's main
    thread, through a file kept open (1.2 us a read against 15 us opening it each time, on the box), so
    that a rank made late by its host's other work is told from one late on its own (`timing.stragglers`).
    The main thread alone: summed over every thread of the rank (gloo's workers, torch's intra-op pool),
    the waits of threads that do not make the rank late held back the planted straggler of FSDP2 x TP (4
    ranks on the box's 2 CPUs) in 10 of 10 runs with its sleep in a backward hook, 2 of 10 in data
    loading. None where Linux does not tell it."""

    def __init__(self):
        self._fd: int | None = None
        self._absent = False

    def seconds(self) -> float | None:
        if self._absent:
            return None
        try:
            if self._fd is None:
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            return int(os.pread(self._fd, 128, 0).split()[1]) * 1e-9
        except (OSError, IndexError, ValueError):
            self._absent = True
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RankTrace:
    """This rank's calls as they happen: recorded as tuples (cheap; by the C++ recorder where it is
    built), turned into CommEvents and written by the flusher."""

    def __init__(self, run_dir: RunDir, rank: int, context: JobContext, stream: bool = True,
                 recorder: str = "python"):
        self.run_dir, self.rank, self.context, self.stream = run_dir, rank, context, stream
        self.native, self.recorder_note, self.kind = None, None, "python" if recorder == "native" else recorder
        self.assume = lambda index, group, op, ins, outs, t: ()
        """(the call's index in issue order, group name, op, input splits, output splits, issue time) -> the
        event's assumed fields (a fake world's: `fake.mode.FakeMode.assumed`)."""
        self.last_words = dict
        """() -> the mode's `RankEnd` fields for a rank dying of a signal in native code (`_fatal`), asked on the
        flusher's thread (a fake world's: the receive it made values up in)."""
        if recorder == "native":
            try:
                self.native = native.NativeRecorder(native.build(log=self._log), context)
            except native.NativeUnavailable as exc:
                self.recorder_note = f"the C++ recorder is unavailable ({exc}): calls were recorded by the Python kernel"
        self.t0 = time.perf_counter()
        self.wall0 = time.time()
        self.clock = Estimator(self.t0)
        """This rank's offset to the common clock, estimated once the job's default group exists (`begin_clock`)."""
        self.raw: list[tuple] = []
        self.completed: list[tuple[int, float]] = []
        """(call id, t) from the Python kernel's completion callbacks (the C++ recorder keeps its own)."""
        self.issued = 0
        """Calls recorded so far (`sink`'s)."""
        self._ids = itertools.count()
        self._by_id: dict[int, int] = {}  # call id -> index in `calls`, until it completed
        self._early: dict[int, float] = {}  # completions drained before their call's record
        self._states_written = 0  # how many of the job's states (`JobContext.states`) the flight log names
        self.gpu_ms: dict[int, float] = {}
        """Index in `calls` -> the call's time on the GPU (NCCL: `fr_dump.gpu_durations`, at the rank's end)."""
        self.gpu_at: dict[int, float] = {}
        """Index in `calls` -> when its stream reached it on the GPU (`CommEvent.t_gpu`, at the rank's end)."""
        self.gpu = None if self.native is not None else GpuArrivals()
        """The Python kernel's CUDA events of the calls (the C++ recorder keeps its own)."""
        self._call_ids: list[int] = []  # each call's id, in `calls` order
        self._queued: dict[int, float | None] = {}  # step -> its `RunQueue` reading at its end, until written
        self._run_queue = RunQueue()
        self.calls: list[list] = []
        """[group name, seq, op, phase, dtype, bytes in, bytes out, region, splits in, splits out, peer,
        step, issued, next on the group, completed] per call, in issue order (`ledger` makes them CommEvents)."""
        self.groups: dict[str, GroupInfo] = {}
        self._seq: dict[str, int] = {}
        self._open: dict[str, int] = {}  # group name -> index in `calls` of its last, unfinished call
        self._text: dict[tuple, str] = {}  # a call's JSON fields (all but time, seq, step), made once
        self._quoted: dict[str, str] = {}  # a group's name as JSON, made once (its completions' lines)
        run_dir.flight(rank).parent.mkdir(parents=True, exist_ok=True)
        self._flight = open(run_dir.flight(rank), "w", buffering=1)
        self._flight.write(json.dumps({"t": self.wall0, "kind": "start", "rank": rank}) + "\n")  # its times' origin
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()  # a byte: 0 the finish, else a fatal signal's number
        self._answer_r, self._answer_w = os.pipe()
        self._flusher = threading.Thread(target=self._flush_loop, name="meshscope-trace-flush", daemon=True)

    @staticmethod
    def _log(text: str) -> None:
        print(f"meshscope trace: {text}", file=sys.stderr, flush=True)

    @property
    def recorder(self) -> str:
        """``native``, ``python``, or ``mode``: `capture.dispatch.ModeRecorder` (fake tensors; rank.main)."""
        return "native" if self.native is not None else self.kind

    def recording(self):
        """The context manager that records this rank's calls: the C++ recorder, else the Python kernel."""
        return self.native if self.native is not None else Recorder(self.sink, self.done, self.gpu)

    def begin_clock(self, rank: int, world: int) -> None:
        """The job's default group exists: estimate this rank's offset to rank 0 through its store."""
        self.clock.begin(rank, world)

    # -- recording (hot path) ----------------------------------------------------------------------
    def sink(self, op, group, dtype, b_in, b_out, peer, ins, outs) -> int:
        ctx = self.context
        call_id = next(self._ids)
        self.issued = call_id + 1
        self.raw.append((op, group, dtype, b_in, b_out, peer, ins, outs, ctx.phase(), ctx.region(), ctx.step,
                         time.perf_counter(), call_id))
        return call_id

    def done(self, call_id: int, t: float) -> None:
        self.completed.append((call_id, t))

    def step_done(self, step: int) -> None:
        """A step boundary: every call before it has completed."""
        self._queued[step] = self._run_queue.seconds()
        if self.native is not None:
            self.native.mark(step)
        else:
            self.raw.append(("#step", step, time.perf_counter()))
            self.gpu.mark()

    # -- turning tuples into calls and flight-log lines --------------------------------------------
    # The flusher's work is paid by the job (it holds the GIL), so a call costs here one list and one
    # compact line (`capture.flightlog`'s "i" and "c" arrays); CommEvents are built once, at the end.
    def _drain(self) -> list[str]:
        """Number the new tuples per group, note their completions and the job's moves; returns the
        flight-log lines they make, in time order within each kind."""
        lines = []
        if self.native is not None:
            self.raw.extend(self.native.drain())  # its groups are named while they still exist
        new = self.raw[:]  # the hot path only appends: take what is there, leave what comes meanwhile
        del self.raw[: len(new)]
        if self.native is not None:  # after the records: a call's completion never comes before its record
            completions = self.native.completions()
        else:
            completions = self.completed[:]
            del self.completed[: len(completions)]
        native_moves = self.native.moves() if self.native is not None else None
        moves = self.context.moves[:]  # those made while the C++ recorder was not listening
        del self.context.moves[: len(moves)]
        # a compact line's time in whole microseconds after the start line's, not an epoch float's repr:
        # `capture.flightlog`'s "Times" says what that cost
        wall, t0 = self.wall0 - self.t0, self.t0
        for rec in new:
            if rec[0] == "#step":
                lines += self._complete_all(rec[2])
                lines.append(json.dumps({"t": wall + rec[2], "kind": "mark", "text": f"step {rec[1]} done",
                                         "step": rec[1], "queued": self._queued.pop(rec[1], None)}))
                continue
            op, group, dtype, b_in, b_out, peer, ins, outs, phase, region, step, t, call_id = rec
            name = group.name
            if name not in self.groups:
                self.groups[name] = group
                lines.append(json.dumps({"t": wall + t, "kind": "group", "axis": self.axis(group),
                                         "ranks": list(group.ranks), "index": len(self.groups) - 1,
                                         "name": name, "desc": group.desc}))
            if name in self._open:  # calls on one group complete in order
                lines.append(self._complete(self._open.pop(name), t))
            seq = self._seq.get(name, 0)
            self._seq[name] = seq + 1
            self._open[name] = self._by_id[call_id] = len(self.calls)
            self._call_ids.append(call_id)
            self.calls.append([name, seq, op, phase, dtype, b_in, b_out, region, ins, outs, peer, step, t, None, None])
            what = (name, op, phase, dtype, b_in, b_out, region, ins, outs, peer)
            text = self._text.get(what)
            if text is None:  # a step repeats its calls: their JSON is made once
                text = self._text[what] = json.dumps(what)[1:-1]
            lines.append(f'["i",{round((t - t0) * 1e6)},{self.rank},{seq},{step},{text}]')
        for call_id, t in (*self._early.items(), *completions):
            index = self._by_id.pop(call_id, None)
            if index is None:  # its record comes in a later drain (or was not decoded)
                self._early[call_id] = t
                continue
            self._early.pop(call_id, None)
            call = self.calls[index]
            call[-1] = t
            lines.append(f'["d",{round((t - t0) * 1e6)},{self._quote(call[0])},{call[1]}]')
        # the states numbered since the last drain, before the moves into them (taken above: each names
        # a state numbered by then), as `capture.flightlog`'s "s" lines
        states, end = self.context.states, len(self.context.states)  # it grows meanwhile: its length once
        for number in range(self._states_written, end):
            phase, module, _ = states[number]
            lines.append(json.dumps(["s", number, phase, module]))
        self._states_written = end
        # one "x" line per source, times to the microsecond; the two sources' moves interleave around the
        # C++ recorder's start and end, and a flush may take one's before the other's earlier ones: the
        # reader orders them by time (`flightlog.read_flight`)
        for first, after, numbers in (self._moves_line(moves), native_moves or (0.0, "", "")):
            if after:
                lines.append(f'["x",{round((first - t0) * 1e6)},[{after}],[{numbers}]]')
        return lines

    @staticmethod
    def _moves_line(moves: list[tuple[float, int]]) -> tuple[float, str, str]:
        """(first time, microseconds after it and state numbers, each joined by commas), as
        `NativeRecorder.moves` gives them."""
        t0 = moves[0][0] if moves else 0.0
        return (t0, ",".join([str(round((t - t0) * 1e6)) for t, _ in moves]),
                ",".join([str(n) for _, n in moves]))

    def _complete(self, index: int, t: float) -> str:
        call = self.calls[index]
        call[-2] = t
        return f'["c",{round((t - self.t0) * 1e6)},{self._quote(call[0])},{call[1]}]'

    def _quote(self, name: str) -> str:
        quoted = self._quoted.get(name)
        if quoted is None:
            quoted = self._quoted[name] = json.dumps(name)
        return quoted

    def _complete_all(self, t: float) -> list[str]:
        return [self._complete(self._open.pop(name), t) for name in list(self._open)]

    def _gpu_arrivals(self, wait_s: float) -> int:
        """Each call's arrival on the GPU into `gpu_at` (after the last drain: every call is numbered);
        returns how many calls on a GPU were left without one."""
        rows, untimed = self.native.gpu_arrivals(wait_s) if self.native is not None else self.gpu.resolve(wait_s)
        index = {call_id: i for i, call_id in enumerate(self._call_ids)}
        self.gpu_at = {index[call_id]: t for call_id, t in rows if call_id in index}
        return untimed

    def ledger(self, inferred: dict[tuple[int, ...], str]) -> list[CommEvent]:
        """Every call so far as a CommEvent, labelled with what is known now (a DeviceMesh built after a
        group's first calls names its dim late; `inferred`: the axes of groups the job named none of)."""
        out = []
        for index, (name, seq, op, phase, dtype, b_in, b_out, region, ins, outs, peer, step, t, done, end) in enumerate(
                self.calls):
            group = self.groups[name]
            out.append(CommEvent(self.rank, seq, op, self.label(group, inferred), group.ranks, phase, dtype, b_in,
                                 b_out, region, None, ins, outs, peer, step, t - self.t0,
                                 None if done is None else done - self.t0, self.assume(index, name, op, ins, outs, t),
                                 None if end is None else end - self.t0, self.gpu_ms.get(index),
                                 None if index not in self.gpu_at else self.gpu_at[index] - self.t0))
        return out

    @staticmethod
    def axis(group: GroupInfo) -> str:
        return mesh_dims.label(group.name) or axis_of(group.desc)

    def label(self, group: GroupInfo, inferred: dict[tuple[int, ...], str]) -> str:
        """The group's axis as the result names it: where it reads ``group``, the axis `inferred` gives its
        members, looked up as the assembly looks up a call's (`trace.assemble`)."""
        axis = self.axis(group)
        return inferred.get(group.ranks, GROUP) if axis == GROUP else axis

    def inferred(self) -> dict[tuple[int, ...], str]:
        """The axes of this rank's groups that the job named none of (`core.mesh_infer`), from what the
        assembly infers them from: the creations this rank recorded (``groups/rank<R>.jsonl``, every rank
        records every group, member or not: torch's new_group "requires that all processes in the main
        group enter this function", torch 2.13, distributed_c10d.py:5758) and the groups it called on.
        Where its record may hold less than rank 0's, the assembly's (groups created with members-only
        synchronisation, or outside new_group, so others' calls may be on groups this rank never saw),
        none: its calls read ``group`` and the assembly, which sees every rank's, labels them."""
        path = self.run_dir.groups(self.rank)
        creations = read_creations(path).creations if path.exists() else []
        created = [(c["desc"], c["ranks"]) for c in creations]
        called = {tuple(sorted(g.ranks)) for g in self.groups.values() if self.axis(g) == GROUP}
        if any(c["local"] for c in creations) or not called <= {tuple(members) for _, members in created}:
            return {}
        # torchrun's world, which the spec's that the assembly infers over is (`trace.__main__` reads it so)
        return infer(int(os.environ.get("WORLD_SIZE", "1")), created, called).labels

    # -- writing -----------------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        """Every `FLUSH_S` (streaming) until the finish wakes it; on a fatal signal, the rank's last words
        (`_fatal`)."""
        while True:
            woken, _, _ = select.select([self._wake_r], [], [], FLUSH_S if self.stream else None)
            if woken:
                byte = os.read(self._wake_r, 1)
                if byte and byte[0]:
                    self._fatal(byte[0])
                return
            self.flush()

    def _fatal(self, number: int) -> None:
        """The rank is dying of a signal in native code (the C++ recorder's handler waits for this): its
        calls so far, a mark naming the signal, and its end as failed, with the signal as its exit status
        (negative, as torchrun reports a worker killed by a signal)."""
        try:
            self.flush(then=[json.dumps({"t": time.time(), "kind": "mark", "text": _killed(number), "step": None})])
            self.run_dir.write_end(self._killed_end(number, steps=self.context.step, events=len(self.calls),
                                                    optimizer_steps=self.context.optimizers_seen,
                                                    **self.last_words()))
        finally:
            os.write(self._answer_w, b"\1")

    def _killed_end(self, number: int, note: str = "", **fields) -> RankEnd:
        """The end of a rank killed by signal `number` in native code, its error followed by `note`."""
        return RankEnd(self.rank, "error", exit_code=-number, error=_killed(number) + note, time=time.time(),
                       recorder=self.recorder, **fields)

    def flush(self, then: list[str] = ()) -> None:
        """Write the calls recorded since the last flush, then the lines `then`."""
        with self._lock:
            lines = self._drain() + list(then)
            if lines:
                self._flight.write("\n".join(lines) + "\n")
                self._flight.flush()

    def start(self) -> None:
        """The flusher, which also writes the calls of a rank dying of a fatal signal where the C++
        recorder watches for one; under ``--cheap`` it writes only then (the rest at the end)."""
        if self.native is not None:
            unknown = (f"; what it issued after its flight log's last flush (up to {FLUSH_S:g} s) is not known: its "
                       f"flusher could not run")
            ends = {number: json.dumps(self._killed_end(number, unknown, unflushed=True).to_json())
                    for number in self.native.FATAL}
            self.run_dir.rank_end(self.rank).parent.mkdir(parents=True, exist_ok=True)
            self.native.watch_fatal(self._wake_w, self._answer_r, str(self.run_dir.rank_end(self.rank)), ends)
        if self.stream or self.native is not None:
            self._flusher.start()

    def finish(self, status: str, code: int, failure: dict | None = None, note: str | None = None,
               record: dict | None = None) -> None:
        """Last flush, the ledger and how the rank ended (`failure`: the `RankEnd` fields of what failed;
        `record`: the mode's own, such as the CUDA calls a fake world mapped and the patches it applied)."""
        os.write(self._wake_w, b"\0")  # the flusher ends
        self._run_queue.close()
        with self._lock:
            lines = self._drain()
            if status == "ok":
                lines += self._complete_all(time.perf_counter())
            if lines:
                self._flight.write("\n".join(lines) + "\n")
            self._flight.close()
        untimed = self._gpu_arrivals(0.0 if status == "terminated" else GPU_WAIT_S)
        inferred = self.inferred()
        events = self.ledger(inferred)
        stepless = ("the script stepped no torch.optim optimizer: one step holds everything"
                    if events and not self.context.optimizers_seen and status != "error" else None)
        untimed = (f"{untimed} calls on the GPU have no arrival there (not reached within {GPU_WAIT_S:g} s of the end, "
                   f"captured into a CUDA graph, on a second device, or past {MAX_MARKS:,})" if untimed else None)
        note = "; ".join(n for n in (note, stepless, self.context.boundary_note(), untimed, self.recorder_note) if n)
        self.run_dir.ledger(self.rank).parent.mkdir(exist_ok=True)
        write_atomic(self.run_dir.ledger(self.rank), "".join(json.dumps(e.to_json()) + "\n" for e in events))
        self.run_dir.write_end(RankEnd(
            self.rank, status, steps=self.context.step, exit_code=code, note=note, **(record or {}),
            events=len(events), optimizer_steps=self.context.optimizers_seen,
            groups=tuple(GroupUse(g.name, g.desc, self.label(g, inferred), g.ranks) for g in self.groups.values()),
            decode_errors=tuple(decode_errors[:10]), undecoded=dict(undecoded), time=time.time(), recorder=self.recorder,
            clock=self.clock.result(wait=0.0 if status == "terminated" else CLOCK_WAIT_S), **(failure or {})))


def _killed(number: int) -> str:
    return f"killed by {signal.Signals(number).name} (signal {number}) in native code"


def flushed_first(trace: RankTrace, destroy):
    """``destroy_process_group`` that first takes in the calls recorded so far: the C++ recorder's
    calls name their group, which must still exist to be resolved."""
    def destroy_process_group(*args, **kwargs):
        trace.flush()
        return destroy(*args, **kwargs)
    return destroy_process_group
