"""Start the ranks of a run through torch's own elastic launcher, and report how they ended.

`launch` runs ``python -m meshscope.run.agent --standalone --nproc-per-node N -m meshscope.cli.worker
RUN_DIR`` (torchrun, its ranks forked from a process that imported torch once: `agent`): torchrun owns
process start-up, rendezvous, port choice (``--standalone`` binds a free port, so two runs at once never
collide) and tear-down (one failed rank stops all the others). The same
worker runs unchanged as one rank of a user's own multi-node ``torchrun`` job (`in_torchrun`).

The launcher adds what torchrun does not: every line of output goes to ``RUN_DIR/launcher.log``;
progress lines of rank 0 are shown live; a watchdog kills the whole process tree if nothing at all
happens (no output line and no growth of any rank's flight log) for longer than the collective timeout
plus a grace period (a hang outside any collective);
and on failure it shows the failing rank and its error once, read from the error file that rank
wrote, instead of torchrun's traceback of every rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.rundir import RunDir
from . import zygote

PROGRESS_PREFIX = "[meshscope] "
"""Lines a rank writes to stderr with this prefix are progress; the launcher shows them (defined here,
where torch is not imported: the command line starts without it)."""

GRACE_S = 30.0
"""Extra silence tolerated beyond the collective timeout before the watchdog kills the run."""


def in_torchrun() -> bool:
    """True inside a process that torchrun (or a compatible launcher) started as one rank."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


@dataclass
class Outcome:
    returncode: int
    error: str | None
    """'rank R: <error>' of the first rank that failed, or a launcher-level reason."""
    timed_out: bool = False


def first_failure(run_dir: RunDir) -> str | None:
    """The earliest error any rank recorded: later ones are usually peers seeing it disconnect."""
    errors = []
    for path in run_dir.files("errors"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not errors:
        return None
    first = min(errors, key=lambda e: e["time"])
    return f"rank {first['rank']}: {first['error']}"


def launch(run_dir: Path, nproc: int, timeout_s: float | None, on_progress=None, env: dict | None = None,
           program: list[str] | None = None, rendezvous: list[str] | None = None, echo=None) -> Outcome:
    """Run `nproc` local ranks of `program` (default: ``-m meshscope.cli.worker RUN_DIR``, the spec in
    `run_dir`) through torchrun with `rendezvous` flags (default ``--standalone``); wait for them.

    `echo` receives every output line (a traced script's own output); `timeout_s` None: no watchdog
    (a traced job may compute quietly for as long as it likes)."""
    run_dir = RunDir(run_dir)
    program = program or ["-m", "meshscope.cli.worker", str(run_dir)]
    cmd = [sys.executable, "-m", "meshscope.run.agent", *(rendezvous or ["--standalone"]),
           f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.2", *program]
    child_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                 "PYTHONUNBUFFERED": "1", **(env or {})}
    log = open(run_dir.launcher_log, "w")
    proc = zygote.start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env,
                        start_new_session=True, text=True, bufsize=1)
    last_activity = [time.monotonic()]

    def pump():
        for line in proc.stdout:
            last_activity[0] = time.monotonic()
            log.write(line)
            log.flush()
            if echo is not None:
                echo(line)
            text = line.split(PROGRESS_PREFIX, 1)
            if len(text) == 2 and on_progress is not None:
                on_progress(text[1].rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    flight_bytes = 0
    while proc.poll() is None:
        time.sleep(0.1)
        grown = _flight_bytes(run_dir)
        if grown != flight_bytes:  # a rank issued or completed a collective: the run is alive
            flight_bytes, last_activity[0] = grown, time.monotonic()
        if timeout_s is not None and time.monotonic() - last_activity[0] > timeout_s + GRACE_S:
            timed_out = True
            _kill_tree(proc)
            break
    proc.wait()
    reader.join(timeout=5)
    log.close()
    error = first_failure(run_dir)
    if timed_out and error is None:
        error = f"no rank made progress for {timeout_s + GRACE_S:.0f} s; every rank was stopped"
    if proc.returncode != 0 and error is None:
        error = f"torchrun exited with code {proc.returncode} and no rank recorded an error; see {run_dir.launcher_log}"
    return Outcome(proc.returncode if not timed_out else 124, error, timed_out)


def _flight_bytes(run_dir: RunDir) -> int:
    """Total size of the ranks' flight logs (they grow with every collective)."""
    total = 0
    for path in run_dir.files("flight"):
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's whole session (torchrun and its ranks), then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
