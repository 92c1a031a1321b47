"""The doctor names planted faults: on synthetic flight logs (fast, pins its logic) and on real injected runs.

Injected runs: each kind is launched once with ``--timeout 6``; the launches run three at a time in
one module fixture, because most of a hung run's time is spent waiting for its collective timeout.
"""

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from meshscope.core.events import CommEvent
from meshscope.core.mesh import Layout
from meshscope.doctor import diagnose, render
from meshscope.doctor.collective import collectives, group_order
from meshscope.doctor.evidence import load
from meshscope.doctor.p2p import p2p
from meshscope.doctor.prediction import dp_wrong_group

from .helpers import cli, cli_here, run_module

# -- synthetic flight logs ------------------------------------------------------------------------
AXES = {(0, 1): "pp", (0, 2): "dp"}
"""Default axis of a synthetic call's group."""


def call(rank, op, group, t, done=True, **fields):
    """The flight-log lines of one call: issued at `t`, completed unless `done` is False."""
    e = CommEvent(rank=rank, seq=fields.pop("seq", 0), op=op, axis=fields.pop("axis") if "axis" in fields else AXES[group],
                  group=group, phase=fields.pop("phase", "forward"), dtype="float32",
                  bytes_in=fields.pop("bytes_in", 1024 if op != "recv" else 0),
                  bytes_out=fields.pop("bytes_out", 1024 if op != "send" else 0), **fields)
    done_line = {"t": t + 0.01, "kind": "completed", "axis": e.axis, "group": list(group), "seq": e.seq}
    return [{"t": t, "kind": "issued", **e.to_json()}] + ([done_line] if done else [])


def write_run(tmp_path, logs: dict, errors: dict | None = None):
    """A run directory with rank -> [flight-log lines] and rank -> error message."""
    (tmp_path / "flight").mkdir()
    for rank, lines in logs.items():
        (tmp_path / "flight" / f"rank{rank}.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    if errors:
        (tmp_path / "errors").mkdir()
        for rank, error in errors.items():
            (tmp_path / "errors" / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "error": error}))
    return tmp_path


def test_split_mismatch_names_both_ranks_and_the_rows(tmp_path):
    a2a = dict(axis="ep", group=(0, 1), t=1)
    write_run(tmp_path, {0: call(0, "all_to_all", input_splits=(2, 2), output_splits=(2, 2), **a2a),
                         1: call(1, "all_to_all", input_splits=(2, 2), output_splits=(3, 2), **a2a)})
    [f] = collectives(load(tmp_path))
    assert (f.kind, f.axis, f.ranks) == ("mismatch", "ep", [0, 1])
    assert "rank 0 sends 2 rows to rank 1, which expects 3" in f.cause


def test_a_hang_with_no_call_pending_is_placed_by_the_last_progress_marks(tmp_path):
    # timing records no calls: a rank stuck there leaves only its marks
    def mark(t, text):
        return {"t": t, "kind": "mark", "text": text}

    logs = {r: call(r, "all_reduce", (0, 1), 1, axis="tp") + [mark(2, "verify done"), mark(3, f"time tp_ar_b32 r{r}")]
            for r in (0, 1)}
    report = diagnose(write_run(tmp_path, logs, errors={1: "no rank made progress for 70 s"}))
    assert not report.findings and report.last_marks == {0: "time tp_ar_b32 r0", 1: "time tp_ar_b32 r1"}
    assert render(report)[-1] == "last progress: rank 0 'time tp_ar_b32 r0'; rank 1 'time tp_ar_b32 r1'"


def test_p2p_size_mismatch(tmp_path):
    write_run(tmp_path, {0: call(0, "send", (0, 1), 1, peer=1, bytes_in=1024),
                         1: call(1, "recv", (0, 1), 1, peer=0, bytes_out=2048)})
    [f] = p2p(load(tmp_path))
    assert (f.kind, f.axis, f.ranks) == ("p2p", "pp", [0, 1])
    assert f.entry.startswith("message #0 0->1") and "size mismatch" in f.cause


def test_p2p_both_send_first_and_block(tmp_path):
    logs = {0: call(0, "send", (0, 1), 1, peer=1) + call(0, "send", (0, 1), 2, done=False, seq=1, peer=1),
            1: call(1, "recv", (0, 1), 1, peer=0) + call(1, "send", (0, 1), 2, done=False, seq=1, peer=0,
                                                        phase="backward")}
    [f] = p2p(load(write_run(tmp_path, logs)))
    assert (f.kind, f.axis, f.ranks) == ("p2p", "pp", [0, 1])
    assert "P2P #1 between 0 and 1: both send first" in f.entry and "order mismatch" in f.cause


def test_complementary_p2p_is_healthy(tmp_path):
    logs = {0: call(0, "send", (0, 1), 1, peer=1) + call(0, "recv", (0, 1), 2, seq=1, peer=1),
            1: call(1, "recv", (0, 1), 1, peer=0) + call(1, "send", (0, 1), 2, seq=1, peer=0)}
    report = diagnose(write_run(tmp_path, logs))
    assert report.healthy and report.findings == []
    assert render(report) == ["no problem found in the flight logs of ranks [0, 1]"]


def test_send_without_recv_quotes_the_silent_rank_error(tmp_path):
    logs = {0: call(0, "send", (0, 1), 1, peer=1) + call(0, "send", (0, 1), 2, seq=1, peer=1),
            1: call(1, "recv", (0, 1), 1, peer=0)}
    [f] = p2p(load(write_run(tmp_path, logs)), {1: "RuntimeError: P2P shape mismatch"})
    assert f.ranks == [0, 1] and f.entry.startswith("message #1 0->1: rank 0 issued send")
    assert "a send without the matching recv" in f.cause and "rank 1 stopped with: RuntimeError: P2P shape" in f.cause


def test_group_order(tmp_path):
    group = lambda axis, ranks, i: {"t": i, "kind": "group", "axis": axis, "ranks": ranks, "index": i}  # noqa: E731
    write_run(tmp_path, {0: [group("tp", [0, 1], 0), group("dp", [0, 2], 1)],
                         1: [group("dp", [1, 3], 0), group("tp", [0, 1], 1)]})
    [f] = group_order(load(tmp_path))
    assert (f.kind, f.ranks) == ("group-order", [1])
    assert "new_group #0: rank 1 created dp[1, 3], rank 0 created tp[0, 1]" in f.entry


def creations(tmp_path, per_rank: dict):
    """groups/rank<R>.jsonl of a traced job: rank -> [(desc, ranks, returned, members-only)]."""
    (tmp_path / "groups").mkdir()
    for rank, calls in per_rank.items():
        lines = []
        for i, (desc, ranks, done, local) in enumerate(calls):
            lines.append({"t": i, "kind": "creating", "index": i, "desc": desc, "ranks": ranks, "local": local})
            lines += [{"t": i + 0.5, "kind": "created", "index": i, "name": str(i + 1)}] if done else []
        (tmp_path / "groups" / f"rank{rank}.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))


def test_group_creations_in_another_order_while_one_rank_is_stuck(tmp_path):
    """Rank 1 is stuck creating dp (its first), which rank 0 creates second: the order, not the members,
    differs; a members-only group (use_local_synchronization) is no part of the protocol."""
    write_run(tmp_path, {0: [], 1: []})
    creations(tmp_path, {0: [("metrics", [0], True, False), ("dp", [0, 1], False, False)],
                         1: [("side", [1], True, True), ("dp", [0, 1], False, False)]})
    [f] = diagnose(tmp_path).to_json()["findings"]
    assert (f["kind"], f["axis"], f["group"], f["ranks"]) == ("group-order", "dp", [0, 1], [0, 1])
    assert "rank 1 created dp[0, 1], rank 0 created metrics[0] (rank 1 is stuck creating dp[0, 1])" in f["entry"]


def test_group_built_with_other_members_is_group_members(tmp_path):
    write_run(tmp_path, {0: [], 1: []})
    creations(tmp_path, {0: [("tp", [0, 1], False, False)], 1: [("tp", [0], True, False), ("tp", [1], True, False)]})
    [f] = diagnose(tmp_path).to_json()["findings"]
    assert (f["kind"], f["axis"]) == ("group-members", "tp")
    assert "rank 1 a group of 1 [0], rank 0 a group of 2 [0, 1]" in f["cause"]


def test_fewer_bucket_all_reduces_in_one_backward_is_ddp_unused(tmp_path):
    """Rank 1 stepped past step 2 having issued none of the 2 gradient all-reduces rank 0 waits in."""
    def bucket(rank, seq, step, t, done=True):
        return call(rank, "all_reduce", (0, 1), t, done, axis="dp", seq=seq, step=step, phase="backward")

    mark = {"t": 9, "kind": "mark", "text": "step 3 done", "step": 3}  # as `trace.recording` writes it
    write_run(tmp_path, {0: bucket(0, 0, 1, 1) + bucket(0, 1, 2, 2, done=False),
                         1: bucket(1, 0, 1, 1) + [mark]})
    first = diagnose(tmp_path).to_json()["findings"][0]
    assert (first["kind"], first["axis"], first["ranks"]) == ("ddp-unused", "dp", [1])
    assert "in step 2's backward rank 1 issued 0 gradient all-reduces on this group and rank 0 1" in first["cause"]


def test_dp_wrong_group(tmp_path):
    sync = dict(axis="tp", phase="optimizer", region="dp.grad_sync:fc1.weight")
    write_run(tmp_path, {0: call(0, "all_reduce", (0, 1), 1, **sync), 1: call(1, "all_reduce", (0, 1), 1, **sync)})
    [f] = dp_wrong_group(load(tmp_path), Layout(4, tp=2))
    assert (f.kind, f.axis, f.group) == ("dp-wrong-group", "tp", [0, 1])
    assert "gradient of fc1.weight averaged over tp[0, 1]" in f.entry and "their tp differ" in f.cause
    assert "the dp group of rank 0 is [0, 2]" in f.cause


def test_earliest_finding_is_the_root_cause(tmp_path):
    """A P2P deadlock at t=1 leaves rank 2 waiting in a DP all_reduce at t=2 that rank 0 never reaches."""
    logs = {0: call(0, "send", (0, 1), 1, done=False, peer=1),
            1: call(1, "send", (0, 1), 1, done=False, peer=0),
            2: call(2, "all_reduce", (0, 2), 2, done=False)}
    report = diagnose(write_run(tmp_path, logs))
    kinds = [(f["kind"], f["axis"], f["root_cause"]) for f in report.to_json()["findings"]]
    assert kinds == [("p2p", "pp", True), ("missing", "dp", False)]
    assert render(report)[0].startswith("likely root cause: [p2p] pp[0, 1] ranks [0, 1]")


def test_a_wait_for_a_blocked_rank_follows_the_block(tmp_path):
    """Split mismatch in ep[0, 1] at t=2 blocks rank 1 in the next all_to_all (t=3); rank 3 of a faster
    EP group already waits (t=1) for rank 1 in the expert-DP sync: that wait is a consequence."""
    a2a = dict(axis="ep", group=(0, 1))
    logs = {0: call(0, "all_to_all", t=2, input_splits=(2, 2), output_splits=(2, 2), **a2a),
            1: call(1, "all_to_all", t=2, input_splits=(2, 2), output_splits=(3, 2), **a2a)
            + call(1, "all_to_all", t=3, done=False, seq=1, input_splits=(3, 2), output_splits=(2, 2), **a2a),
            3: call(3, "all_reduce", (1, 3), 1, done=False, axis="edp")}
    findings = diagnose(write_run(tmp_path, logs)).to_json()["findings"]
    assert [(f["kind"], f["axis"], f["derived"]) for f in findings] == [("mismatch", "ep", False),
                                                                        ("missing", "edp", True)]


def test_gradient_never_sent_back_is_pp_no_grad(tmp_path):
    """Stage 1 received activation 0 in two steps and never sent a gradient; stage 0 waits for it."""
    act = dict(region="pp.boundary0.activation", microbatch=0, peer=0)
    logs = {0: call(0, "send", (0, 1), 1, peer=1) + call(0, "recv", (0, 1), 2, seq=1, peer=1, phase="backward"),
            1: call(1, "recv", (0, 1), 1, **act) + call(1, "recv", (0, 1), 3, seq=1, **act)}
    [f] = diagnose(write_run(tmp_path, logs)).to_json()["findings"]  # the unanswered recv is the same fault, not a 2nd
    assert (f["kind"], f["group"], f["ranks"]) == ("pp-no-grad", [0, 1], [1])
    assert "sent no gradient back; rank 0 waits in its recv backward" in f["summary"]


# -- injected runs --------------------------------------------------------------------------------
PP_SMALL = ("--hidden", 64, "--ffn", 128, "--batch", 8)
EP_SMALL = ("--hidden", 32, "--batch", 16, "--steps", 1)
CASES = {
    # kind: (experiment, extra args, first finding's kind, text its summary must contain)
    "group-order": ("collectives", (), "group-order", "new_group #0: rank 1 created"),
    "missing-collective": ("collectives", (), "mismatch", "rank 1 skipped that collective"),
    "dp-wrong-group": ("tp_ar_b32", (), "dp-wrong-group", "gradient of fc1.weight averaged over tp[0, 1]"),
    "p2p-shape": ("pp_mb1", ("--world", 2, *PP_SMALL), "p2p",
                  "pp[0, 1] ranks [0, 1]: message #1 0->1: rank 0 issued send forward 4 KiB in pp.boundary0.activation;"
                  " rank 1 never posted the recv -- a send without the matching recv: one side waits forever; rank 1 "
                  "last issued recv forward 24 B on pp[0, 1] (completed); rank 1 stopped with: RuntimeError: P2P shape "
                  "mismatch: rank 1 (stage 1) expects 1 activations of [9, 128] from rank 0 (stage 0), which sends 1 of "
                  "[8, 128]"),
    "p2p-order": ("pp_1f1b_mb8", ("--microbatches", 2, *PP_SMALL), "p2p",
                  "pp[0, 1] ranks [0, 1]: P2P #2 between 0 and 1: both send first"),
    "pp-no-grad": ("pp_mb1", ("--world", 2, *PP_SMALL), "pp-no-grad",
                   "pp[0, 1] ranks [1]: rank 1 received 3 forward messages from rank 0, ran past their backward and "
                   "sent no gradient back; rank 0 waits in its recv backward"),
    "split-mismatch": ("ep_balanced", EP_SMALL, "mismatch",
                       "ep[0, 1] ranks [0, 1]: collective #0 of ep[0, 1]: rank 0 all_to_all forward 2 KiB splits "
                       "[8, 8]->[8, 8] in moe.dispatch; rank 1 all_to_all forward 2.1 KiB splits [8, 8]->[9, 8]"),
    "no-input-grad": ("ep_balanced", EP_SMALL, "pruned-a2a",
                      "ep[0, 1] ranks [0, 1]: 4 all_to_all predicted per step, 3 issued; missing: all_to_all backward"),
}


@pytest.fixture(scope="module")
def injected(tmp_path_factory):
    """kind -> (completed `meshscope run --inject` process, its run directory), three launches at a time."""
    def run(kind):
        experiment, extra, _, _ = CASES[kind]
        out = tmp_path_factory.mktemp(kind)
        proc = cli("run", experiment, *extra, "--inject", kind, "--timeout", 6, "--out", out, "--json", timeout=300)
        return kind, (proc, out)

    with ThreadPoolExecutor(3) as pool:
        return dict(pool.map(run, CASES))


@pytest.mark.parametrize("kind", list(CASES))
def test_injected_fault_is_named_first(injected, kind):
    proc, out = injected[kind]
    _, _, expect_kind, expect_text = CASES[kind]
    assert proc.returncode == 1, proc.stderr[-2000:]
    # The ranks ended on their own collective timeout (or error): the launcher's watchdog was not needed,
    # and no rank of the run outlived it.
    assert "no rank made progress" not in proc.stderr, (out / "launcher.log").read_text()[-3000:]
    assert subprocess.run(["pgrep", "-f", str(out)], capture_output=True).returncode == 1
    assert f"meshscope doctor: [{expect_kind}]" in proc.stderr  # the launcher ran the doctor
    report = diagnose(out).to_json()
    assert not report["healthy"]
    first = report["findings"][0]
    assert first["root_cause"] and first["kind"] == expect_kind and expect_text in first["summary"], report["findings"]
    # --json: stdout is one document, and it carries the doctor's findings (not only stderr)
    doc = json.loads(proc.stdout)
    assert doc["passed"] is False and doc["doctor"]["findings"][0]["kind"] == expect_kind


def test_a_skipped_collective_ends_on_its_timeout_and_names_a_rank_that_failed(injected):
    """Rank 1 skips a collective its peers wait in: a rank's 6 s collective timeout ended the run (the
    launcher's watchdog, which would have said "no rank made progress", was not needed: checked above);
    the run's one error is the first one a rank recorded, and no result was written."""
    proc, out = injected["missing-collective"]
    assert json.loads(proc.stdout)["error"].startswith("rank ")
    errors = [json.loads(p.read_text())["error"] for p in (out / "errors").glob("rank*.json")]
    assert any("Timed out waiting 6000ms" in e for e in errors), errors
    assert not (out / "result.json").exists()


def test_doctor_cli_marks_the_root_cause(injected):
    _, out = injected["p2p-order"]
    text = cli_here("doctor", out)
    assert text.returncode == 1 and "\nlikely root cause: [p2p] pp[0, 1] ranks [0, 1]" in text.stdout
    report = json.loads(cli_here("doctor", out, "--json").stdout)
    assert [f["root_cause"] for f in report["findings"]][:2] == [True, False]


def test_doctor_on_missing_directory_is_a_usage_error(tmp_path):
    proc = cli_here("doctor", tmp_path / "nope")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = cli_here("run", "collectives", "--inject", "p2p-shape")
    assert proc.returncode == 2 and "not available for collectives" in proc.stderr
    proc = cli_here("run", "pp_mb1", "--inject", "p2p-order")
    assert proc.returncode == 2 and "p2p-order fault needs an exchange carrying messages both ways" in proc.stderr


def test_a_healthy_run_has_no_findings_and_a_reused_directory_starts_clean(injected, tmp_path):
    """A healthy 2-rank run into (a copy of) the directory the 4-rank missing-collective run left: it
    starts clean, so neither that run's log lines nor its ranks 2 and 3 nor its errors are read."""
    shutil.copytree(injected["missing-collective"][1], tmp_path / "run")
    proc = cli_here("run", "collectives", "--world", 2, "--tp", 2, "--out", tmp_path / "run", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # one run's worth of log lines per rank, not two: the second run did not append to the first's
    first = (tmp_path / "run" / "flight" / "rank0.jsonl").read_text().splitlines()
    assert sum('"text": "collectives (1/1): running"' in line for line in first) == 1
    proc = cli_here("doctor", tmp_path / "run", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["healthy"] and report["findings"] == [] and report["ranks"] == [0, 1]


LATE_RANK = """
import datetime, os, time
import torch, torch.distributed as dist
from meshscope.core.groups import init_default_group


def main(argv):
    late_s, timeout_s = float(argv[0]), float(argv[1])
    rank = int(os.environ["RANK"])
    if rank == 1:
        time.sleep(late_s)
    init_default_group("gloo", rank, int(os.environ["WORLD_SIZE"]), datetime.timedelta(seconds=timeout_s))
    dist.all_reduce(torch.ones(1))
    if rank == 0:  # rank 1 never sends, and stays until this receive has timed out
        began = time.monotonic()
        try:
            dist.recv(torch.zeros(1), src=1)
        except RuntimeError as exc:
            print(f"recv ended after {time.monotonic() - began:.1f} s: {'Timed out' in str(exc)}", flush=True)
    else:
        time.sleep(timeout_s + 2)
    return 0
"""


def test_the_default_group_waits_for_a_late_rank_and_its_calls_keep_the_timeout(tmp_path):
    """`meshscope run`'s ranks start their default group with `init_default_group`: a rank 2.5 s late
    no longer fails the rendezvous of a run whose collective timeout is 1 s (CI, 2026-12-03:
    "DistStoreError: wait timeout after 6000ms" before the planted fault), and a receive its peer
    never answers still times out after 1 s, not after the start-up allowance. Launched as ``meshscope run``
    launches its ranks (`run.agent`: torchrun's agent, the ranks forked)."""
    (tmp_path / "late_rank.py").write_text(LATE_RANK)
    proc = run_module("meshscope.run.agent", "--standalone", "--nproc-per-node", 2, "-m", "late_rank", "2.5", "1",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("recv ended after"))
    waited, timed_out = line.removeprefix("recv ended after ").split(" s: ")
    assert 0.8 < float(waited) < 10 and timed_out == "True", line
