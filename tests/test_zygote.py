"""`run.zygote`: a process forked from the warm zygote behaves as ``subprocess.Popen`` of ``python -m
MODULE`` does, in what the launchers use (the oracle: Popen itself, on the same module): its arguments,
environment, working directory, standard streams, a descriptor passed on, its exit code, its own
session; and without a zygote `start` is Popen. The suite's own launches go through a zygote
(tests/conftest.py), so one trace here goes without it, the path users take."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from meshscope.run import zygote

from .helpers import ROOT, cli

PROBE = textwrap.dedent("""
    import os, sys
    fd = int(sys.argv[1])
    os.write(fd, b"passed on")
    lines = [line.strip() for line in sys.stdin]
    print(sys.argv[1:], os.environ.get("PROBE"), os.getcwd(), lines, os.getsid(0) == os.getpid(), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    sys.exit(3)
""")


def _run(tmp_path, through_zygote: bool):
    (tmp_path / "probe_module.py").write_text(PROBE)
    read, write = os.pipe()
    env = {**os.environ, "PROBE": "yes"}
    if not through_zygote:
        env.pop(zygote.ENV, None)
    saved = os.environ.get(zygote.ENV)
    if not through_zygote and saved is not None:
        del os.environ[zygote.ENV]
    try:
        proc = zygote.start([sys.executable, "-m", "probe_module", str(write), "x"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, pass_fds=(write,),
                            start_new_session=True, cwd=str(tmp_path), text=True, bufsize=1)
    finally:
        if saved is not None:
            os.environ[zygote.ENV] = saved
    os.close(write)
    proc.stdin.write("a\nb\n")
    proc.stdin.close()
    out = proc.stdout.read()
    code = proc.wait(timeout=60)
    passed = os.read(read, 64)
    os.close(read)
    return type(proc).__name__, code, out.replace(str(tmp_path), "TMP"), passed


def test_a_forked_child_is_what_popen_starts(tmp_path):
    if not os.environ.get(zygote.ENV):
        pytest.skip("no zygote serves this process (tests/conftest.py could not start one)")
    kind, *zygote_side = _run(tmp_path, True)
    popen_kind, *popen_side = _run(tmp_path, False)
    assert (kind, popen_kind) == ("Started", "Popen")
    assert zygote_side == popen_side
    assert popen_side[0] == 3 and popen_side[2] == b"passed on"
    assert "', 'x'] yes TMP ['a', 'b'] True\nto stderr\n" in popen_side[1]


@pytest.mark.parametrize("through_zygote", [True, False], ids=["zygote", "popen"])
def test_communicate_reads_both_piped_streams_and_the_exit_of_sys_exit_with_a_message(tmp_path, through_zygote):
    """What `helpers.cli` takes from a forked ``python -m meshscope``: stdout and stderr apart, each whole (more than
    a pipe holds), and ``sys.exit("message")``'s message on stderr with exit 1, as Popen's child gives them."""
    if through_zygote and not os.environ.get(zygote.ENV):
        pytest.skip("no zygote serves this process")
    (tmp_path / "loud.py").write_text("import sys\nprint('o' * 200000)\nprint('e' * 200000, file=sys.stderr)\n"
                                      "sys.exit('the message')\n")
    env = dict(os.environ)
    if not through_zygote:
        env.pop(zygote.ENV, None)
    saved = os.environ.pop(zygote.ENV, None) if not through_zygote else None
    try:
        proc = zygote.start([sys.executable, "-m", "loud"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=str(tmp_path))
    finally:
        if saved is not None:
            os.environ[zygote.ENV] = saved
    out, err = proc.communicate(timeout=60)
    assert type(proc).__name__ == ("Started" if through_zygote else "Popen")
    assert (proc.returncode, out, err) == (1, "o" * 200000 + "\n", "e" * 200000 + "\nthe message\n")


def test_a_forked_childs_session_is_killed_whole(tmp_path):
    if not os.environ.get(zygote.ENV):
        pytest.skip("no zygote serves this process")
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    proc = zygote.start([sys.executable, "-m", "sleeper"], env=dict(os.environ), start_new_session=True,
                        cwd=str(tmp_path))
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_a_trace_without_a_zygote_starts_its_agent_fresh(tmp_path):
    """The path a user's ``meshscope trace`` takes: a fresh ``python -m meshscope.run.agent``."""
    proc = cli("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--json", "--", ROOT / "tests/jobs/ddp.py",
               "--steps", 2, env={zygote.ENV: ""})
    assert proc.returncode == 0 and json.loads(proc.stdout)["outcome"] == "passed", proc.stderr[-2000:]
