"""What a traced rank prints, kept in ``logs/rank<R>.log`` while it still reaches the console.

torchrun hands every worker its own stdout and stderr (the launcher's pipe), so a job's output
arrives mixed across ranks, and a rank that exits before its first collective leaves its reason
("Unable to locate sufficient 2 gpus ... Exiting.") only there. `tee` puts a small process between
the rank and those streams: it copies each to where it went before and to the rank's log. It is a
process of its own, not a thread, so what a rank printed just before it was killed (SIGKILL, an
abort in C++) still reaches the log: the copier reads until the rank's end of the pipes closes. It
ignores SIGTERM and SIGINT (the launcher's stop is for the rank) and ends at that EOF. A fake world's
ranks write their log directly (`fork_server`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_COPIER = r"""
import os, select, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
route = dict((int(a), int(b)) for a, b in (p.split(":") for p in sys.argv[2:]))
while route:
    for fd in select.select(list(route), [], [])[0]:
        data = os.read(fd, 65536)
        if not data:
            del route[fd]
            continue
        for out in (route[fd], log):
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(out, view):]
                except OSError:  # the console is gone: the log still gets everything
                    break
"""


def tee(log: Path) -> None:
    """From now on this process's stdout and stderr also go to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    ends, route = [], []
    for fd in (1, 2):
        read, write = os.pipe()
        original = os.dup(fd)
        ends.append((fd, read, write, original))
        route.append(f"{read}:{original}")
    keep = [n for _, read, _, original in ends for n in (read, original)]
    subprocess.Popen([sys.executable, "-c", _COPIER, str(log), *route], pass_fds=keep, stdin=subprocess.DEVNULL,
                     close_fds=True, start_new_session=False)
    for fd, read, write, original in ends:
        os.dup2(write, fd)
        for n in (read, write, original):
            os.close(n)
