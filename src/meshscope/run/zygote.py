"""meshscope's own helper processes (the elastic agent, a fake world's fork server) forked from one warm
process, where a long session starts many: a test suite.

Each ``meshscope run``, ``suite`` and ``trace`` starts ``python -m meshscope.run.agent`` (or, for a fake
world, ``python -m meshscope.trace.fake.fork_server``), which imports torch and its parallel APIs before
its first rank: about 3 s of the 4 s a 2-rank trace of ``tests/jobs/ddp.py --steps 3`` took on the
project's 2-core box (``/usr/bin/time``, 2026-12-05). A suite that traces a hundred jobs pays that a
hundred times. Where ``MESHSCOPE_ZYGOTE`` names the socket of a zygote (``python -m meshscope.run.zygote
SOCKET``, which imported them once and starts no thread), `start` asks it to fork the process instead:
the child sets its session, working directory, environment and standard streams as the request says
(the streams and any other descriptors it must hold travel over the socket, ``SCM_RIGHTS``) and runs
the module as ``__main__``, as ``python -m`` would; the zygote reaps it and sends its exit status back.
The caller gets a `Started`, which answers as much of ``subprocess.Popen`` as the launchers use. Without
the variable, or with a zygote that does not answer, `start` is ``subprocess.Popen`` itself. Run it as
``python -m meshscope.run.zygote SOCKET [MODULE...]``: it imports torch's parallel APIs (`agent.PRELOAD`)
and the modules named (the programs its children run), prints ``ready`` and serves until its stdin
closes.

What differs from a fresh interpreter is what ``run.agent`` says of a forked rank: modules imported
once, before the child's environment was set. The zygote starts with the variables a launcher gives its
children (``OMP_NUM_THREADS``, ``PYTHONUNBUFFERED``), read at interpreter start or at import.
"""

from __future__ import annotations

import array
import fcntl
import gc
import importlib
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import time

ENV = "MESHSCOPE_ZYGOTE"
"""The zygote's socket path, where one serves this process's launchers."""

_MAX_FDS = 16
_HIGH_FD = 512
"""Where a child parks the descriptors it received before it moves them onto their numbers."""


class Started:
    """A process the zygote forked, as much of ``subprocess.Popen`` as `run.launch` and the fork server use."""

    def __init__(self, conn: socket.socket, pid: int, stdin=None, stdout=None, stderr=None, text: bool = True):
        self._conn, self.pid, self.stdin, self.stdout, self.stderr = conn, pid, stdin, stdout, stderr
        self._text = text
        self.returncode: int | None = None

    def communicate(self, timeout: float | None = None) -> tuple:
        """Read the piped streams to their end and wait, as ``Popen.communicate`` (no input); past `timeout`
        seconds ``subprocess.TimeoutExpired``, the child left running, as Popen leaves it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pipes = {f: [] for f in (self.stdout, self.stderr) if f is not None}
        with selectors.DefaultSelector() as sel:
            for f in pipes:
                sel.register(f, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fileobj.fileno(), 1 << 16)
                    if chunk:
                        pipes[key.fileobj].append(chunk)
                    else:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        read = {f: b"".join(chunks) for f, chunks in pipes.items()}
        return tuple(None if f is None else read[f].decode() if self._text else read[f]
                     for f in (self.stdout, self.stderr))

    def kill(self) -> None:
        """SIGKILL the child (the zygote reaps it and answers its status)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout)
            self._read_status()
        return self.returncode

    def _read_status(self) -> None:
        data = self._conn.recv(64)
        self._conn.close()
        # no status: the zygote died with its child unreaped; the child's own end is unknown
        self.returncode = int(data) if data.strip() else -9


def start(args: list[str], *, env: dict, stdin=None, stdout=None, stderr=None, pass_fds=(), text: bool = True,
          bufsize: int = -1, start_new_session: bool = False, cwd: str | None = None):
    """``subprocess.Popen(args, ...)`` for ``args = [sys.executable, "-m", MODULE, *ARGV]``, through the
    zygote where one serves (`ENV`), else Popen itself. `stdin`, `stdout`, `stderr`: ``subprocess.PIPE``,
    a file or None, as Popen takes them (``subprocess.STDOUT`` for stderr)."""
    path = os.environ.get(ENV)
    conn = None
    if path and args[1:2] == ["-m"]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
        except OSError:
            conn.close()
            conn = None
    if conn is None:
        return subprocess.Popen(args, env=env, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds,
                                text=text, bufsize=bufsize, start_new_session=start_new_session, cwd=cwd)
    ours, theirs, mine = [], {}, {}  # fds to close here once sent; target fd -> fd sent; pipe ends kept

    def stream(target: int, spec, reading: bool) -> None:
        if spec == subprocess.PIPE:
            r, w = os.pipe()
            child, kept = (r, w) if reading else (w, r)
            theirs[target], mine[target] = child, kept
            ours.append(child)
        elif spec is not None:
            theirs[target] = spec if isinstance(spec, int) else spec.fileno()

    stream(0, stdin, True)
    stream(1, stdout, False)
    if stderr == subprocess.STDOUT:
        theirs[2] = theirs.get(1, 1)
    else:
        stream(2, stderr, False)
    for fd in pass_fds:
        theirs[fd] = fd
    targets = sorted(theirs)
    request = json.dumps({"module": args[2], "argv": args[3:], "env": env, "cwd": cwd or os.getcwd(),
                          "session": start_new_session, "fds": targets}).encode()
    fds = array.array("i", [theirs[t] for t in targets])
    conn.sendmsg([len(request).to_bytes(8, "little"), request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    for fd in ours:
        os.close(fd)
    pid = int(_line(conn))
    lines = 1 if text and bufsize == 1 else -1
    stdin_file = os.fdopen(mine[0], "w" if text else "wb", buffering=lines) if 0 in mine else None
    stdout_file = os.fdopen(mine[1], "r" if text else "rb") if 1 in mine else None
    stderr_file = os.fdopen(mine[2], "r" if text else "rb") if 2 in mine else None
    return Started(conn, pid, stdin_file, stdout_file, stderr_file, text)


def _line(conn: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise OSError("the zygote closed the connection")
        out += chunk
    return out


def serve(path: str, modules: list[str]) -> None:
    """Import `agent.PRELOAD` and `modules` (the programs its children will run), print ``ready``, then fork
    a child per request until stdin closes."""
    from .agent import PRELOAD, before_forks

    for name in (*PRELOAD, *modules):
        before_forks(importlib.import_module(name))
    # what was imported stays out of every child's garbage collections, as `run.agent` keeps it out of its
    # ranks': a full collection walked the 303,000 objects these imports made (140 ms, and in a forked child
    # a write to each one's page), in every agent, fork server and command the zygote forked
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        ready = select.select([listener, sys.stdin], [], [], 0.05)[0]
        if sys.stdin in ready and not sys.stdin.readline():  # the session that started it ended
            break
        if listener in ready:
            conn, _ = listener.accept()
            pid = _fork_child(conn, listener)
            if pid:
                children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
                except OSError:
                    pass
                conn.close()
    listener.close()
    os._exit(0)


def _fork_child(conn: socket.socket, listener: socket.socket) -> int:
    fds = array.array("i")
    # the descriptors ride on the message's first bytes: read with them, or the kernel drops them
    head, ancdata, _, _ = conn.recvmsg(8, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize), socket.MSG_WAITALL)
    msg = conn.recv(int.from_bytes(head, "little"), socket.MSG_WAITALL)
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    request = json.loads(msg)
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        return pid
    try:
        listener.close()
        conn.close()
        if request["session"]:
            os.setsid()
        # onto their numbers: first all above any of them, so that none lands on one still to be moved
        high = {target: fcntl.fcntl(fd, fcntl.F_DUPFD, _HIGH_FD) for target, fd in zip(request["fds"], fds)}
        for fd in fds:
            os.close(fd)
        for target, fd in high.items():
            os.dup2(fd, target)
        for fd in high.values():
            os.close(fd)
        received = high
        for target in (0, 1, 2):
            if target not in received:
                os.dup2(os.open(os.devnull, os.O_RDWR), target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # as ``python -m`` puts the working directory first
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)  # as the interpreter does with ``sys.exit("message")``
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
        import traceback

        traceback.print_exc()
        code = 1
    os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
