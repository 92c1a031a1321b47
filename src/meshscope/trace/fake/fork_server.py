"""A fake world's ranks forked from one process that imported torch once.

Each rank class of a fake world is one process, and a fresh process pays Python and torch's import
(1.2 s on a 2-core EPYC), FakeTensorMode's Dynamo (1.7 s) and the script's own library imports
(torch's test models: 1.4 s; Megatron-core: 912 modules) before the script's first line: at 9 to 54
classes, most of the wall time. So `meshscope trace --fake-world` starts one server (``python -m meshscope.trace.fake.fork_server``)
that imports torch, its parallel APIs and meshscope's rank program once and forks every rank from
that state (`trace.rank.main` runs in the child, as it would in a fresh process).

Each forked rank also lists the library modules its script imported (`_write_imports`), up to the first
module of the script's own (after which a library may see what the script did); before it forks the next
ranks (with ``--ranks auto``, as soon as each first rank ends) the server imports them too, so later
ranks skip the script's imports. A probe child imports each a module ahead of the server:
the server imports those before the first whose import starts a thread (which a forked rank would
lack), says which one in ``logs/fork_server.log``, and the ranks import it and the rest themselves.
The server has installed the rank-independent part of a rank's set-up first (the fake backend and
the CUDA mapping, which a rank then finds in place), so such a module computes at import what it
computed in the first ranks; the trace's later patches of torch (`entry_points.rebind`) reach names
it bound. What differs: a module that reads the rank's environment (``RANK``) when it is imported
reads the server's, which has none, and under ``--fake-tensors`` a tensor it makes at import is real.

Each forked rank first takes its own layer over the working directory (`files.isolate`), so what it
writes there no rank started after it, nor the one running beside it, sees; the server tries that once
in a child of its own (`files.probe`) and, where the system refuses it, the ranks share their files
and say why.

Protocol, one JSON object per line on a descriptor of its own (the server's stdout goes to its log):
the caller writes ``{"run": [ranks], "parallel": P}`` on the server's stdin and reads ``{"done":
rank, "code": exit code}`` for each rank, P at a time. A forked rank's environment is
`environment` of its rank, its output goes to ``logs/rank<R>.log``. The server and every rank
die with their parent (``PR_SET_PDEATHSIG``): a trace that is killed leaves nothing running.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys

from ...core.errors import UsageError
from ...core.rundir import RunDir, write_atomic
from ...capture.native_build import NAME as NATIVE_RECORDER
from ...core.rank_end import exit_code
from ...run import agent, zygote
from ..options import RankOptions
from ..script_frames import LIBRARY_ROOTS, is_library
from . import files

PRELOAD = (*agent.PRELOAD, "torch.testing._internal.distributed.fake_pg", "meshscope.trace.rank")
"""What every rank imports before its script: torch's parallel APIs (as a real trace's ranks,
`run.agent`), the fake process group and the rank program."""


class ServerFailed(RuntimeError):
    """The fork server died; the message is the last line of its log."""


class ForkServer:
    """The caller's side: start the server, run ranks through it, stop it."""

    def __init__(self, run_dir: RunDir, options: RankOptions, world: int, per_node: int):
        if not hasattr(os, "fork"):
            raise UsageError("--fake-world forks its ranks (os.fork), which this platform lacks: run it on Linux")
        self.log_path = run_dir.fork_server_log
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read, self._replies_fd = os.pipe()
        # No thread before a fork: no OpenMP pool, and no background purge thread of pyarrow's jemalloc,
        # which pandas' import starts (``jemalloc_bg_thd``, pyarrow 26.0.1 beside torchtitan 0.2.2); without
        # it the server learns the modules after pandas too.
        env = {"JE_ARROW_MALLOC_CONF": "background_thread:false", **os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1"}
        if options.measure_on == "cuda":
            # ranks that run on the GPU are forked from here: torch.cuda's queries must not start CUDA in the
            # server (a child of a process that did cannot use it; torch 2.13 cuda/__init__.py, is_available)
            env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        args = [sys.executable, "-m", "meshscope.trace.fake.fork_server", str(run_dir.path), str(world), str(per_node),
                str(self._replies_fd), *options.to_argv()]
        try:
            with open(self.log_path, "w") as log:
                self.proc = zygote.start(args, stdin=subprocess.PIPE, stdout=log, stderr=log, text=True,
                                         env=env, pass_fds=(self._replies_fd,), start_new_session=True)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(self._replies_fd)  # the server holds the write end now
        self._replies = os.fdopen(read)

    def run(self, ranks: list[int], parallel: int, more: bool = False) -> dict[int, int]:
        """Exit code per rank, `parallel` ranks at a time; `ServerFailed` if the server dies. `more`: other
        ranks will follow (the server learns their imports as each ends)."""
        if not ranks:
            return {}
        try:
            self.proc.stdin.write(json.dumps({"run": ranks, "parallel": parallel, "more": more}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._failed() from None
        codes: dict[int, int] = {}
        while len(codes) < len(ranks):
            line = self._replies.readline()
            if not line:
                raise self._failed()
            reply = json.loads(line)
            codes[reply["done"]] = reply["code"]
        return codes

    def _failed(self) -> ServerFailed:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # its pipe closed but it lives on: it is stopped here
            self._kill()
        code = self.proc.returncode
        if code < 0:
            return ServerFailed(f"the fork server was killed by signal {-code} ({self.log_path})")
        said = [line for line in self.log_path.read_text().splitlines() if line.strip() and not line[0].isspace()]
        return ServerFailed(f"the fork server exited with code {code}: {said[-1] if said else 'nothing in its log'} "
                            f"({self.log_path})")

    def _kill(self) -> None:
        """The server and every rank it forked (its own session), at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self, abort: bool = False) -> None:
        """Stop the server: it ends at the EOF of its stdin; with `abort` (an error or Ctrl-C while ranks
        run, when the server is not reading) it and its ranks are killed at once."""
        if self.proc.poll() is None and not abort:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                abort = True
        if self.proc.poll() is None and abort:
            self._kill()
        for stream in (self.proc.stdin, self._replies):
            try:
                stream.close()
            except OSError:  # the server is gone: nothing is left to flush to it
                pass


def environment(rank: int, world: int, per_node: int) -> dict[str, str]:
    """What torchrun sets for `rank` of `world` ranks on nodes of `per_node`."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(rank // per_node), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "meshscope-fake-world", "MESHSCOPE_FAKE_WORLD": str(world)}


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent process dies (nothing elsewhere: the parent's EOF ends the server)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _library_module(module) -> bool:
    """A module of the standard library or of an installed package (not the script's own folder)."""
    return (getattr(module, "__file__", None) or "").startswith(LIBRARY_ROOTS)


def _script_module(name: str, module) -> bool:
    """A module of the script's own (from its folder or another of the user's): by the rule for the script's
    frames (`script_frames.is_library`), but for meshscope's native recorder, built into the user's cache."""
    path = getattr(module, "__file__", None)
    return bool(path) and not is_library(path) and name != NATIVE_RECORDER


def _write_imports(run_dir: RunDir, rank: int, before: set[str]):
    """The `rank.main` ``on_end`` of a forked rank: list the library modules its script imported, in order, up
    to the first module of the script's own. What a library computes at import may depend on what the script
    did before importing it (benchmarks/forecast_megatron_gpt.py imports megatron_fused_kernels.py first, whose
    ``install()`` puts Megatron's kernel modules in ``sys.modules``, and megatron-core's layers.py looks for them
    when imported), which the server, importing libraries alone, would not have done."""
    def on_end() -> None:
        names = []
        for name, module in list(sys.modules.items()):  # in the order of their imports
            if name in before or name == "__main__" or module is None:
                continue
            if _script_module(name, module):
                break
            if _library_module(module):
                names.append(name)
        run_dir.imports(rank).parent.mkdir(exist_ok=True)
        write_atomic(run_dir.imports(rank), json.dumps(names))  # whole or absent for the server
    return on_end


def _threads() -> int:
    """This process's threads, native ones included."""
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def _import_all(names: list[str], argv: list[str] | None = None) -> None:
    """Import `names`, with ``sys.argv`` the job's `argv` meanwhile where given: a module may bind it
    at import (torchtitan 0.2.2's ``ConfigManager.parse_args(self, args=sys.argv[1:])``, a default
    evaluated once, config/manager.py:46), and its ranks must read their own arguments there."""
    own, sys.argv = sys.argv, argv or sys.argv
    try:
        for name in names:
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001 - a module its rank imported its own way (even one that
                continue  # exits when imported elsewhere): the rank will import it again
    finally:
        sys.argv = own


class _Server:
    def __init__(self, run_dir: RunDir, world: int, per_node: int, options: RankOptions, replies_fd: int):
        self.run_dir, self.world, self.per_node, self.options = run_dir, world, per_node, options
        self.replies_fd, self.pid = replies_fd, os.getpid()
        self.learning = True
        self.learned: set[str] = set()
        self.finished: list[int] = []
        self.shared_files = files.probe(run_dir.path)  # before any import: a fork of a small process
        if self.shared_files:
            print(f"fork server: the ranks share their files: {self.shared_files}", flush=True)
        _import_all(PRELOAD)
        if options.fake_tensors:
            _import_all(["torch._subclasses.fake_tensor", "torch._dynamo"])  # what FakeTensorMode's first use imports
        from . import patches

        # The rank-independent part of a fake-world rank's set-up (trace.rank makes the same calls, then
        # no-ops): what a learned module computes at import sees the same backend and CUDA mapping here
        # as in the first ranks, which imported it after this.
        patches.apply(patches.modes(fake_tensors=False))

    def _learn(self, finished: list[int]) -> None:
        """Import what finished ranks' scripts imported, as far as a probe child shows that starts no thread."""
        names: list[str] = []
        for rank in finished:
            try:
                listed = json.loads(self.run_dir.imports(rank).read_text())
            except (OSError, ValueError):  # the rank failed before its end: nothing to learn from it
                continue
            names += [n for n in listed if n not in self.learned and n not in sys.modules]
        names = list(dict.fromkeys(names))
        if not self.learning or not names:
            return
        self.learned.update(names)
        safe, stopped = self._import_behind_probe(names)
        if stopped:
            # A rank's list is in the order it imported them, so the ones before the first that starts a
            # thread import without it (torchtitan 0.2.2: 958 of 1,668 modules, up to pandas, whose
            # pyarrow starts a native thread); what comes after is left to the ranks.
            self.learning = False
            why = f"importing {names[safe]}" if safe < len(names) else "the probe"
            print(f"fork server: {why} starts a thread or failed, so the ranks import it and the "
                  f"{len(names) - safe} modules after it themselves", flush=True)

    def _import_behind_probe(self, names: list[str]) -> tuple[int, bool]:
        """Import `names` in order, each one after a probe child imported it and still had one thread: the
        child runs a module ahead rather than through the whole list first, so the two overlap (torchtitan
        0.3.0's 1,956 modules: 5.0 s, 3 s of it while its rank 0 still ran; 5-6 s of the server alone
        between its first ranks and the rest when the child went first). (imported here, stopped): stopped
        where the child saw a thread start or died."""
        read_end, write_end = os.pipe()
        probe = os.fork()
        if probe == 0:
            try:
                _die_with_parent()
                os.close(self.replies_fd)
                os.close(read_end)
                before = _threads()
                for name in names:
                    _import_all([name], self.options.script_argv)
                    if _threads() != before:
                        break
                    os.write(write_end, b".")  # one byte per module that imported and started no thread
                else:
                    os.write(write_end, b"$")  # all of them
            finally:
                os._exit(0)
        os.close(write_end)
        safe = 0
        with os.fdopen(read_end, "rb", buffering=0) as answer:
            while (told := answer.read(1)) == b".":
                _import_all([names[safe]], self.options.script_argv)
                safe += 1
            stopped = told != b"$"
        os.waitpid(probe, 0)
        return safe, stopped

    def run(self, ranks: list[int], parallel: int, replies, more: bool = False) -> None:
        """Fork `ranks`, `parallel` at a time. What a finished rank imported is learned before the next
        fork, and with `more` (the caller will ask for more ranks: ``--ranks auto``'s first ones) as soon
        as it ends, while the other rank still runs and the caller reads the classes of ranks."""
        pending, alive = list(ranks), {}
        while pending or alive:
            while pending and len(alive) < max(1, parallel):
                self._learn_finished()
                rank = pending.pop(0)
                sys.stdout.flush()
                sys.stderr.flush()
                gc.freeze()  # what the server holds stays out of the ranks' collections, as in `run.agent`
                pid = os.fork()
                if pid == 0:
                    from .objects import alongside  # loaded with torch, in the server

                    alongside({r: p for p, r in alive.items()})  # the ranks it may wait for
                    self._child(rank)  # never returns
                alive[pid] = rank
            pid, status = os.wait()
            if pid not in alive:  # a process some imported module started and left: not a rank
                continue
            rank = alive.pop(pid)
            self.finished.append(rank)
            replies.write(json.dumps({"done": rank, "code": os.waitstatus_to_exitcode(status)}) + "\n")
            replies.flush()
            if more:
                self._learn_finished()

    def _learn_finished(self) -> None:
        """Learn from the ranks reaped since the last time, this request's or an earlier one's."""
        if self.finished:
            self._learn(self.finished)
            self.finished = []

    def _child(self, rank: int) -> None:
        code = 1
        try:
            _die_with_parent()
            if os.getppid() != self.pid:  # the server died before the line above took effect
                os._exit(1)
            os.close(self.replies_fd)  # only the server answers: a dead server is EOF for the caller
            from .. import rank as rank_program

            agent.as_fresh_interpreter()
            os.environ.update(environment(rank, self.world, self.per_node))
            if self.options.measure_on == "cuda":  # every rank played on this host's GPUs, one at a time
                import torch

                os.environ["LOCAL_RANK"] = str(rank % self.per_node % max(1, torch.cuda.device_count()))
            log = os.open(self.run_dir.log(rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            null = os.open(os.devnull, os.O_RDONLY)
            for fd, target in ((log, 1), (log, 2), (null, 0)):
                os.dup2(fd, target)
            os.close(log)
            os.close(null)
            sys.stdin = open(os.devnull)
            if self.shared_files:
                files.shared(self.shared_files)
            else:  # while this process has one thread: a user namespace admits no other
                try:
                    files.isolate(self.run_dir.path)
                except OSError as exc:
                    print(f"meshscope: rank {rank} could not take its own layer over its files, as the fork "
                          f"server's probe had: {exc}", file=sys.stderr)
                    raise SystemExit(1) from None
            before = set(sys.modules)
            code = rank_program.main(self.options.to_argv(), on_end=_write_imports(self.run_dir, rank, before))
        except SystemExit as exc:
            code = exit_code(exc)
        except BaseException:  # noqa: BLE001 - reported in the rank's log, as a fresh process would
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def main(argv: list[str]) -> int:
    _die_with_parent()
    run_dir, world, per_node, replies_fd = RunDir(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    os.set_inheritable(replies_fd, False)  # no process a rank starts holds the caller's pipe open
    replies = os.fdopen(replies_fd, "w")
    server = _Server(run_dir, world, per_node, RankOptions.from_argv(argv[4:]), replies_fd)
    for line in sys.stdin:  # EOF: the caller is done (or gone)
        request = json.loads(line)
        server.run(request["run"], request["parallel"], replies, request.get("more", False))
    sys.stdout.flush()
    os._exit(0)  # without the interpreter's teardown of torch (about a second): the caller waits for it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
