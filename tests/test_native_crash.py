"""A rank that dies in native code (tests/jobs/faults/native_crash.py: libc's abort or a segfault, as a
C++ kernel dies) is FAILED with the signal as its exit, keeps the calls it issued, and is the doctor's
root cause. The oracle: the job's own hand count (rank 1 issues ``--steps`` all-reduces, then dies) and
the signal it raises."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from .helpers import ROOT, cli

JOB = ROOT / "tests" / "jobs" / "faults" / "native_crash.py"
STEPS = 3
SIGNALS = {"segv": ("SIGSEGV", -11), "abort-holding-gil": ("SIGABRT", -6)}


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    dirs = {s: tmp_path_factory.mktemp(s) / "run" for s in SIGNALS}

    def trace(how):
        proc = cli("trace", "--nproc-per-node", 2, "--timeout", 30, "--out", dirs[how], "--json", "--", JOB,
                        "--signal", how, "--steps", STEPS)
        return how, (proc, json.loads(proc.stdout))

    with ThreadPoolExecutor(2) as pool:  # processes of their own: `cli_here` redirects this process's stdout
        return dict(pool.map(trace, SIGNALS))


def _rank1(doc) -> dict:
    """Rank 1's end, where the C++ recorder, which watches for fatal signals, was what the job used (rank 0,
    which survives, says which recorder the ranks had)."""
    used = next(r for r in doc["ranks"] if r["rank"] == 0)["recorder"]
    if used != "native":
        pytest.skip(f"the C++ recorder watches for fatal signals; this trace used {used!r}")
    return next(r for r in doc["ranks"] if r["rank"] == 1)


@pytest.mark.parametrize("how", list(SIGNALS))
def test_a_rank_dead_of_a_signal_fails_the_job_with_the_signal_as_its_exit(crashed, how):
    proc, doc = crashed[how]
    name, code = SIGNALS[how]
    end = _rank1(doc)
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr[-2000:]
    assert end["status"] == "error" and end["exit_code"] == code
    assert end["error"].startswith(f"killed by {name} (signal {-code}) in native code")
    assert doc["failure"]["rank"] == 1  # its death, not its peer's closed connection, is the job's error
    root = doc["doctor"]["findings"][0]
    assert root["kind"] == "script-error" and root["ranks"] == [1] and "(faulthandler)" in root["cause"]


def test_what_it_issued_is_kept_where_its_flusher_could_run(crashed):
    """ctypes releases the GIL around the segfaulting call, as torch does around its kernels: the
    flusher writes the rank's calls (all `STEPS` all-reduces, each 16 B) before it dies."""
    proc, doc = crashed["segv"]
    end = _rank1(doc)
    calls = [e for r in doc["per_rank"] if r["rank"] == 1 for s in r["steps"] for e in s["events"]]
    assert [(e["op"], e["bytes_in"]) for e in calls] == [("all_reduce", 16)] * STEPS and not end["unflushed"]


def test_the_gap_is_named_where_the_dying_thread_held_the_gil(crashed):
    """``os.abort()`` holds the GIL: no Python runs again, so the C++ recorder writes the rank's end
    itself, and the doctor says its flight log lacks its last half second."""
    proc, doc = crashed["abort-holding-gil"]
    end = _rank1(doc)
    assert end["unflushed"] and "is not known: its flusher could not run" in end["error"]
    missing = next(f for f in doc["doctor"]["findings"] if f["kind"] == "missing")
    assert "which lacks what it issued in its last half second" in missing["cause"]
