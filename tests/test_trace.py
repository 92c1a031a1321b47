"""`meshscope trace` on real, unmodified jobs (tests/jobs/), each ledger checked against a source
independent of meshscope: DDP's own bucket sizes, FSDP2's one collective per unit, torch's
CommDebugMode, the pipeline schedule's order counted by hand, the MoE job's skew counted by hand,
Megatron-core's own group getters."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from meshscope.cli.trace_command import cmd_diff
from meshscope.core.trace_result import TraceResult

from .helpers import ROOT, TORCH, cli, cli_here, trace_json

JOBS = ROOT / "tests" / "jobs"

RUNS = {
    # name: (nproc, meshscope's own flags, job args)
    "ddp": (2, [], ["ddp.py", "--steps", "4", "--print-buckets"]),
    # meshscope's --steps ends a job that would run on (100,000 steps) once every rank finished 3
    "fsdp2": (2, ["--steps", "3"], ["fsdp2.py", "--steps", "100000"]),
    "tp": (2, [], ["dtensor_tp.py", "--steps", "3", "--comm-debug"]),
    "sp": (2, [], ["dtensor_tp.py", "--steps", "3", "--comm-debug", "--sequence-parallel"]),
    "fsdp_tp": (4, [], ["fsdp_tp.py", "--steps", "3"]),
    "gpipe": (2, [], ["pipelining.py", "--steps", "3", "--schedule", "gpipe"]),
    "1f1b": (2, [], ["pipelining.py", "--steps", "3", "--schedule", "1f1b"]),
    "moe": (2, [], ["moe_a2a.py", "--steps", "3"]),
    "compiled": (2, [], ["compiled.py", "--steps", "3"]),
    "fresh_modules": (2, [], ["fresh_modules.py", "--steps", "4"]),
    "closure": (2, [], ["closure.py", "--steps", "4"]),
}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """name -> (completed `meshscope trace --json` process, its document), two launches at a time."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in RUNS}  # here: mktemp is not thread-safe

    def run(name):
        nproc, flags, job = RUNS[name]
        out = dirs[name]
        proc = cli("trace", "--nproc-per-node", nproc, *flags, "--out", out / "run", "--json", "--",
                   str(JOBS / job[0]), *job[1:], timeout=240)
        return name, (proc, json.loads(proc.stdout) if proc.stdout.strip() else None)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, RUNS))


def _result(traced, name) -> TraceResult:
    proc, doc = traced[name]
    assert proc.returncode == 0 and doc is not None, proc.stderr[-3000:]
    assert doc["passed"], [c for c in doc["checks"] if not c["passed"]]
    return TraceResult.from_json(doc)


def _steady(result: TraceResult, rank: int, step: int, **match) -> list:
    return [e for e in result.steps_of(rank).get(step, []) if all(getattr(e, k) == v for k, v in match.items())]


def test_ddp_bucket_all_reduces_are_ddps_own_buckets(traced):
    """Backward all-reduces from DDP's C++ Reducer, one per bucket, with the sizes DDP reports."""
    result = _result(traced, "ddp")
    proc, _ = traced["ddp"]
    sizes = re.search(r"rebuilt_bucket_sizes=([\d, ]+)", proc.stderr + proc.stdout).group(1)
    buckets = sorted(int(s) for s in sizes.split(","))
    for rank in (0, 1):
        for step in (2, 3):  # after the rebuild in step 1
            calls = _steady(result, rank, step, op="all_reduce")
            assert sorted(e.bytes_in for e in calls) == buckets
            assert {e.phase for e in calls} == {"backward"} and {e.axis for e in calls} == {"world"}
    assert result.layout["sizes"] == {"world": 2}


def test_fsdp2_one_all_gather_and_one_reduce_scatter_per_unit(traced):
    result = _result(traced, "fsdp2")
    blocks = 4  # the job's default --blocks; units = blocks + the root
    for step in (1, 2):
        ops = Counter((e.op, e.phase) for e in result.steps_of(0)[step])
        assert ops[("all_gather", "forward")] == blocks + 1
        assert ops[("reduce_scatter", "backward")] == blocks + 1
        # blocks are resharded after forward and gathered again in backward; the root is not
        assert ops[("all_gather", "backward")] == blocks


def test_steps_ends_a_long_job_cleanly_on_every_rank(traced):
    """The FSDP2 job was asked for 100,000 steps and meshscope's --steps for 3: every rank stopped
    after its third, and no call of a later step was recorded."""
    result = _result(traced, "fsdp2")
    assert [(r.status, r.steps) for r in result.ranks] == [("stopped", 3), ("stopped", 3)]
    assert max(step for rank in (0, 1) for step in result.steps_of(rank)) <= 3


@pytest.mark.parametrize("name", ["tp", "sp"])
def test_dtensor_tp_matches_comm_debug_mode(traced, name):
    """Per step, the trace's counts on the tp axis equal what torch's CommDebugMode counted."""
    result = _result(traced, name)
    proc, _ = traced[name]
    debug = [json.loads(line.split("comm_debug ", 1)[1]) for line in proc.stderr.splitlines() if "comm_debug " in line]
    names = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter", "all_reduce": "all_reduce"}
    assert len(debug) == 3
    for step, counts in enumerate(debug):
        want = {names[k]: v for k, v in counts.items()}
        got = Counter(e.op for e in result.steps_of(0)[step] if e.phase in ("forward", "backward", "optimizer"))
        assert dict(got) == want, (step, result.steps_of(0)[step])
    assert result.axes == {"tp": [[0, 1]]} and result.layout["sizes"] == {"tp": 2}


def test_fsdp_tp_labels_both_mesh_axes_and_reconstructs_the_layout(traced):
    result = _result(traced, "fsdp_tp")
    assert result.axes["tp"] == [[0, 1], [2, 3]] and result.axes["dp"] == [[0, 2], [1, 3]]
    assert result.layout["text"].startswith("tp 2, dp 2") and result.layout["sizes"] == {"tp": 2, "dp": 2}
    blocks = 2
    for rank in range(4):
        ops = Counter((e.axis, e.op) for e in result.steps_of(rank)[2])
        assert ops[("tp", "all_reduce")] == 2 * blocks  # RowwiseParallel output fwd, ColwiseParallel input grad bwd
        assert ops[("dp", "all_gather")] == 2 * blocks + 1 and ops[("dp", "reduce_scatter")] == blocks + 1


@pytest.mark.parametrize("schedule, rank0, rank1", [
    ("gpipe", "s s s s r r r r", "r r r r s s s s"),
    ("1f1b", "s s r s r s r r", "r s r s r s r s"),
])
def test_pipelining_p2p_follows_the_schedule(traced, schedule, rank0, rank1):
    """M = 4 microbatches on 2 stages: the order of sends and receives is the schedule's (by hand)."""
    result = _result(traced, schedule)
    for rank, want in ((0, rank0), (1, rank1)):
        for step in (1, 2):
            calls = [e for e in result.steps_of(rank)[step] if e.op in ("send", "recv")]
            assert " ".join(e.op[0] for e in calls) == want
            assert {e.peer for e in calls} == {1 - rank} and {e.bytes_in or e.bytes_out for e in calls} == {256}
    # 3 steps x 2 ranks x M sends, plus in the first step torch 2.13's one-message warm-up vote each way;
    # torch 2.15 votes by an all-reduce and connects the two stages by one send, lower rank to higher
    # (pipelining/_p2p.py, _preconnect_shared_p2p_edges)
    warm_up = 2 if TORCH < (2, 15) else 1
    assert next(c for c in result.checks if c.name == "every send has its recv").detail.startswith(
        f"{3 * 2 * 4 + warm_up} sends")


def test_moe_all_to_all_splits_are_the_jobs_skew(traced):
    """7:1 routing at world 2: rank 0 sends [14, 2] tokens, receives [14, 14]; rank 1 sends [14, 2],
    receives [2, 2]; the backward exchanges mirror them (hand count of the job's routing)."""
    result = _result(traced, "moe")
    want = {0: [((1, 1), (1, 1)), ((14, 2), (14, 14)), ((14, 14), (14, 2)), ((14, 2), (14, 14)), ((14, 14), (14, 2))],
            1: [((1, 1), (1, 1)), ((14, 2), (2, 2)), ((2, 2), (14, 2)), ((14, 2), (2, 2)), ((2, 2), (14, 2))]}
    for rank, splits in want.items():
        calls = result.steps_of(rank)[1]
        assert [(e.input_splits, e.output_splits) for e in calls] == splits
        assert [e.phase for e in calls][3:] == ["backward", "backward"] and calls[0].dtype == "int64"
    assert next(c for c in result.checks if c.name == "all-to-all splits mirror").passed


def test_a_compiled_module_is_traced_on_every_call_the_first_included(traced):
    """torch.compile: the collectives of the compiled graph run as c10d ops at run time and are seen,
    once per call; graph capture (on fake tensors) issues none (hand count in the job)."""
    result = _result(traced, "compiled")
    for rank in (0, 1):
        for step in (0, 1, 2):
            calls = result.steps_of(rank)[step]
            assert [(e.op, e.phase, e.bytes_in) for e in calls] == [("all_reduce", "forward", 256),
                                                                     ("all_reduce", "backward", 256)]


def test_modules_built_per_call_leave_no_label_behind(traced):
    """Every call the attention makes builds nn.Softmax modules until one reuses a freed one's address
    (the job prints how many calls did); on every step of every rank the labels are the job's own
    structure (hand count in the job): the forward all-reduce in `attention`, its gradient's in
    backward, and the five calls after backward outside every module: other, no region."""
    result = _result(traced, "fresh_modules")
    proc, _ = traced["fresh_modules"]
    assert sorted(re.findall(r"rank (\d): calls at a reused module address: (\d) of 4", proc.stderr)) == [
        ("0", "4"), ("1", "4")]
    want = [("forward", "attention", 128), ("backward", "", 128), *[("other", "", b) for b in (256, 32, 256, 32, 4)]]
    for rank in (0, 1):
        assert sorted(result.steps_of(rank)) == [0, 1, 2, 3]
        for calls in result.steps_of(rank).values():
            assert [(e.phase, e.region, e.bytes_in) for e in calls] == want


def test_a_closures_forward_and_backward_keep_their_phases_inside_the_optimizer_step(traced):
    """``opt.step(closure)`` with DDP and ZeroRedundancyOptimizer (hand count in the job): the closure's
    forward, backward and loss log keep the phases they have without a closure; only ZeRO's own
    broadcasts are optimizer."""
    result = _result(traced, "closure")
    job = [("all_reduce", "forward", "mix"), ("all_reduce", "other", ""), ("all_reduce", "backward", ""),
           ("all_reduce", "backward", ""), ("broadcast", "optimizer", ""), ("broadcast", "optimizer", "")]
    setup = [("all_gather", "other", ""), ("broadcast", "other", ""), ("broadcast", "other", "")]
    rebuild = [("broadcast", "forward", "Model")] * 2
    for rank in (0, 1):
        steps = {k: [(e.op, e.phase, e.region) for e in calls] for k, calls in result.steps_of(rank).items()}
        assert steps == {0: setup + job, 1: rebuild + job, 2: job, 3: job}


@pytest.mark.frameworks  # 4 real ranks of megatron-core; CI keeps test_fake_megatron.py's labels at 1,024 fake ranks
def test_megatron_groups_are_labelled_by_megatrons_own_getters(tmp_path):
    pytest.importorskip("megatron.core")
    proc = cli("trace", "--nproc-per-node", 4, "--out", tmp_path / "run", "--json", "--",
               str(JOBS / "megatron_groups.py"), "--steps", 2, "--print-groups", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    names = {"tp": "tp", "pp": "pp", "dp": "dp", "dp_cp": "dp-cp", "cp": "cp", "mp": "tp-pp", "tp_dp": "tp-dp",
             "tp_dp_cp": "tp-dp-cp", "tp_cp": "tp-cp", "ep": "ep", "etp": "etp", "etp_ep": "etp-ep",
             "etp_ep_pp": "etp-ep-pp", "edp": "edp"}
    for line in proc.stderr.splitlines():
        m = re.search(r"rank (\d+): (.*)", line)
        if not m or "=" not in m.group(2):
            continue
        rank = int(m.group(1))
        for name, ranks in re.findall(r"(\w+)=\[([\d, ]*)\]", m.group(2)):
            group = [int(r) for r in ranks.split(",")]
            assert group in doc["axes"][names[name]], (rank, name, group, doc["axes"].get(names[name]))
    assert doc["layout"]["layout"]["sizes"]["tp"] == 2 and doc["layout"]["layout"]["sizes"]["ep"] == 2


def test_a_script_that_steps_no_optimizer_gets_one_step_and_a_note(tmp_path):
    job = tmp_path / "stepless.py"
    job.write_text("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                   "dist.all_reduce(torch.ones(2))\ndist.all_reduce(torch.ones(2))\n")
    proc = cli("trace", "--out", tmp_path / "run", "--json", "--", job, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert [s["step"] for s in doc["per_rank"][0]["steps"]] == [0] and len(doc["per_rank"][0]["steps"][0]["events"]) == 2
    assert any("no torch.optim optimizer: one step holds everything" in n for n in doc["notes"])


@pytest.mark.parametrize("args, needle", [
    (("trace", "tests/jobs/ddp.py"), "needs '--' before the job"),
    (("trace", "--", "no/such/script.py"), "script 'no/such/script.py' does not exist"),
    (("trace", "--steps", 0, "--", "tests/jobs/ddp.py"), "--steps 0 must be a positive number"),
    (("trace", "--nproc-per-node", 0, "--", "tests/jobs/ddp.py"), "--nproc-per-node 0 must be a positive integer"),
    (("trace", "--"), "needs the job after '--'"),
])
def test_trace_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    proc = cli_here(*args[:1], "--out", tmp_path / "x", *args[1:])
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()


def test_inside_the_users_own_torchrun(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "meshscope.trace", str(JOBS / "ddp.py"), "--steps", "2"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**__import__("os").environ, "MESHSCOPE_TRACE_DIR": str(tmp_path / "run")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "result.json").read_text())
    assert doc["passed"] and doc["world"] == 2 and len(doc["per_rank"]) == 2
    assert cli_here("report", tmp_path / "run").returncode == 0
    assert (tmp_path / "run" / "report.md").exists() and (tmp_path / "run" / "trace.json").exists()


@pytest.mark.parametrize("name", ["ddp", "fsdp_tp", "1f1b", "compiled"])
def test_a_fake_world_issues_what_gloo_did(traced, tmp_path, name):
    """The same job with every rank on the fake backend issues what its gloo trace above issued, call
    for call (`meshscope diff`: same). DDP: its built-in hook asserts on the fake work's empty future,
    so meshscope's hook issues the same bucket all-reduces, and the first step's single bucket and the
    second step's rebuild broadcasts stay as on gloo. FSDP2 x TP at world 4. Pipelining with static
    shapes: every stage votes 'static' in the warm-up, which each fake rank takes alone
    (`trace.fake.pipeline.vote_alone`). torch.compile (fullgraph): the CUDA mapping's stand-in streams and
    `is_available()` True must leave the compiled frames' calls as gloo's (docs/trace.md, "Frameworks")."""
    nproc, _, (script, *args) = RUNS[name]
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", nproc, "--ranks", ",".join(map(str, range(nproc))),
                           [str(JOBS / script), *args])
    assert proc.returncode == 0 and doc["passed"] and doc["fake_world"]["traced"] == list(range(nproc)), \
        proc.stderr[-3000:]
    if name == "ddp":
        steps = {s["step"]: [e["op"] for e in s["events"] if e["phase"] != "other"] for s in doc["per_rank"][0]["steps"]}
        assert steps[0] == ["all_reduce"] and steps[1] == ["broadcast"] * 2 + ["all_reduce"] * 4
        assert steps[2] == steps[3] == ["all_reduce"] * 4
    same = cli_here("diff", traced[name][1]["run_dir"], tmp_path / "fake", "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["same"], same.stdout[-3000:]


DISPATCH = ("input_splits", "output_splits", "bytes_in", "bytes_out")


def test_what_a_fake_world_cannot_know_of_an_uneven_all_to_all_is_assumed(traced, tmp_path, capsys):
    """The MoE job in a fake world of 2: rank 0, traced first, cannot know what rank 1 routes to it, so its
    uneven all-to-all's sizes come back `assumed`, not invented; rank 1 receives what rank 0 sent
    (`trace.fake.replay`), so its calls are gloo's on every field. The gloo trace above has none assumed, and
    `meshscope diff` compares the rest and says what it left out."""
    nproc, _, (script, *args) = RUNS["moe"]
    fake, fake_doc = trace_json(tmp_path / "fake", "--fake-world", nproc, "--ranks", "0,1", [str(JOBS / script), *args])
    assert fake.returncode == 0 and fake_doc["passed"], fake.stderr[-3000:]
    steps = 3
    # the job's docstring: per step 5 all_to_alls, the even int64 count exchange first, then 4 uneven ones
    for rank, want in ((0, [("output_splits", "bytes_out")] + [DISPATCH] * 4), (1, [()] * 5)):
        for step in TraceResult.from_json(fake_doc).steps_of(rank).values():
            assert [e.assumed for e in step] == want, rank
    real_result = _result(traced, "moe")
    assert real_result.events and not any(e.assumed for e in real_result.events)
    # rank 1 really receives [2, 2] in the dispatch (the fake backend alone mirrored its own [14, 2])
    dispatch = [e for e in real_result.events if e.rank == 1 and e.step == 0][1]
    assert dispatch.output_splits == (2, 2)
    fake_dispatch = [e for e in TraceResult.from_json(fake_doc).events if e.rank == 1 and e.step == 0][1]
    assert fake_dispatch.output_splits == (2, 2)
    mirror = next(c for c in fake_doc["checks"] if c["name"] == "all-to-all splits mirror")
    assert mirror["passed"] and "not checked: their splits are assumed" in mirror["detail"]
    report = (tmp_path / "fake" / "report.md").read_text()
    assert "\\* assumed: a fake world cannot know" in report and "KiB\\* |" in report

    args = argparse.Namespace(dir_a=Path(traced["moe"][1]["run_dir"]), dir_b=tmp_path / "fake", json=True)
    assert cmd_diff(args) == 0  # in this process: a CLI start costs seconds on a loaded box
    doc = json.loads(capsys.readouterr().out)
    assert doc["same"] and not doc["rows"], doc
    assert doc["assumed"]["calls"] == {"a": 0, "b": steps * 5} and doc["assumed"]["fields"] == sorted(DISPATCH)
    assert [t["step"] for t in doc["assumed"]["totals"]] == list(range(steps))
    assert cmd_diff(argparse.Namespace(**{**vars(args), "json": False})) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "not compared: bytes_in, bytes_out, input_splits, output_splits" in text and "same ledgers" in text


def test_report_and_doctor_read_a_trace_directory(traced, tmp_path):
    """The trace wrote its tables and Chrome trace but left the figures to `meshscope report`, which
    draws them (PNG files, each named on its output)."""
    run_dir = Path(traced["ddp"][1]["run_dir"])
    assert (run_dir / "trace.json").is_file() and not (run_dir / "figures").exists()
    (run_dir / "report.md").unlink()
    proc = cli_here("report", run_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run_dir / "report.md").read_text().count("| world | all_reduce | backward |") >= 3
    for name in ("bytes_per_axis.png", "bytes_per_module.png"):
        assert (run_dir / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(run_dir / "figures" / name) in proc.stdout
    proc = cli_here("doctor", run_dir, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["healthy"], proc.stdout[-2000:]
    chrome = json.loads((run_dir / "trace.json").read_text())
    assert {e["pid"] for e in chrome["traceEvents"]} == {0, 1}


def test_diff_shows_what_sequence_parallel_changed(traced, tmp_path):
    tp, sp = (traced[n][1]["run_dir"] for n in ("tp", "sp"))
    proc = cli_here("diff", tp, tp, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["same"]
    proc = cli_here("diff", tp, sp, "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    rows = {(r["step"], r["axis"], r["op"]): (r["count_a"], r["count_b"]) for r in doc["rows"]}
    # summed over the 2 ranks: SP adds 2 all-gathers and 2 reduce-scatters per rank and step
    assert rows[(1, "tp", "all_gather")] == (0, 4) and rows[(1, "tp", "reduce_scatter")] == (0, 4)
    assert set(doc["first_divergence"]) == {"0", "1"}  # JSON keys: the ranks
    missing = cli_here("diff", tp, tmp_path / "missing")
    assert missing.returncode == 2 and "is not a directory" in missing.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_elastic_agents_on_one_host(tmp_path):
    """Multi-node as torchrun does it: one `meshscope trace` per node, c10d rendezvous on 127.0.0.1;
    each node's directory holds its own rank and says how much of the world it traced."""
    port = _free_port()
    cmds = [[sys.executable, "-m", "meshscope", "trace", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-agents",
             "--out", str(tmp_path / f"node{k}"), "--json", "--", str(JOBS / "ddp.py"), "--steps", "2"]
            for k in range(2)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for c in cmds]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    docs = [json.loads(out) for out, _ in outs]
    assert sorted(r["rank"] for d in docs for r in d["ranks"]) == [0, 1]
    for d in docs:
        assert d["passed"] and d["world"] == 2 and len(d["per_rank"]) == 1
        assert any("ranks traced: 1 of 2" in n for n in d["notes"])
        # the bucket all-reduces of both ranks are seen on the world group of 2
        assert {tuple(e["group"]) for s in d["per_rank"][0]["steps"] for e in s["events"]} == {(0, 1)}


def test_cheap_mode_sees_the_same_calls_without_modules(traced, tmp_path):
    """--cheap drops the module hooks and the streamed flight log: the same calls, no forward phase."""
    proc = cli("trace", "--cheap", "--nproc-per-node", 2, "--out", tmp_path / "run", "--json", "--",
               str(JOBS / "ddp.py"), "--steps", "4", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cheap, full = TraceResult.from_json(json.loads(proc.stdout)), _result(traced, "ddp")
    def calls(r, phases=False):
        return [(e.step, e.op, e.bytes_in) + ((e.phase, e.region) if phases else ()) for e in r.events if e.rank == 0]
    assert calls(cheap) == calls(full)
    assert {e.region for e in cheap.events} == {""} and "forward" not in {e.phase for e in cheap.events}
    assert "forward" in {e.phase for e in full.events}
