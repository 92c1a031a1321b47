"""How a traced rank stops early: ``--steps K`` (every rank ends cleanly once all finished K steps,
met in the job's own store), and SIGTERM from the launcher while it is blocked in a collective."""

from __future__ import annotations

import os
import signal
import threading
import time

from ..core.rank_end import exit_code
from .recording import RankTrace

class StopTrace(BaseException):
    """Raised at a step boundary once every rank finished ``--steps`` steps: ends the script cleanly.
    A BaseException, so that the script's own ``except Exception`` does not swallow it."""


STEPS_DONE = "meshscope/trace/steps_done"
"""Store key every rank adds 1 to when it reached its K-th step, or ended before it."""


def stop_when_all_done(trace: RankTrace, steps: int, alone: bool = False, wait_s: float | None = None):
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


def stop_on_sigterm(stop) -> None:
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
