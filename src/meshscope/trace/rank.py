"""One rank of a traced job: the user's script, unmodified, with the trace installed before line 1.

``python -m meshscope.trace.rank RUN_DIR [options] -- SCRIPT [ARGS]`` (or ``-- -m MODULE [ARGS]``)
is what torchrun starts for every rank under ``meshscope trace``; ``torchrun ... -m meshscope.trace
SCRIPT [ARGS]`` runs the same inside a launch the user already has. It

1. installs the dispatcher recorder (`capture.dispatch`) and the step/phase/module context
   (`capture.job_context`), and wraps ``init_process_group`` / ``new_group`` so that, with
   ``--timeout``, every collective of the job gives up after that many seconds (a script that
   computes quietly for longer is never stopped: only a waiting collective times out);
2. runs the script as ``__main__`` with its own ``sys.argv``;
3. streams every call to ``flight/rank<R>.jsonl`` (group, issued, completed and step lines; a flusher
   thread writes twice a second, so a killed rank still leaves all but its last half second), and at
   the end writes ``ledgers/rank<R>.jsonl`` (every event with its step) and ``ranks/rank<R>.json``
   (how the rank ended);
4. with ``--steps K``, once every rank has finished K steps (counted in the job's own store), ends
   the rank cleanly, skipping the rest of the script;
5. notes every group creation as it happens (`created`), and with ``--flight-recorder`` turns torch's
   Flight Recorder on and dumps it into ``fr/`` when the rank fails or is stopped (`fr_dump`);
6. when the launcher stops the rank (SIGTERM: another rank failed), writes what it has (flight log,
   ``ranks/rank<R>.json``, the recorder's dump) and exits at once, even while blocked in a
   collective: a thread waits for the signal, which every other thread blocks.

A script that raises gets its own traceback printed (without meshscope's frames) and the rank exits
1, as it would have without the trace.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

from ..capture import native
from ..capture.dispatch import GroupInfo, Recorder
from ..capture.dispatch import errors as decode_errors
from ..capture.job_context import JobContext
from ..core.axes import axis_of
from ..core.events import CommEvent
from ..core.rundir import RunDir, write_atomic
from ..core.trace_result import GroupUse, RankEnd, exit_code
from . import device_map, fake, fake_tensors, fr_dump, mesh_dims, script_frames
from .created import note_creations
from .entry_points import wrap
from .output import tee

FLUSH_S = 0.5
"""How often the flusher thread writes new calls to the flight log."""


RECORDER_ENV = "MESHSCOPE_RECORDER"
"""The default of ``--recorder`` for ``torchrun -m meshscope.trace``: ``native`` (the C++ recorder,
`capture.native`, built by the first rank that needs it) or ``python`` (the Python kernel)."""


class RankTrace:
    """This rank's calls as they happen: recorded as tuples (cheap; by the C++ recorder where it is
    built), turned into CommEvents and written by the flusher."""

    def __init__(self, run_dir: RunDir, rank: int, context: JobContext, stream: bool = True,
                 recorder: str = "python"):
        self.run_dir, self.rank, self.context, self.stream = run_dir, rank, context, stream
        self.native, self.recorder_note, self.kind = None, None, "python" if recorder == "native" else recorder
        self.assume = lambda op, ins, outs: ()
        """(op, input splits, output splits) -> the event's assumed fields (`fake.assumed` in a fake world)."""
        if recorder == "native":
            try:
                self.native = native.NativeRecorder(native.build(log=self._log), context)
            except native.NativeUnavailable as exc:
                self.recorder_note = f"the C++ recorder is unavailable ({exc}): calls were recorded by the Python kernel"
        self.t0 = time.perf_counter()
        self.wall0 = time.time()
        self.raw: list[tuple] = []
        self.calls: list[list] = []
        """[group name, seq, op, phase, dtype, bytes in, bytes out, region, splits in, splits out, peer,
        step, issued, completed] per call, in issue order (`ledger` makes them CommEvents)."""
        self.groups: dict[str, GroupInfo] = {}
        self._seq: dict[str, int] = {}
        self._open: dict[str, int] = {}  # group name -> index in `calls` of its last, unfinished call
        self._text: dict[tuple, str] = {}  # a call's JSON fields (all but time, seq, step), made once
        run_dir.flight(rank).parent.mkdir(parents=True, exist_ok=True)
        self._flight = open(run_dir.flight(rank), "w", buffering=1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
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
        return self.native if self.native is not None else Recorder(self.sink)

    # -- recording (hot path) ----------------------------------------------------------------------
    def sink(self, op, group, dtype, b_in, b_out, peer, ins, outs) -> None:
        ctx = self.context
        self.raw.append((op, group, dtype, b_in, b_out, peer, ins, outs, ctx.phase(), ctx.region(), ctx.step,
                         time.perf_counter()))

    def step_done(self, step: int) -> None:
        """A step boundary: every call before it has completed."""
        if self.native is not None:
            self.native.mark(step)
        else:
            self.raw.append(("#step", step, time.perf_counter()))

    # -- turning tuples into calls and flight-log lines --------------------------------------------
    # The flusher's work is paid by the job (it holds the GIL), so a call costs here one list and one
    # compact line (`capture.flightlog`'s "i" and "c" arrays); CommEvents are built once, at the end.
    def _drain(self) -> list[str]:
        """Number the new tuples per group; returns the flight-log lines they make."""
        lines = []
        if self.native is not None:
            self.pull()
        new = self.raw[:]  # the hot path only appends: take what is there, leave what comes meanwhile
        del self.raw[: len(new)]
        wall = self.wall0 - self.t0
        for rec in new:
            if rec[0] == "#step":
                lines += self._complete_all(rec[2])
                lines.append(json.dumps({"t": wall + rec[2], "kind": "mark", "text": f"step {rec[1]} done"}))
                continue
            op, group, dtype, b_in, b_out, peer, ins, outs, phase, region, step, t = rec
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
            self._open[name] = len(self.calls)
            self.calls.append([name, seq, op, phase, dtype, b_in, b_out, region, ins, outs, peer, step, t, None])
            what = (name, op, phase, dtype, b_in, b_out, region, ins, outs, peer)
            text = self._text.get(what)
            if text is None:  # a step repeats its calls: their JSON is made once
                text = self._text[what] = json.dumps(what)[1:-1]
            lines.append(f'["i",{wall + t!r},{self.rank},{seq},{step},{text}]')
        return lines

    def pull(self) -> None:
        """Move the C++ recorder's calls into `raw` (their groups are named while they still exist)."""
        self.raw.extend(self.native.drain())

    def _complete(self, index: int, t: float) -> str:
        call = self.calls[index]
        call[-1] = t
        return f'["c",{self.wall0 - self.t0 + t!r},{json.dumps(call[0])},{call[1]}]'

    def _complete_all(self, t: float) -> list[str]:
        return [self._complete(self._open.pop(name), t) for name in list(self._open)]

    def ledger(self) -> list[CommEvent]:
        """Every call so far as a CommEvent, labelled with what is known now (a DeviceMesh built after a
        group's first calls names its dim late)."""
        out = []
        for name, seq, op, phase, dtype, b_in, b_out, region, ins, outs, peer, step, t, done in self.calls:
            group = self.groups[name]
            out.append(CommEvent(self.rank, seq, op, self.axis(group), group.ranks, phase, dtype, b_in, b_out, region,
                                 None, ins, outs, peer, step, t - self.t0, None if done is None else done - self.t0,
                                 self.assume(op, ins, outs)))
        return out

    @staticmethod
    def axis(group: GroupInfo) -> str:
        return mesh_dims.label(group.name) or axis_of(group.desc)

    # -- writing -----------------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            lines = self._drain()
            if lines:
                self._flight.write("\n".join(lines) + "\n")
                self._flight.flush()

    def start(self) -> None:
        if self.stream:  # --cheap writes everything at the end instead
            self._flusher.start()

    def finish(self, status: str, code: int, failure: dict | None = None, note: str | None = None, mapped=()) -> None:
        """Last flush, the ledger and how the rank ended (`failure`: the `RankEnd` fields of what failed;
        `mapped`: the CUDA calls `device_map` mapped, which the result names once for all ranks)."""
        self._stop.set()
        with self._lock:
            lines = self._drain()
            if status == "ok":
                lines += self._complete_all(time.perf_counter())
            if lines:
                self._flight.write("\n".join(lines) + "\n")
            self._flight.close()
        events = self.ledger()
        stepless = ("the script stepped no torch.optim optimizer: one step holds everything"
                    if events and not self.context.optimizers_seen and status != "error" else None)
        note = "; ".join(n for n in (note, stepless, self.recorder_note) if n)
        self.run_dir.ledger(self.rank).parent.mkdir(exist_ok=True)
        write_atomic(self.run_dir.ledger(self.rank), "".join(json.dumps(e.to_json()) + "\n" for e in events))
        self.run_dir.write_end(RankEnd(
            self.rank, status, steps=self.context.step, exit_code=code, note=note, mapped=tuple(mapped),
            events=len(events), optimizer_steps=self.context.optimizers_seen,
            groups=tuple(GroupUse(g.name, g.desc, self.axis(g), g.ranks) for g in self.groups.values()),
            decode_errors=tuple(decode_errors[:10]), time=time.time(), recorder=self.recorder, **(failure or {})))


def _flushed_first(trace: RankTrace, destroy):
    """``destroy_process_group`` that first takes in the calls recorded so far: the C++ recorder's
    calls name their group, which must still exist to be resolved."""
    def destroy_process_group(*args, **kwargs):
        trace.flush()
        return destroy(*args, **kwargs)
    return destroy_process_group


class StopTrace(BaseException):
    """Raised at a step boundary once every rank finished ``--steps`` steps: ends the script cleanly.
    A BaseException, so that the script's own ``except Exception`` does not swallow it."""


def _limit_timeouts(seconds: float) -> None:
    """Every process group the job creates waits at most `seconds` in a collective (`entry_points.wrap`:
    DeviceMesh's bindings too)."""
    import inspect

    limit = timedelta(seconds=seconds)

    def limited(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs)  # a timeout given by position too
            bound.arguments["timeout"] = min(bound.arguments.get("timeout") or limit, limit)
            return original(*bound.args, **bound.kwargs)
        return wrapped

    for name in ("init_process_group", "new_group", "split_group"):
        wrap(name, limited)


STEPS_DONE = "meshscope/trace/steps_done"
"""Store key every rank adds 1 to when it reached its K-th step, or ended before it."""


def _stop_when_all_done(trace: RankTrace, steps: int, alone: bool = False, wait_s: float | None = None):
    """The `JobContext.on_step` that ends the job once every rank has finished `steps` steps (`alone`:
    a fake world's rank, which has no peer to wait for). A rank whose script ends first counts as done
    (`count_done`); with ``--timeout`` the wait gives up after that long."""
    def on_step(step: int) -> None:
        trace.step_done(step)
        if step < steps:
            return
        if alone:
            raise StopTrace
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        world, deadline = dist.get_world_size(), time.monotonic() + (wait_s or float("inf"))
        store.add(STEPS_DONE, 1)
        while store.add(STEPS_DONE, 0) < world and time.monotonic() < deadline:  # every rank reached its K-th step
            time.sleep(0.01)
        raise StopTrace

    return on_step


def count_done() -> None:
    """A rank whose script ended before ``--steps`` steps: let the ranks waiting for it go."""
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized():
            dist.distributed_c10d._get_default_store().add(STEPS_DONE, 1)
    except (RuntimeError, ValueError):  # its process group is gone: nobody can be waiting in it
        pass


def _stop_on_sigterm(stop) -> None:
    """Run `stop` as soon as the launcher sends SIGTERM. Python runs signal handlers only on the main
    thread between bytecodes, so a rank blocked in a collective would not see the signal until its
    timeout; instead SIGTERM is blocked here (every thread started later inherits that) and one thread
    waits for it. A script that installed its own SIGTERM handler (a preemption checkpoint) gets it
    called from that thread instead, and ends the rank itself."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        while True:
            signal.sigwait({signal.SIGTERM})
            handler = signal.getsignal(signal.SIGTERM)
            if not callable(handler):
                stop()
                return
            try:
                handler(signal.SIGTERM, None)
            except SystemExit as exc:
                os._exit(exit_code(exc))

    threading.Thread(target=wait, name="meshscope-trace-stop", daemon=True).start()


def _script_file(module: str) -> str:
    """The file of a ``-m`` module (its name when it has none)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return module
    return spec.origin if spec is not None and spec.origin else module


def parse(argv: list[str]) -> argparse.Namespace:
    if "--" not in argv:
        raise SystemExit("meshscope trace: missing '--' before the script")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="meshscope.trace.rank")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--step-optimizer", default=None)
    p.add_argument("--fake", action="store_true", help="a rank of a fake world (trace.fake)")
    p.add_argument("--cheap", action="store_true", help="no module hooks, no streamed flight log")
    p.add_argument("--fake-tensors", action="store_true", help="with --fake: tensors without data (trace.fake_tensors)")
    p.add_argument("--recorder", choices=("native", "python"), default=os.environ.get(RECORDER_ENV, "native"),
                   help="the C++ recorder (built once per torch) or the Python kernel")
    p.add_argument("--flight-recorder", action="store_true", help="torch's Flight Recorder on, dumped into fr/")
    args = p.parse_args(argv[:cut])
    args.target = argv[cut + 1:]
    return args


def main(argv: list[str], on_end=None) -> int:
    """Run the traced script as this rank; `on_end` runs after its ledger is written."""
    args = parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    run_dir = RunDir(args.run_dir)
    if not args.fake:  # a fake world's ranks write their log themselves (fork_server)
        tee(run_dir.log(rank))
    context = JobContext(args.step_optimizer, modules=not args.cheap)
    trace = RankTrace(run_dir, rank, context, stream=not args.cheap,
                      recorder="mode" if args.fake_tensors else args.recorder)
    if args.flight_recorder and not args.fake:
        fr_dump.enable(run_dir)
    ending, written = threading.Lock(), threading.Event()  # the rank's end is written once, by either path

    def stopped() -> None:
        with ending:  # a rank writing its own end finishes that first
            if not written.is_set():
                trace.finish("terminated", 128 + signal.SIGTERM, {"error": "SIGTERM from outside (another rank "
                             "failed, the watchdog stopped the job, or it was interrupted)"})
                if args.flight_recorder:
                    fr_dump.dump(run_dir, rank)
                written.set()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)  # also from the script's exit handlers: the launcher wants it gone

    note_creations(run_dir, rank)  # first: the wrappers below see torch's own new_group signature
    if args.fake:
        fake.use_fake_backend()
        device_map.install()
        trace.assume = fake.assumed
    else:
        _stop_on_sigterm(stopped)
    context.on_step = (_stop_when_all_done(trace, args.steps, alone=args.fake, wait_s=args.timeout) if args.steps
                       else trace.step_done)
    if args.timeout:
        _limit_timeouts(args.timeout)
    module = args.target[0] == "-m"
    target = args.target[1] if module else args.target[0]
    sys.argv = [target, *args.target[2 if module else 1:]]
    if not module:
        sys.path.insert(0, str(Path(target).resolve().parent))  # as `python SCRIPT` puts the script's folder first
    context.install()
    mesh_dims.label_device_meshes()
    wrap("destroy_process_group", lambda original: _flushed_first(trace, original))
    trace.start()
    status, failure, code, note = "ok", None, 0, None
    try:
        with fake_tensors.shapes_only(trace.sink) if args.fake_tensors else trace.recording():
            if module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
    except StopTrace:
        status = "stopped"
    except SystemExit as exc:
        code = exit_code(exc)
        if code:
            where, origin = script_frames.raised_at(exc)
            status, failure = "error", {"error": (f"the script exited: {exc.code}" if isinstance(exc.code, str)
                                                  else f"the script exited with code {exc.code}"),
                                        "exception": "SystemExit", "where": where, "origin": origin}
    except BaseException as exc:  # noqa: BLE001 - the script's failure is reported as the script's
        sys.stderr.write(script_frames.script_traceback(exc))
        where, origin = script_frames.raised_at(exc)
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if args.fake_tensors:
            error = fake_tensors.value_read(exc, _script_file(target) if module else target) or error
        status, code = "error", 1
        failure = {"error": error, "exception": type(exc).__name__, "where": where, "origin": origin}
        if args.fake and ("recv_object_list" in "".join(traceback.format_tb(exc.__traceback__))
                          or type(exc).__name__ == "PipeliningMetadataError"):
            note = ("the script's pipeline stages exchange their shapes over P2P (recv_object_list), which a fake "
                    "world cannot deliver (it also takes every stage's warm-up vote as 'static shapes'): give every "
                    "PipelineStage static shapes (input_args and output_args)")
    finally:
        context.remove()
        if args.steps and status != "stopped" and not args.fake:
            count_done()
    with ending:
        trace.finish(status, code, failure, note, mapped=device_map.used)
        if status == "error" and args.flight_recorder and not args.fake:  # gloo dumps nothing on its own timeout
            fr_dump.dump(run_dir, rank)
        written.set()
    if on_end is not None:
        on_end()
    if status != "stopped":
        atexit._run_exitfuncs()  # the script's own exit handlers run as they would have; --steps skips them
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: gloo's C++ threads have been seen to abort ("terminate called
    # without an active exception") in static destructors of a process that did not destroy its
    # process group, which would turn a clean job into a failed rank.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
