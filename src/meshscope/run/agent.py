"""torchrun with its ranks forked from one process that imported torch once.

`launch` starts ``python -m meshscope.run.agent TORCHRUN_FLAGS -m PROGRAM ARGS`` where it would start
``python -m torch.distributed.run``: the same argument parser and the same elastic agent
(``torch.distributed.run.run``: rendezvous, ``--standalone``'s free port, one failed rank stopping the
others), told to run the program as a function in processes it forks (torchrun's own ``--run-path``
with ``--start-method fork``). Before the agent starts, this process imports torch's parallel APIs
(`PRELOAD`) and the rank program, so a rank starts with them imported: a fresh rank process paid
Python's and torch's import, ``torch._dynamo`` (imported by DDP's constructor, pipelining and
torch.compile) and the rank program: about 5 s of CPU per rank on a 2-core EPYC. A 2-rank
``meshscope trace -- tests/jobs/ddp.py --steps 4`` took 12.9 s of CPU (9.4 s wall) with fresh rank
processes and 5.5 s (6.3 s wall) forked (``/usr/bin/time``, idle box, 2026-12-03); ``.ci/run`` on a
fresh clone went from 794 s of tests (1,616 s of CPU with the install) to 597 s (1,217 s).

A forked rank starts as a fresh interpreter would in what it can see: the agent's signal handlers
(torch's ``_terminate_process_handler``, which raises in the agent) and exit handlers are dropped,
and NumPy's global generator is seeded again from the system, as ``random`` reseeds itself in a forked
child (``os.register_at_fork``) and NumPy does not. ``PYTHONHASHSEED``-dependent orders are the same on
every rank, not drawn per rank. The program is a module with ``main(argv) -> int`` that returns instead of exiting: torch's
multiprocessing agent takes a returned value as success and waits for one from every rank, so a rank
that succeeded leaves through the value (and then ``os._exit``, skipping the interpreter's teardown
as a rank process does); one that failed leaves with its code.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time

PRELOAD = ("torch", "torch.distributed", "torch.distributed.device_mesh", "torch.distributed.tensor",
           "torch.distributed.tensor.parallel", "torch.distributed.fsdp", "torch.distributed.pipelining",
           "torch.nn.parallel", "torch._dynamo")
"""What ranks import before their program's first line: torch's parallel APIs (also the fake world's
fork server's start, `trace.fake.fork_server`)."""


def as_fresh_interpreter() -> None:
    """In a child forked from a warm process: what a fresh interpreter would have that the fork did not
    give (also each rank of a fake world, `trace.fake.fork_server`)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):  # as Python starts
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""While set to 1, ``torch.cuda.is_available()`` asks NVML instead of initialising CUDA's driver, which
makes every later fork unable to use CUDA (torch/cuda/__init__.py, torch 2.4 to 2.15)."""
_user_nvml_check: str | None = None
"""The user's own `NVML_CHECK`, which a rank gets back."""


def _fork_poisoned() -> bool:
    """Whether a rank forked now could not use CUDA: torch marks a child "in bad fork" once the parent has
    initialised CUDA's driver (torch/csrc/cuda/Module.cpp, ``poison_fork``); a probe child says."""
    import torch

    if not torch.cuda._is_compiled():
        return False
    if torch.cuda.is_initialized():
        return True
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch._C._cuda_isInBadFork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0


def _restore(value: str | None) -> None:
    if value is None:
        os.environ.pop(NVML_CHECK, None)
    else:
        os.environ[NVML_CHECK] = value


def before_forks(module) -> None:
    """A program a warm process forks may define ``prefork()``: what each of its processes would do first
    that does not depend on which one it is, done here once (`trace.rank.prefork`)."""
    hook = getattr(module, "prefork", None)
    if hook is not None:
        hook()


def _method_name(depth: int = 2) -> str:
    """torch's ``dynamic_rendezvous.get_method_name`` (the name of the function `depth` frames up, for the
    rendezvous' event log) without its two ``inspect.stack()`` calls, which read the source of every frame on
    the stack: an event costs microseconds instead of milliseconds, and agents forked from a process that
    imported two thousand modules had spent 69 of a test suite's 1,106 sampled CPU-seconds on them (py-spy,
    2026-12-07)."""
    try:
        return sys._getframe(depth).f_code.co_name  # (frame 0 is this function, as inspect.stack()[0] was)
    except ValueError:  # a stack less deep
        return "no_method_name"


_arrived = None
"""A semaphore the forked ranks count their arrivals on (`_after_every_fork`), made before the first fork."""
SIBLINGS_S = 120.0
"""How long a forked rank waits for its node's other ranks to be forked, at most."""


def _after_every_fork() -> None:
    """Hold this rank until the agent has forked every rank of its node: a rank forked while another thread
    of the agent held a C library lock starts with that lock held, for ever. The agent's rendezvous store runs
    a thread (``LibUVStoreDaemon``, torch 2.13) that names each new client by a reverse lookup
    (``formatSockAddr``: ``getnameinfo``, under glibc's resolver lock); the ranks forked first connect while
    the agent forks the rest, and a rank forked in that window waited in ``getaddrinfo`` on its first
    connection until the launcher's watchdog stopped the run (gdb and py-spy on the project's 2-core box,
    2026-12-07: 3 of 66 runs of tests/test_doctor.py's nine injected faults beside busy loops, and one CI run;
    0 of 30 with this hold). Once every rank of the node has arrived here, the agent forks no more."""
    _arrived.release()
    # each restart forks the node's ranks again, on the same count (torch's elastic agent sets both)
    expected = int(os.environ["LOCAL_WORLD_SIZE"]) * (1 + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    deadline = time.monotonic() + SIBLINGS_S
    while _arrived.get_value() < expected and time.monotonic() < deadline:
        time.sleep(0.001)


def _rank(program: str, *argv: str) -> None:
    """One rank, in a process the elastic agent forked: `program`'s ``main(argv)``."""
    as_fresh_interpreter()
    _after_every_fork()
    _restore(_user_nvml_check)
    code = importlib.import_module(program).main(list(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)
    # torch's multiprocessing wrapper hands the returned None to the agent, waits until every rank
    # has, then returns into multiprocessing's exit, which joins the script's threads: leave there
    # instead, as a rank process leaves through os._exit (a stopped script's threads never end)
    threading._register_atexit(lambda: os._exit(0))


def main(argv: list[str]) -> int:
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    if not args.module:
        print(f"meshscope.run.agent runs a module (-m PROGRAM), not {args.training_script!r}", file=sys.stderr)
        return 2
    global _user_nvml_check
    _user_nvml_check = os.environ.get(NVML_CHECK)
    # an import that asks whether CUDA is available must not make the forks unable to use it (on the
    # H200 every forked rank failed "Cannot re-initialize CUDA in forked subprocess"; which import asked
    # is what benchmarks/check_fork_cuda.py prints there)
    os.environ[NVML_CHECK] = "1"
    for name in PRELOAD:
        importlib.import_module(name)
    before_forks(importlib.import_module(args.training_script))
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    if hasattr(dynamic_rendezvous, "get_method_name"):  # (torch 2.4 to 2.15: called by name at each event)
        dynamic_rendezvous.get_method_name = _method_name
    if _fork_poisoned():  # torchrun as it is: each rank a fresh ``python -m PROGRAM``
        print("meshscope: CUDA was initialised while torch's parallel APIs were imported, so the ranks "
              "start as fresh processes (a few seconds each), not forked", file=sys.stderr)
        _restore(_user_nvml_check)
    else:
        # what was imported stays out of the ranks' garbage collections: a collection that walks it
        # would write every page of it (reference counts, GC links), copying what the ranks share, and
        # take longer (Python's gc.freeze, for a parent that forks without exec)
        gc.freeze()
        global _arrived
        _arrived = multiprocessing.get_context("fork").Semaphore(0)
        args.run_path, args.start_method = True, "fork"
        # torchrun's --run-path calls this module-level function with the program and its arguments
        # (torch/distributed/run.py, config_from_args, torch 2.4 to 2.15)
        torchrun.run_script_path = _rank
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without torch's teardown: the ranks are done and the launcher waits for this exit
