"""One rank of a traced job: the user's script, unmodified, with the trace installed before line 1.

``python -m meshscope.trace.rank RUN_DIR [options] -- SCRIPT [ARGS]`` (or ``-- -m MODULE [ARGS]``;
`options.RankOptions`) is what torchrun starts for every rank under ``meshscope trace``, and what the
fork server runs in every rank of a fake world; ``torchrun ... -m meshscope.trace SCRIPT [ARGS]``
runs the same inside a launch the user already has. Read top to bottom, it

1. picks the rank's mode once (`mode.RealMode`, or `fake.mode.FakeMode` for a fake world) and keeps
   what the rank prints (`mode.start`);
2. sets up the recording (`recording.RankTrace`: the dispatcher recorder, the flusher) and the
   step/phase/module context (`capture.job_context`), notes every group creation as it happens
   (`created`), lets the mode install itself (a real rank: Flight Recorder, SIGTERM; a fake one: the
   fake backend and what else `fake.patches` lists), limits collective timeouts (`timeouts`) and
   labels DeviceMesh groups (`mesh_dims`);
3. runs the script as ``__main__`` with its own ``sys.argv``;
4. with ``--steps K``, once every rank has finished K steps, ends the rank cleanly, skipping the rest
   of the script (`stopping`);
5. records how the rank ended (`core.rank_end.RankEnd`: its exit code, the script's error with
   the script's file and line) and its ledger, then exits with the status the script would have.

A script that raises gets its own traceback printed (without meshscope's frames) and the rank exits
1, as it would have without the trace. When the launcher stops the rank (SIGTERM: another rank
failed) it writes what it has and exits at once, even while blocked in a collective.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
import threading
from pathlib import Path

from ..capture.job_context import JobContext
from ..core.rundir import RunDir
from ..core.rank_end import exit_code
from . import script_frames
from .created import note_creations
from .entry_points import index_new_modules, wrap
from .fake.mode import FakeMode
from .mesh_dims import label_device_meshes
from .mode import RealMode
from .options import RankOptions
from .recording import RankTrace, flushed_first
from .stopping import StopTrace, stop_when_all_done
from .timeouts import limit_timeouts


def _failure(exc: BaseException, error: str) -> dict:
    """The `RankEnd` fields of a failure: the error line, the exception, where it was raised and meshscope's
    own frame if meshscope failed there."""
    where, origin, ours = script_frames.raised_at(exc)
    return {"error": error, "exception": type(exc).__name__, "where": where, "origin": origin, "meshscope_frame": ours}


def prefork() -> None:
    """What every rank does first, done once by a warm process before it forks ranks or their launchers
    (`run.zygote`, `run.agent`): the index of the loaded modules' functions that the trace's patches rebind
    through (`entry_points.rebind`), which each forked rank had built again (28 CPU-s of a test suite's
    ranks, and 34 of its fake worlds' servers, in py-spy's samples, 2026-12-07)."""
    index_new_modules()


def main(argv: list[str], on_end=None) -> int:
    """Run the traced script as this rank; `on_end` runs after its ledger is written."""
    options = RankOptions.from_argv(argv)
    rank = int(os.environ.get("RANK", "0"))
    run_dir = RunDir(options.run_dir)
    mode = (FakeMode if options.fake else RealMode)(options, run_dir, rank)
    mode.start()
    context = JobContext(options.step_optimizer, modules=not options.cheap)
    trace = RankTrace(run_dir, rank, context, stream=not options.cheap, recorder=mode.recorder)
    ending, written = threading.Lock(), threading.Event()  # the rank's end is written once, by either path

    def stopped() -> None:
        with ending:  # a rank writing its own end finishes that first
            if not written.is_set():
                trace.finish("terminated", 128 + signal.SIGTERM, {"error": "SIGTERM from outside (another rank "
                             "failed, the watchdog stopped the job, or it was interrupted)"}, record=mode.record())
                mode.failed()
                written.set()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)  # also from the script's exit handlers: the launcher wants it gone

    note_creations(run_dir, rank)  # first: the wrappers below see torch's own new_group signature
    mode.install(trace, stopped)
    context.on_step = (stop_when_all_done(trace, options.steps, alone=mode.alone, wait_s=options.timeout)
                       if options.steps else trace.step_done)
    if options.timeout:
        limit_timeouts(options.timeout)
    sys.argv = options.script_argv
    target = sys.argv[0]
    if not options.module:
        sys.path.insert(0, str(Path(target).resolve().parent))  # as `python SCRIPT` puts the script's folder first
    context.install()
    label_device_meshes()
    wrap("destroy_process_group", lambda original: flushed_first(trace, original))
    trace.start()
    status, failure, code, note = "ok", None, 0, None
    try:
        with mode.recording(trace):
            if options.module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
    except StopTrace:
        status = "stopped"
    except SystemExit as exc:
        code = exit_code(exc)
        if code:
            status, failure = "error", _failure(exc, f"the script exited: {exc.code}" if isinstance(exc.code, str)
                                                else f"the script exited with code {exc.code}")
    except BaseException as exc:  # noqa: BLE001 - the script's failure is reported as the script's
        sys.stderr.write(script_frames.script_traceback(exc))
        error, note, cause = mode.explain(exc)
        status, code = "error", 1
        failure = _failure(cause, error or f"{type(cause).__name__}: {cause}".splitlines()[0])
    finally:
        context.remove()
        mode.ended(status == "stopped")
    with ending:
        trace.finish(status, code, failure, note, record=mode.record())
        if status == "error":
            mode.failed()
        written.set()
    if on_end is not None:
        on_end()
    if status != "stopped":
        atexit._run_exitfuncs()  # the script's own exit handlers run as they would have; --steps skips them
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    # Skip the interpreter's teardown: gloo's C++ threads have been seen to abort ("terminate called
    # without an active exception") in static destructors of a process that did not destroy its
    # process group, which would turn a clean job into a failed rank.
    os._exit(main(sys.argv[1:]))
