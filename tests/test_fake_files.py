"""A fake world's ranks each see the files as they were when the trace began, and their own changes only
(`trace.fake.files`): in-process on two concurrent forked children, on the fallback where the system
refuses a mount namespace, and on a traced job that resumes from the snapshot its rank 0 saves."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import traceback

import pytest

from meshscope.core.rank_end import RankEnd
from meshscope.trace.fake import files

from .helpers import ROOT, trace_json

JOBS = ROOT / "tests" / "jobs"


def _fork(body) -> int:
    """A child running `body` (exit 0 when it returns, 1 with its traceback on stderr when it raises)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:  # noqa: BLE001 - the parent asserts on the exit code
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working directory with three files of the user's, and a run directory inside it (the default
    ``traces/<script>-<time>`` lies there too)."""
    cwd = tmp_path / "work"
    (cwd / "traces" / "run").mkdir(parents=True)
    (cwd / "kept.txt").write_text("the user's\n")
    (cwd / "gone.txt").write_text("removed by a rank\n")
    monkeypatch.chdir(cwd)
    reason = files.probe(cwd / "traces" / "run")
    if reason:
        pytest.skip(f"no layer of files on this system: {reason}")
    return cwd


def test_two_concurrent_ranks_see_the_files_as_they_began_and_their_own_changes(work):
    """Rank A creates, changes and removes files, then waits while rank B, started after A's changes,
    finds the files as they began; afterwards the user's folder is as before, and what A wrote in the
    run directory reached it."""
    run = work / "traces" / "run"
    a_changed_r, a_changed_w = os.pipe()
    b_done_r, b_done_w = os.pipe()

    def rank_a():
        files.isolate(run)
        (work / "new.txt").write_text("rank A's\n")
        with open("kept.txt", "a") as f:
            f.write("rank A's line\n")
        os.remove("gone.txt")
        assert (work / "kept.txt").read_text() == "the user's\nrank A's line\n"
        os.write(a_changed_w, b"1")
        assert os.read(b_done_r, 1) == b"1"
        assert (work / "new.txt").read_text() == "rank A's\n"  # B's file of that name is B's
        (run / "a.json").write_text(json.dumps(files.record()))

    def rank_b():
        assert os.read(a_changed_r, 1) == b"1"
        files.isolate(run)
        assert not (work / "new.txt").exists() and (work / "gone.txt").exists()
        assert (work / "kept.txt").read_text() == "the user's\n"
        (work / "new.txt").write_text("rank B's\n")
        os.write(b_done_w, b"1")

    pids = [_fork(rank_a), _fork(rank_b)]
    assert [_exit_code(p) for p in pids] == [0, 0]
    assert sorted(p.name for p in work.iterdir()) == ["gone.txt", "kept.txt", "traces"]
    assert (work / "kept.txt").read_text() == "the user's\n"
    assert json.loads((run / "a.json").read_text()) == {"files": "own",
                                                        "wrote": ["gone.txt (removed)", "kept.txt", "new.txt"]}


def test_a_refused_mount_namespace_leaves_the_files_shared_and_says_why(tmp_path, monkeypatch):
    """In a user namespace allowed no mount namespace, the probe reports the refusal in one line."""
    (tmp_path / "work").mkdir()
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    said_r, said_w = os.pipe()

    def limited():
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(files.CLONE_NEWUSER) != 0:
            os.write(said_w, b"SKIP")
            return
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                           ("/proc/self/gid_map", f"0 {gid} 1"), ("/proc/sys/user/max_mnt_namespaces", "0")):
            with open(path, "w") as f:  # the limit is this user namespace's own
                f.write(text)
        os.write(said_w, files.probe(tmp_path / "run").encode())

    assert _exit_code(_fork(limited)) == 0
    os.close(said_w)
    with os.fdopen(said_r) as said:
        reason = said.read()
    if reason == "SKIP":
        pytest.skip("no user namespace here to limit")
    assert reason == "unshare(CLONE_NEWNS): No space left on device"
    note = files.note([RankEnd(0, "ok", files=reason), RankEnd(1, "ok", files=reason)])
    assert note.startswith("fake world: the ranks shared their files") and note.endswith(f": {reason})")


def test_the_note_names_what_each_rank_kept_to_itself():
    ends = [RankEnd(0, "ok", files=files.OWN, wrote=("snapshot.pt",)), RankEnd(1, "ok", files=files.OWN)]
    assert files.note(ends).endswith("discarded at its end (rank 0: snapshot.pt)")
    assert files.note([RankEnd(0, "ok", files=files.OWN)]) is None


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_no_rank_resumes_from_the_snapshot_rank_0_saved(tmp_path, monkeypatch):
    """tests/jobs/snapshot_resume.py at fake world 4, every rank: each starts fresh, as in a real run,
    and issues the hand count of its docstring (64 rows over 4 ranks in batches of 4, 2 epochs: 8
    gradient all-reduces); the snapshot rank 0 saves is gone afterwards, and the data every rank read
    and the history every rank appended to are the user's, unchanged."""
    import torch

    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    reason = files.probe(tmp_path / "run")
    if reason:
        pytest.skip(f"no layer of files on this system: {reason}")
    torch.save(torch.randn(64, 21, generator=torch.Generator().manual_seed(0)), cwd / "data.pt")
    (cwd / "history.txt").write_text("an earlier run\n")
    before = {name: _digest(cwd / name) for name in ("data.pt", "history.txt")}
    job = [str(JOBS / "snapshot_resume.py"), "--data", "data.pt", "--history", "history.txt"]
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 4, "--ranks", "0,1,2,3", job, cwd=cwd)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert [r["files"] for r in doc["ranks"]] == [files.OWN] * 4
    for rank in doc["per_rank"]:
        ops = [e["op"] for s in rank["steps"] for e in s["events"]]
        assert ops.count("all_reduce") == 8 and ops.count("broadcast") == 4 and ops.count("all_gather") == 1
    for r in range(4):
        assert f"rank {r}: starting at epoch 0" in (tmp_path / "run" / "logs" / f"rank{r}.log").read_text()
    assert sorted(p.name for p in cwd.iterdir()) == ["data.pt", "history.txt"]
    assert {name: _digest(cwd / name) for name in before} == before
    assert [r["wrote"] for r in doc["ranks"]] == [["history.txt", "snapshot.pt"]] + [["history.txt"]] * 3
