"""Verdicts that never lie: a trace's outcome (passed, failed, empty, incomplete), checks that did not
run, `diff`'s verdict (same, differ, not comparable), the one agreement rule of the doctor and the
checks, the script's own exception as the root cause, notes derived from what they state, `--ranks
auto` that stops when its first ranks fail alike, the layout block and figures at scale, and `--out`.

Most cases are pure Python over records and directories written here; five launch real jobs
(`tests/jobs/early_exit.py`, `tests/jobs/scatter_then_raise.py`, a rank that kills itself), whose
facts come from the jobs' own docstrings and the hand counts below."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from meshscope.core.agreement import disagreement
from meshscope.core.errors import UsageError
from meshscope.core.events import CommEvent
from meshscope.core.findings import Finding
from meshscope.core.result import Check
from meshscope.core.rundir import RunDir
from meshscope.core.steady import of_ranks
from meshscope.core.rank_end import GroupUse, RankEnd, exit_code
from meshscope.core.trace_result import EXIT_CODES, TraceError, TraceResult
from meshscope.core.trace_spec import TraceSpec
from meshscope.doctor.ends import blocked, order, script_errors
from meshscope.report.trace import bytes_figure, layout_lines, verdict_lines
from meshscope.trace.assemble import assemble
from meshscope.trace.checks import a2a_mirror, axes_partition, group_agreement, p2p_pairs, steady_steps
from meshscope.trace.diff import diff, match_axes
from meshscope.trace.fake.world import failed_alike, fake_notes

from .helpers import ROOT, cli_here, trace_json

JOBS = ROOT / "tests" / "jobs"


def call(rank, seq, op="all_reduce", axis="world", group=(0, 1), b_in=16, b_out=16, step=0, **kw) -> CommEvent:
    return CommEvent(rank, seq, op, axis, tuple(group), kw.pop("phase", "other"), kw.pop("dtype", "float32"), b_in,
                     b_out, step=step, **kw)


def result(ranks, events=(), checks=(), expected=None) -> TraceResult:
    ranks = list(ranks)
    return TraceResult(world=len(ranks), command=["job.py"], events=list(events), axes={}, layout={"text": ""},
                       checks=list(checks), ranks=ranks, expected=len(ranks) if expected is None else expected)


# -- 1. outcomes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ends, events, checks, expected, want", [
    ([RankEnd(0, "ok"), RankEnd(1, "ok")], [call(0, 0), call(1, 0)], [], None, "passed"),
    ([RankEnd(0, "ok"), RankEnd(1, "stopped")], [], [], None, "empty"),  # every rank ended, no call
    ([RankEnd(0, "error", error="the script exited with code 2"), RankEnd(1, "ok")], [], [], None, "failed"),
    ([RankEnd(0, "ok"), RankEnd(1, "missing")], [call(0, 0)], [], None, "incomplete"),
    ([RankEnd(0, "ok"), RankEnd(1, "terminated")], [call(0, 0)], [], None, "incomplete"),
    ([RankEnd(0, "ok")], [call(0, 0)], [], 2, "incomplete"),  # a node's directory that lacks a rank
    ([RankEnd(0, "ok"), RankEnd(1, "ok")], [call(0, 0)], [Check("all-to-all splits mirror", False, "x")], None,
     "failed"),
    ([RankEnd(0, "ok"), RankEnd(1, "ok")], [call(0, 0)], [Check.not_checked("steady steps repeat", "3 steps")], None,
     "passed"),  # a check that could not run fails nothing, and passes nothing either
])
def test_the_outcome_is_decided_in_one_place(ends, events, checks, expected, want):
    r = result(ends, events, checks, expected)
    assert r.outcome == want and r.passed == (want == "passed") and r.exit_code == EXIT_CODES[want]
    doc = r.to_json()
    assert doc["outcome"] == want and doc["passed"] == (want == "passed")
    assert TraceResult.from_json(json.loads(json.dumps(doc))).outcome == want


def test_exit_codes_of_system_exit_are_the_interpreters():
    assert [exit_code(SystemExit(c)) for c in (None, 0, 3, "message")] == [0, 0, 3, 1]


def test_a_sigterm_handler_that_calls_sys_exit_ends_the_rank_with_code_0():
    """trace.stopping's SIGTERM thread runs a script's own handler; sys.exit() there is status 0, as the
    interpreter has it (it was 1 there, and 0 in the rank's other paths)."""
    code = textwrap.dedent("""
        import os, signal, sys, threading, time
        from meshscope.trace.stopping import stop_on_sigterm
        signal.signal(signal.SIGTERM, lambda *a: sys.exit())
        stop_on_sigterm(lambda: os._exit(9))
        # to the waiting thread itself (a process-wide kill may reach a thread that torch's import
        # started before SIGTERM was blocked, which runs the handler on the main thread instead)
        waiter = next(t for t in threading.enumerate() if t.name == "meshscope-trace-stop")
        signal.pthread_kill(waiter.ident, signal.SIGTERM)
        time.sleep(30)
    """)
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, cwd=ROOT)
    assert proc.returncode == 0


def test_records_round_trip_through_their_one_writer_and_reader(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    spec = TraceSpec(world=4, command=("job.py", "--x"), traced=2, expected=(0, 3), fake_world=True, ranks="0,3")
    run_dir.begin(spec)
    assert run_dir.trace_spec() == spec and run_dir.incomplete.exists()
    end = RankEnd(3, "error", steps=2, error="ValueError: x", exit_code=1, exception="ValueError", where="job.py:4",
                  origin="lib.py:9", groups=(GroupUse("0", "default_pg", "world", (0, 1, 2, 3)),), time=1.5)
    run_dir.write_end(end)
    assert run_dir.read_end(3) == end and run_dir.read_end(0).status == "missing"
    run_dir.conclude({"kind": "trace"})
    assert not run_dir.incomplete.exists() and run_dir.read_result() == {"kind": "trace"}


def test_nothing_under_trace_decides_a_verdict_of_its_own():
    """TraceResult.outcome is the one verdict; and every per-rank path is spelled by core.rundir."""
    import re

    src = ROOT / "src" / "meshscope"
    for path in (src / "trace").glob("*.py"):
        assert '["passed"] =' not in path.read_text(), path
    per_rank_path = re.compile(r"rank\{[^}]+\}\.(jsonl?|log)|\"rank_\"")
    offenders = [str(p.relative_to(src)) for p in src.rglob("*.py")
                 if p.name != "rundir.py" and per_rank_path.search(p.read_text())]
    assert offenders == []


def test_an_early_exit_is_empty_not_passed(tmp_path):
    """Every rank initialises its process group and exits at its GPU-count check (the job's docstring):
    the trace is empty, exit 3; its checks say they did not run; the console shows what rank 0 printed,
    its exit code and where its log is; the notes state what the ranks recorded."""
    proc, doc = trace_json(tmp_path / "run", "--nproc-per-node", 2, [str(JOBS / "early_exit.py"), "--gpus", "64"])
    assert proc.returncode == 3 and doc["outcome"] == "empty" and doc["passed"] is False, proc.stderr[-3000:]
    assert {c["status"] for c in doc["checks"]} == {"not_checked"}
    assert "EMPTY: 0 calls on 2 ranks" in proc.stderr
    assert "Unable to locate sufficient 64 gpus to run this example. Exiting." in proc.stderr
    assert f"rank 0 exited with code 0; the last 1 of the 1 lines it printed ({tmp_path / 'run' / 'logs' / 'rank0.log'})" \
        in proc.stderr
    notes = " ".join(doc["notes"])
    assert "initialised the default process group" in notes and "never initialised" not in notes
    assert "no torch.optim optimizer" not in notes  # it issued nothing: there is no step to speak of
    assert "no collective was issued" in doc["layout"]["text"]


def test_an_early_exit_in_a_fake_world_is_empty_and_one_that_exits_non_zero_failed(tmp_path):
    _, empty = trace_json(tmp_path / "empty", "--fake-world", 4, "--ranks", "0,3",
                          [str(JOBS / "early_exit.py"), "--gpus", "64"])
    assert empty["outcome"] == "empty" and empty["last_lines"]["lines"][-1].startswith("Unable to locate sufficient")
    proc, failed = trace_json(tmp_path / "failed", "--fake-world", 4, "--ranks", "0,3",
                              [str(JOBS / "early_exit.py"), "--gpus", "64", "--exit-code", "2"])
    assert proc.returncode == 1 and failed["outcome"] == "failed"
    assert failed["failure"]["rank"] in (0, 3) and failed["failure"]["message"] == "the script exited with code 2"


def test_a_rank_killed_without_a_record_makes_the_trace_incomplete(tmp_path):
    job = tmp_path / "killed.py"
    job.write_text(textwrap.dedent("""
        import os, signal, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(4))
        if dist.get_rank() == 1:   # after rank 0 is done: nobody waits for it in a collective
            time.sleep(1)
            print("rank 1 is going away", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)   # no exception, no exit handler: no record
    """))
    proc, doc = trace_json(tmp_path / "run", "--nproc-per-node", 2, "--timeout", 20, [str(job)])
    assert proc.returncode == 1 and doc["outcome"] == "incomplete", proc.stderr[-3000:]
    assert {r["rank"]: r["status"] for r in doc["ranks"]} == {0: "ok", 1: "missing"}
    assert doc["error"].startswith("torchrun exited with code")  # nobody else could say what happened
    assert "rank 1 is going away" in (tmp_path / "run" / "logs" / "rank1.log").read_text()


# -- 2. checks with three states ------------------------------------------------------------------

def _steps(rank: int, n: int) -> list[CommEvent]:
    return [call(rank, k, step=k) for k in range(n)]


def test_a_check_with_nothing_to_compare_is_not_checked():
    three = [call(r, k, step=k, b_in=16 * k, b_out=16 * k) for r in (0, 1) for k in range(3)]  # no step repeats
    check = steady_steps(three, of_ranks(three, {0: 3, 1: 3}))
    assert check.status == "not_checked" and "trace more" in check.detail
    assert p2p_pairs(three, {0, 1}).status == "not_checked"
    assert a2a_mirror(three, {0, 1}).status == "not_checked"
    assert group_agreement([], {0, 1}).status == "not_checked"
    assert axes_partition({"world": [[0, 1]]}, {0, 1}, 2).status == "not_checked"
    assert Check.from_json(check.to_json()) == check and check.to_json()["passed"] is False


def test_steady_steps_count_steps_per_rank_not_rank_step_pairs():
    """16 steps on each of 4 ranks: steps 1-15 are the steady ones (was "52 steps compared")."""
    events = [e for r in range(4) for e in _steps(r, 16)]
    check = steady_steps(events, of_ranks(events, {r: 16 for r in range(4)}))
    assert check.passed and check.detail.startswith("steady steps 1-15 on each of 4 ranks")


def test_the_verdict_line_names_the_checks_that_did_not_run():
    r = result([RankEnd(0, "ok"), RankEnd(1, "ok")], [call(0, 0), call(1, 0)],
               [Check("group members agree", True, "1 group"), Check.not_checked("steady steps repeat", "3 steps")])
    assert verdict_lines(r) == ["PASSED: 2 calls on 2 ranks (not checked: steady steps repeat)"]


# -- 3. one agreement rule: rooted collectives ------------------------------------------------------

def _scatter(root_list: int, own: int = 64):
    """Rank 0 (the root) scatters a list of two chunks; each rank receives one (scatter_then_raise.py)."""
    return {0: call(0, 0, "scatter", "dp", b_in=root_list, b_out=own, peer=0),
            1: call(1, 0, "scatter", "dp", b_in=0, b_out=own, peer=0)}


def test_a_healthy_scatter_agrees_and_a_wrong_one_does_not():
    assert disagreement((0, 1), _scatter(128)) is None
    assert disagreement((0, 1), _scatter(96)).field == "size"  # the root's list is not 2 x 64 B
    wrong_root = _scatter(128)
    wrong_root[1] = call(1, 0, "scatter", "dp", b_in=0, b_out=64, peer=1)
    assert disagreement((0, 1), wrong_root).field == "root"
    gather = {0: call(0, 0, "gather", b_in=64, b_out=128, peer=0), 1: call(1, 0, "gather", b_in=64, b_out=0, peer=0)}
    assert disagreement((0, 1), gather) is None
    sizes = {0: call(0, 0, b_in=16, b_out=16), 1: call(1, 0, b_in=32, b_out=32)}
    assert disagreement((0, 1), sizes).field == "size"
    assert group_agreement(list(_scatter(128).values()), {0, 1}).passed
    assert not group_agreement(list(sizes.values()), {0, 1}).passed


def test_the_scripts_exception_is_the_root_cause_not_the_scatter_before_it(tmp_path):
    """scatter_then_raise.py: a healthy distribute_tensor scatter, then rank 0's ValueError at the line
    its docstring marks; no rank was blocked in a collective, so the script's error comes first, and
    neither the flight logs nor the Flight Recorder dumps call the scatter a size or shape mismatch. The
    console shows the script's own traceback, without meshscope's frames, and result.json the failure."""
    job = JOBS / "scatter_then_raise.py"
    proc, doc = trace_json(tmp_path / "run", "--nproc-per-node", 2, "--timeout", 30, [str(job)])
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr[-3000:]
    line = next(i for i, text in enumerate(job.read_text().splitlines(), 1) if "the script's own error" in text)
    assert f'File "{job}", line {line}, in load_batch' in proc.stderr and "ValueError: bad batch 7" in proc.stderr
    assert "meshscope/trace" not in proc.stderr.split("ValueError: bad batch 7")[0].rsplit("Traceback", 1)[1]
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert not saved["passed"] and saved["ranks"][0]["error"] == "ValueError: bad batch 7"
    scatter = [e for r in doc["per_rank"] for s in r["steps"] for e in s["events"] if e["op"] == "scatter"]
    assert [(e["rank"], e["bytes_in"], e["bytes_out"]) for e in scatter] == [(0, 128, 64), (1, 0, 64)]
    assert next(c for c in doc["checks"] if c["name"] == "group members agree")["status"] == "passed"
    findings = doc["doctor"]["findings"]
    assert findings[0]["kind"] == "script-error" and findings[0]["root_cause"] and findings[0]["ranks"] == [0]
    assert findings[0]["entry"].startswith("ValueError: bad batch 7 at ") and \
        findings[0]["entry"].endswith(f"scatter_then_raise.py:{line}")
    assert not [f for f in findings if f["kind"] in ("mismatch", "shape")], findings


def test_a_blocked_rank_keeps_the_findings_in_time_order():
    """Both orders: with no rank blocked the script's error leads; with a rank whose error is a collective
    timeout, the hang found earlier stays first and the script's later error follows it."""
    hang = Finding("missing", "dp", [0, 1], [0], "collective #3 of dp[0, 1]: all_reduce", "rank 0 never issued it", t=1.0)
    raised = RankEnd(0, "error", error="RuntimeError: late", exception="RuntimeError", where="job.py:9", time=2.0)
    timed_out = RankEnd(1, "error", error="RuntimeError: [gloo] Timed out waiting 5000ms for recv operation",
                        exception="RuntimeError", time=1.5)
    run_dir = RunDir("/nonexistent")
    [script] = script_errors([raised, timed_out], run_dir)
    assert script.kind == "script-error" and script.ranks == [0] and "job.py:9" in script.entry
    assert timed_out.timed_out and not timed_out.script_error and raised.script_error
    cut_off = RankEnd(1, "error", error="RuntimeError: [gloo] Read error: Connection reset by peer", time=1.5)
    assert cut_off.collective_failure and not cut_off.timed_out and blocked([raised, cut_off], {}) == []
    assert [f.kind for f in order([hang, script], blocked([raised], {}))] == ["script-error", "missing"]
    assert blocked([raised, timed_out], {}) == [1]
    assert [f.kind for f in order([hang, script], blocked([raised, timed_out], {}))] == ["missing", "script-error"]


def test_a_rank_waiting_in_a_call_a_peer_went_past_is_blocked():
    """DDP's unused parameters: rank 1 skipped bucket all-reduce #1 of step 0 and finished the step
    (then raised at its next forward); rank 0 waits in #1 when it is stopped: blocked, so the hang's
    finding keeps its place before rank 1's later error. A peer that stopped before the call (it raised
    there, step 0 not finished) leaves rank 0 not blocked."""
    from meshscope.doctor.evidence import RankLog, key

    wait = call(0, 1, step=0)
    issued = [call(0, 0, step=0), wait]
    rank0 = RankLog(0, [], issued, {key(issued[0])}, {key(e): 1.0 for e in issued})
    stopped = RankEnd(0, "terminated", error="SIGTERM from outside")
    went_on = RankLog(1, [], [call(1, 0, step=0)], {key(call(1, 0))}, {}, last_mark="step 1 done", marked={1: 1.2})
    assert blocked([stopped], {0: rank0, 1: went_on}) == [0]
    stayed = RankLog(1, [], [call(1, 0, step=0)], {key(call(1, 0))}, {}, last_mark=None)
    assert blocked([stopped], {0: rank0, 1: stayed}) == []
    other = RankLog(1, [], [call(1, 0, step=0), call(1, 1, "barrier", b_in=0, b_out=0)], set(), {})
    assert blocked([stopped], {0: rank0, 1: other}) == [0]  # it issued something else at #1


def test_a_call_a_peer_went_past_is_dated_when_it_went_past():
    """Under load (CI, 2026-12-03): rank 1 finished step 0 without bucket all-reduce #1 at 1.2 s and raised
    at its next forward at 1.5 s, before a slow rank 0 issued #1 at 2.0 s. The hang began at 1.2 s, when
    rank 1 went past it, so it stays the root cause ahead of rank 1's error; dated by its issue, the
    error led."""
    from meshscope.doctor.collective import collectives
    from meshscope.doctor.evidence import RankLog, key

    issued = [call(0, 0, step=0, phase="backward"), call(0, 1, step=0, phase="backward")]
    rank0 = RankLog(0, [], issued, {key(issued[0])}, {key(issued[0]): 1.0, key(issued[1]): 2.0})
    went_on = RankLog(1, [], [call(1, 0, step=0, phase="backward")], {key(call(1, 0))}, {key(call(1, 0)): 1.0},
                      last_mark="step 1 done", marked={1: 1.2})
    [hang] = collectives({0: rank0, 1: went_on})
    assert hang.kind == "ddp-unused" and hang.t == 1.2 and not hang.derived
    raised = RankEnd(1, "error", error="RuntimeError: Expected to have finished reduction in the prior iteration",
                     exception="RuntimeError", where="job.py:49", time=1.5)
    [script] = script_errors([raised], RunDir("/nonexistent"))
    stopped = RankEnd(0, "terminated", error="SIGTERM from outside")
    assert [f.kind for f in order([script, hang], blocked([stopped, raised], {0: rank0, 1: went_on}))] == \
        ["ddp-unused", "script-error"]


# -- 4. diff -------------------------------------------------------------------------------------

def _trace_dir(path, ends: dict[int, str], events: list[CommEvent], world: int = 2, fake: bool = False,
               expected=None) -> RunDir:
    run_dir = RunDir(path)
    run_dir.begin(TraceSpec(world=world, command=("job.py",), traced=len(ends),
                            expected=tuple(sorted(ends)) if expected is None else expected, fake_world=fake))
    for rank, status in ends.items():
        run_dir.write_end(RankEnd(rank, status, steps=1, error="" if status == "ok" else "boom"))
        mine = [e for e in events if e.rank == rank]
        run_dir.ledger(rank).parent.mkdir(exist_ok=True)
        run_dir.ledger(rank).write_text("".join(json.dumps(e.to_json()) + "\n" for e in mine))
        run_dir.flight(rank).parent.mkdir(exist_ok=True)
        run_dir.flight(rank).write_text("")
    return run_dir


def _world(axis="world", n=2, ranks=(0, 1)):
    return [call(r, k, axis=axis, group=tuple(range(n))) for r in ranks for k in range(2)]


def test_diff_of_a_side_that_failed_is_not_comparable(tmp_path, capsys):
    a = _trace_dir(tmp_path / "a", {0: "ok", 1: "ok"}, _world())
    b = _trace_dir(tmp_path / "b", {0: "ok", 1: "error"}, _world(ranks=(0,)))
    d = diff(a.path, b.path)
    assert d.verdict == "not_comparable" and not d.same and d.exit_code == 3
    assert "ranks [1] error" in d.reasons[0]
    from meshscope.cli.trace_command import cmd_diff

    assert cmd_diff(argparse.Namespace(dir_a=a.path, dir_b=b.path, json=False)) == 3
    assert "not comparable" in capsys.readouterr().out
    assert diff(a.path, a.path).verdict == "same"


def test_diff_compares_the_ranks_a_fake_world_traced_and_says_so(tmp_path):
    real = _trace_dir(tmp_path / "real", {r: "ok" for r in range(4)}, _world(n=4, ranks=range(4)), world=4)
    fake = _trace_dir(tmp_path / "fake", {0: "ok", 3: "ok"}, _world(n=4, ranks=(0, 3)), world=4, fake=True)
    d = diff(real.path, fake.path)
    assert d.verdict == "same" and d.ranks == [0, 3] and d.not_traced == {"a": [], "b": [1, 2]}


def test_diff_matches_axes_by_their_groups_then_by_name(tmp_path):
    """torchtitan's two SPMD backends name the same FSDP groups dp_shard and fsdp: one axis, whose real
    difference (a third call) is the only row, under both names."""
    a_events = _world("dp_shard") + [call(r, 2, axis="tp", group=(0, 1)) for r in (0, 1)]
    b_events = _world("fsdp") + [call(r, 2, axis="fsdp", group=(0, 1)) for r in (0, 1)] + \
        [call(r, 3, axis="cp", group=(r,)) for r in (0, 1)]
    a = _trace_dir(tmp_path / "a", {0: "ok", 1: "ok"}, a_events)
    b = _trace_dir(tmp_path / "b", {0: "ok", 1: "ok"}, b_events)
    d = diff(a.path, b.path)
    matches = {(m.a, m.b, m.by) for m in d.axes}
    assert ("dp_shard", "fsdp", "members") in matches and (None, "cp", None) in matches
    rows = {(r["axis_a"], r["axis_b"], r["op"]): (r["count_a"], r["count_b"]) for r in d.rows}
    assert rows[("dp_shard", "fsdp", "all_reduce")] == (4, 6) and rows[(None, "cp", "all_reduce")] == (0, 2)
    assert d.verdict == "differ" and d.first_divergence[0]["axis_b"] == "fsdp"
    assert {(m.a, m.b) for m in match_axes({"tp": {(0, 1)}}, {"tp": {(0, 2)}})} == {("tp", "tp")}  # then by name


# -- 5. notes true by construction ----------------------------------------------------------------

def test_the_process_group_note_rests_on_the_group_records(tmp_path):
    """No call and no record of init_process_group: "no rank initialised"; with the record (as
    trace.created writes it): the ranks did, and ended before their first collective."""
    run_dir = _trace_dir(tmp_path / "run", {0: "ok"}, [], world=1)
    assert "no rank initialised a process group" in " ".join(assemble(run_dir).notes)
    run_dir.groups(0).parent.mkdir(exist_ok=True)
    run_dir.groups(0).write_text(json.dumps({"t": 1.0, "kind": "initialised", "world": 1}) + "\n")
    notes = " ".join(assemble(run_dir).notes)
    assert "initialised the default process group" in notes and "no rank initialised" not in notes


def test_fake_world_notes_name_only_what_the_trace_holds():
    plain = result([RankEnd(0, "ok")], [call(0, 0)])
    assert fake_notes(plain) == []
    a2a = call(0, 1, "all_to_all", input_splits=(1, 1), output_splits=(1, 1), assumed=("output_splits", "bytes_out"))
    recv = call(0, 2, "recv", b_in=0, peer=1)
    notes = fake_notes(result([RankEnd(0, "ok")], [a2a, recv]))
    assert "1 calls carry an `assumed` field" in notes[0] and "a receive gets no data" in notes[1]


# -- 6. --ranks auto stops when its first ranks fail alike ----------------------------------------

def test_failed_alike_needs_the_same_exception_at_the_same_place():
    a = RankEnd(0, "error", error="ValueError: x", exception="ValueError", where="job.py:4")
    b = RankEnd(15, "error", error="ValueError: x", exception="ValueError", where="job.py:4")
    elsewhere = RankEnd(15, "error", error="ValueError: x", exception="ValueError", where="job.py:5")
    assert failed_alike([a, b]) == "ValueError at job.py:4"
    assert failed_alike([a, elsewhere]) is None and failed_alike([a, RankEnd(15, "ok")]) is None
    # a failure after integers made up for a peer's may be the fake world's: the other classes are traced
    guessed = RankEnd(15, "error", error="ValueError: x", exception="ValueError", where="job.py:4",
                      made_up="broadcast on default_pg [0-15] at step 0 (rank 0 not traced before it): it held the "
                              "rank's own")
    assert failed_alike([a, guessed]) is None


def test_ranks_auto_stops_after_its_first_ranks_fail_the_same_way(tmp_path):
    job = tmp_path / "raises.py"
    job.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                   "def step():\n    raise ValueError('bad batch 7')\nstep()\n")
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 16, [str(job)])
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr[-3000:]
    assert sorted(r["rank"] for r in doc["ranks"]) == sorted(doc["fake_world"]["traced"]) and \
        len(doc["fake_world"]["traced"]) <= 2
    assert any("failed the same way (ValueError at" in n for n in doc["notes"])
    assert proc.stderr.count("tracing ranks") == 1  # the classes were never traced one by one
    first = doc["failure"]["rank"]  # the first of the two to fail, by when it wrote its end
    assert first in (0, 15) and str(tmp_path / "run" / "logs" / f"rank{first}.log") in proc.stderr
    assert "ValueError: bad batch 7" in proc.stderr
    assert "<frozen runpy>" not in proc.stderr  # the script's traceback, without the frames that ran it


# -- 7. output at scale ---------------------------------------------------------------------------

def test_the_layout_block_stays_short_at_1024_ranks():
    world = 1024
    axes = {"tp": [list(range(g * 8, g * 8 + 8)) for g in range(128)],
            "dp": [list(range(r, world, 8)) for r in range(8)]}
    r = result([RankEnd(0, "ok")])
    r.world, r.axes, r.layout = world, axes, {"text": "tp 8, dp 128"}
    lines = layout_lines(r)
    assert len(lines) <= 30 and lines[2] == "  dp: 8 groups of 128, e.g. [0, 8, 16, 24, 32, 40, 48, ..., 1016]"
    r.axes = {f"axis{i}": [[0]] for i in range(40)}
    assert len(layout_lines(r)) == 30


def test_a_figure_of_16_axes_keeps_its_legend_inside_and_its_colours_apart():
    events = [call(0, i, axis=f"axis{i:02d}", group=(0,), b_in=2 ** 20, b_out=2 ** 20) for i in range(16)]
    fig = bytes_figure(result([RankEnd(0, "ok")], events))
    fig.canvas.draw()
    box = fig.bbox
    [legend] = fig.legends
    inside = legend.get_window_extent()
    assert box.x0 <= inside.x0 and inside.x1 <= box.x1 and box.y0 <= inside.y0 and inside.y1 <= box.y1
    colours = {tuple(c.patches[0].get_facecolor()) for c in fig.axes[0].containers}
    assert len(fig.axes[0].containers) == 16 and len(colours) == 16


# -- 8. --out ------------------------------------------------------------------------------------

def test_every_out_failure_is_one_line(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    for out, needle in ((f"/proc/meshscope-{tmp_path.name}", "cannot be written"),
                        (regular / "below", "is a file, not a directory")):
        with pytest.raises(UsageError, match=needle):
            RunDir(out).check()
        proc = cli_here("trace", "--out", out, "--", str(JOBS / "ddp.py"))
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and regular.read_text() == "x"


def test_a_trace_error_names_the_log_of_the_failed_rank():
    assert TraceError("ValueError: x", 3, "/run/logs/rank3.log").line() == \
        "rank 3: ValueError: x (its output: /run/logs/rank3.log)"


def test_a_group_made_of_numpy_ranks_is_noted(tmp_path):
    """nanotron passes numpy integers to ``new_group`` (torch takes them): the group's creation line must
    still be written (it raised 'Object of type int64 is not JSON serializable', blamed on the script)."""
    job = tmp_path / "np_ranks.py"
    job.write_text("import numpy as np, torch, torch.distributed as dist\n"
                   "dist.init_process_group('gloo')\n"
                   "g = dist.new_group(list(np.arange(2)))\n"
                   "dist.all_reduce(torch.ones(2), group=g)\n"
                   "dist.destroy_process_group()\n")
    proc = cli_here("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--json", "--", job)
    assert proc.returncode == 0 and json.loads(proc.stdout)["outcome"] == "passed", proc.stderr[-2000:]
