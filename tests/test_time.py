"""Where the time goes: waits per axis, the slow rank named, and where its time went (docs/trace.md, "Time").

The math (`timing.where`, `timing.waits`, `timing.stragglers`, `core.clock.offsets`) is tested on calls
built by hand, with what each rank did and when written out in the test; the behaviour on real jobs
with a planted delay of 60 ms (`tests/jobs/delays.py`), one run per place: in a module's forward
(DDP, world 4, as two elastic agents on 127.0.0.1), in data loading (FSDP2 x TP, world 4) and in a
backward hook (1F1B pipelining, world 2). The oracle of those is the job's own argument: which rank
sleeps, where, and for how long. `benchmarks/bench_stragglers.py` runs every job x place 10 times, and
healthy runs, for the detection rates.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys

import pytest

from meshscope.capture import flightlog
from meshscope.core.clock import Clock, offsets
from meshscope.core.errors import UsageError
from meshscope.core.events import CommEvent
from meshscope.doctor import diagnose
from meshscope.timing import stragglers
from meshscope.timing.where import Completions, Moves, before

from .helpers import ROOT, trace_json

JOBS = ROOT / "tests" / "jobs"
STEP, FORWARD, SLOW = 0.100, 0.030, 0.060
"""The hand-built job: a 100 ms step, 30 ms of it in forward; the slow rank's forward takes 60 ms more."""


def _job(slow: int | None, ranks=(0, 1, 2), steps=6, groups=None):
    """Each rank, each step: 10 ms of data loading (other), its forward in ``mlp`` (30 ms, +60 on `slow`),
    then a collective per group in `groups` (default: one on all ranks), each completing when the last
    member arrived. Each rank's own clock starts `r` seconds after rank 0's. Returns the analysis inputs."""
    groups = groups or [tuple(ranks)]
    starts = {r: 100.0 + r for r in ranks}
    clocks = {r: Clock(None if r else 0.0, None if r else 0.0, starts[r], "host") for r in ranks}
    events, moves, ends = [], {r: [] for r in ranks}, {r: {} for r in ranks}
    seq = {g: 0 for g in groups}
    for s in range(steps):
        base = s * (STEP + SLOW)  # common time, rank 0's clock
        arrive = {}
        for r in ranks:
            own = base - (starts[r] - starts[0])  # the same instant on rank r's clock
            fwd = FORWARD + (SLOW if r == slow else 0.0)
            moves[r] += [(own, "other", ""), (own + 0.010, "forward", "mlp"), (own + 0.010 + fwd, "backward", "")]
            arrive[r] = own + 0.010 + fwd + 0.001
            ends[r][s + 1] = own + STEP + SLOW
        t = dict(arrive)
        for g in groups:
            last = max(t[r] + starts[r] for r in g)  # on one clock
            for r in g:
                events.append(CommEvent(rank=r, seq=seq[g], op="all_reduce", axis="dp", group=g, phase="backward",
                                        dtype="float32", bytes_in=4, bytes_out=4, step=s, t_issue=t[r],
                                        t_complete=last - starts[r] + 0.002))
            for r in g:  # the next group's call comes after this one completed
                t[r] = last - starts[r] + 0.003
            seq[g] += 1
    return events, clocks, moves, ends


@pytest.mark.parametrize("first", [("500000", "1000000"), ("1000.5", "1001.0")], ids=["microseconds", "wall seconds"])
def test_a_flushs_moves_are_one_flight_log_line_read_back_as_moves_in_order(tmp_path, first):
    """A traced rank writes the moves of one flush as one ``"x"`` line: the first move's time (whole
    microseconds after the start line's; wall-clock seconds in a log written before 2026-12-05), each
    move's microseconds after it and its state's number (states named once, by ``"s"`` lines); the
    reader gives one move per entry, on the rank's clock. A torn last line (a killed rank) is skipped."""
    log = tmp_path / "rank0.jsonl"
    log.write_text("\n".join([
        json.dumps({"t": 1000.0, "kind": "start", "rank": 0}),
        '["s",0,"other",""]', '["s",1,"forward","mlp"]',
        f'["x",{first[0]},[0,1500,250000],[0,1,0]]',
        '["s",2,"backward",""]', f'["x",{first[1]},[0,7],[2,1]]',
        '["x",2000000,[0,3]']) + "\n")
    flight = flightlog.read_flight(log, 0)
    assert [(round(t, 6), phase, module) for t, phase, module in flight.moves] == [
        (0.5, "other", ""), (0.5015, "forward", "mlp"), (0.75, "other", ""), (1.0, "backward", ""),
        (1.000007, "forward", "mlp")]


def test_a_calls_lines_read_back_on_the_ranks_clock_from_microseconds_after_the_start(tmp_path):
    """A traced rank's "i", "c" and "d" lines carry whole microseconds after its start line's wall time; the
    reader gives the call's issue, the time the rank went past it and its completion in seconds since the
    rank's start (as its ledger), and `issued_at` in wall-clock seconds. A compact line before any start
    line is not a flight log."""
    start = 1764912345.25
    group = {"t": start + 0.001, "kind": "group", "axis": "dp", "ranks": [0, 1], "index": 0, "name": "1", "desc": ""}
    log = tmp_path / "rank0.jsonl"
    log.write_text("\n".join([
        json.dumps({"t": start, "kind": "start", "rank": 0}), json.dumps(group),
        '["i",1500,0,0,0,"1","all_reduce","backward","float32",64,64,"",null,null,null]',
        '["d",1750,"1",0]', '["c",2000000,"1",0]']) + "\n")
    flight = flightlog.read_flight(log, 0)
    (call,) = flight.issued
    assert (round(call.t_issue, 6), round(call.t_complete, 6), round(call.t_done, 6)) == (0.0015, 0.00175, 2.0)
    assert flight.issued_at[("dp", (0, 1), 0)] == pytest.approx(start + 0.0015, abs=1e-6)
    bad = tmp_path / "rank1.jsonl"
    bad.write_text("\n".join([json.dumps(group), '["d",1750,"1",0]', json.dumps({"t": start, "kind": "start"})]))
    with pytest.raises(UsageError, match="line 2 is not a flight-log record"):
        flightlog.read(bad)


def test_spent_splits_an_interval_by_the_moves_before_and_inside_it():
    moves = Moves([(1.0, "other", ""), (2.0, "forward", "a"), (2.5, "forward", "a.b"), (3.0, "backward", "")])
    assert dict(moves.spent(0.5, 2.75)) == {("other", ""): 1.5, ("forward", "a"): 0.5, ("forward", "a.b"): 0.25}
    assert dict(moves.spent(3.5, 4.0)) == {("backward", ""): 0.5}
    assert dict(moves.spent(2.0, 2.0)) == {}


def test_a_segment_starts_at_the_previous_completion_on_the_calls_own_group():
    """A call prefetched on another group that completes mid-delay does not cut the segment short."""
    def call(seq, group, t_issue, t_complete):
        return CommEvent(rank=0, seq=seq, op="all_gather", axis="x", group=group, phase="forward", dtype="float32",
                         bytes_in=4, bytes_out=8, t_issue=t_issue, t_complete=t_complete)
    tp_before, prefetch, late = call(0, (0, 1), 1.0, 1.1), call(0, (0, 2), 1.2, 1.5), call(1, (0, 1), 2.0, 2.1)
    moves = Moves([(1.1, "forward", "attn"), (1.3, "forward", "mlp")])
    assert dict(before(late, moves, Completions([tp_before, prefetch, late]))) == pytest.approx(
        {("forward", "attn"): 0.2, ("forward", "mlp"): 0.7})


def test_one_host_gets_exact_offsets_another_its_best_estimate():
    clocks = {0: Clock(0.0, 0.0, 10.0, "a"), 1: Clock(0.4, 0.003, 10.5, "a"),  # rank 0's host: the truth, 0.5
              2: Clock(7.0, 0.004, 3.0, "b"), 3: Clock(7.9, 0.001, 4.0, "b"), 4: Clock(None, None, 1.0, "c")}
    got = offsets(clocks)
    assert got[0] == (0.0, 0.0) and got[1] == (0.5, 0.0)
    assert got[3] == (7.9, 0.001) and got[2] == (pytest.approx(6.9), 0.001)  # rank 3's estimate, moved by 1 s
    assert 4 not in got  # its host has no estimate


def test_the_slow_rank_and_its_module_are_named_with_the_wait_it_caused():
    events, clocks, moves, ends = _job(slow=2)
    t = stragglers.analyse(events, clocks, moves, ends, [2, 3, 4])
    assert t.analysed and t.steps == (2, 3, 4) and t.step_ms == pytest.approx((STEP + SLOW) * 1e3)
    assert t.clock_error_ms == 0.0  # one host: the offsets are exact
    [s] = t.stragglers
    assert (s.rank, s.axis, s.phase, s.module, s.steps) == (2, "dp", "forward", "mlp", (2, 3, 4))
    assert s.ms_per_step == pytest.approx(SLOW * 1e3, abs=0.01) and s.excess_ms == pytest.approx(SLOW * 1e3, abs=0.01)
    caused = {(r, st): ms for r, st, ms in t.caused}
    assert caused[(2, 3)] == pytest.approx(SLOW * 1e3, abs=0.01) and caused[(0, 3)] == 0.0
    [axis] = t.axes
    assert axis.waiting_ms == pytest.approx(2 / 3 * SLOW * 1e3, abs=0.01)  # two of three ranks wait 60 ms


def test_a_healthy_job_has_no_straggler_and_too_few_steps_say_so():
    events, clocks, moves, ends = _job(slow=None)
    assert stragglers.analyse(events, clocks, moves, ends, [2, 3, 4]).stragglers == ()
    short = stragglers.analyse(events, clocks, moves, ends, [2])
    assert not short.analysed and "1 steady step" in short.note and "trace more steps" in short.note


def test_a_rank_that_only_passes_on_a_wait_is_not_the_cause():
    """Rank 1 waits for slow rank 2 on group (1, 2), then rank 0 waits for rank 1 on (0, 1): rank 1 caused
    as much as it waited, so only rank 2 is named."""
    events, clocks, moves, ends = _job(slow=2, groups=[(1, 2), (0, 1)])
    [s] = stragglers.analyse(events, clocks, moves, ends, [2, 3, 4]).stragglers
    assert s.rank == 2 and s.where == "forward, mlp"


def test_on_a_gpu_arrivals_are_where_the_stream_reached_the_call_not_the_cpu_issue():
    """NCCL: both ranks issue each all-reduce at the same CPU instant, but rank 1's stream reaches it 50 ms
    later (a slow kernel before it). Its GPU arrival makes rank 0 wait; the second call, queued on rank 0
    behind the first, arrives when the first ended on the GPU (its arrival plus its `gpu_ms`)."""
    from meshscope.timing.waits import instances, per_step

    def call(rank, seq, t_gpu, gpu_ms):
        return CommEvent(rank=rank, seq=seq, op="all_reduce", axis="dp", group=(0, 1), phase="backward",
                         dtype="float32", bytes_in=4, bytes_out=4, step=0, t_issue=1.0 + seq * 0.001,
                         t_complete=1.0005 + seq * 0.001, gpu_ms=gpu_ms, t_gpu=t_gpu)
    events = [call(0, 0, 1.010, 52.0), call(1, 0, 1.060, 2.0), call(0, 1, 1.011, 1.0), call(1, 1, 1.0625, 1.0)]
    first, second = instances(events, {0: 0.0, 1: 0.0})
    assert first.last == 1 and first.waits[0] == pytest.approx(0.050) and first.waits[1] == 0.0
    assert second.arrivals[0] == pytest.approx(1.062)  # 1.010 + 52 ms on the GPU, not its 1.011 on the stream
    assert second.last == 1 and second.waits[0] == pytest.approx(0.0005)
    inside = per_step(events, {0: 0.0, 1: 0.0})[0]
    assert inside.of("dp", 0).inside == pytest.approx(0.053)  # its GPU times, not the CPU's enqueue
    cpu = [dataclasses.replace(e, t_gpu=None) for e in events]  # what the CPU times alone say: no wait
    assert max(instances(cpu, {0: 0.0, 1: 0.0})[0].waits.values()) == pytest.approx(0.0)


def test_a_kernel_that_keeps_one_gpu_busy_is_named_as_the_gpus_not_a_module():
    """The hand-built job on GPUs, no rank slow on its CPU, but rank 1's GPU reaches each collective 60 ms
    after its CPU issued it: rank 1 is named, and its time went to its GPU's queue."""
    events, clocks, moves, ends = _job(slow=None)
    lag = {0: 0.0001, 1: SLOW, 2: 0.0001}
    events = [dataclasses.replace(e, t_gpu=e.t_issue + lag[e.rank]) for e in events]
    [s] = stragglers.analyse(events, clocks, moves, ends, [2, 3, 4]).stragglers
    assert (s.rank, s.phase, s.module) == (1, "gpu", "") and s.where.startswith("gpu, its kernels")
    assert s.ms_per_step == pytest.approx((SLOW - 0.0001) * 1e3, abs=0.01)


def test_a_rank_late_because_it_waited_for_a_cpu_is_its_hosts_not_a_straggler():
    """Rank 2 is late by 60 ms per step. Where its main thread waited 50 ms of each step on the run queue
    (the host ran other work), it is not named and the note says why; where it waited 5 ms, it is named
    with that wait."""
    events, clocks, moves, ends = _job(slow=2)
    def queue(ms):
        return {r: {s: s * (ms if r == 2 else 0.1) * 1e-3 for s in range(7)} for r in range(3)}
    busy = stragglers.analyse(events, clocks, moves, ends, [2, 3, 4], queued=queue(50))
    assert busy.stragglers == ()
    assert "rank 2 made the others wait 60.0 ms per step on dp but waited 50.0 ms per step for a CPU itself" in busy.note
    [s] = stragglers.analyse(events, clocks, moves, ends, [2, 3, 4], queued=queue(5)).stragglers
    assert s.rank == 2 and s.queued_ms == pytest.approx(5.0) and s.caused_held_ms == pytest.approx(60.0, abs=0.01)


def test_a_fake_world_and_unclocked_ranks_are_said_not_analysed():
    events, clocks, moves, ends = _job(slow=2)
    fake = stragglers.analyse(events, clocks, moves, ends, [2, 3, 4], fake_world=True)
    assert not fake.analysed and "one after another" in fake.note
    t = stragglers.analyse(events, {**clocks, 1: Clock(None, None, 101.0, "other host")}, moves, ends, [2, 3, 4])
    assert "ranks [1] have no clock offset" in t.note


def test_ranks_that_outnumber_their_hosts_cpus_are_said_to_share_them():
    """Three ranks on one host: with 2 CPUs the note says that a straggler there may be the scheduler's;
    with 4 (or a count not known) it says nothing of CPUs."""
    events, clocks, moves, ends = _job(slow=2)
    def on(n):
        return {r: dataclasses.replace(c, cpus=n) for r, c in clocks.items()}
    assert "3 ranks shared 2 CPUs on one host" in stragglers.analyse(events, on(2), moves, ends, [2, 3, 4]).note
    assert [stragglers.analyse(events, on(n), moves, ends, [2, 3, 4]).note for n in (4, 0)] == ["", ""]


# -- real jobs ------------------------------------------------------------------------------------------

def _named(doc: dict, run_dir, rank: int, where: str) -> None:
    """The trace passed, its time section and the doctor name `rank` and `where`, and the doctor calls
    the directory healthy (a straggler is a performance finding)."""
    assert doc["outcome"] == "passed", doc.get("error")
    t = doc["time"]
    assert t["analysed"], t["note"]
    assert [(s["rank"], f"{s['phase']}, {s['module'] or 'no module'}") for s in t["stragglers"]] == [(rank, where)], t
    assert t["stragglers"][0]["ms_per_step"] > 30  # most of the 60 ms the others waited, every steady step
    report = diagnose(run_dir)
    assert report.healthy and report.findings == []
    [finding] = report.performance
    assert (finding.kind, finding.ranks, finding.where) == ("straggler", [rank], where)


@pytest.mark.alone
def test_a_sleep_in_data_loading_under_fsdp2_names_the_rank_and_no_module(tmp_path):
    """Two ranks (CI's two CPUs are shared with another test's job): FSDP2 x TP on 4 ranks is
    benchmarks/bench_stragglers.py's, where ranks outnumbering CPUs can name the scheduler's straggler."""
    proc, doc = trace_json(tmp_path / "run", "--nproc-per-node", 2, [
        str(JOBS / "transformer.py"), "--tp", 1, "--steps", 6, "--slow-rank", 1, "--slow-in", "data"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    _named(doc, tmp_path / "run", 1, "other, no module")


@pytest.mark.alone
def test_a_sleep_in_a_backward_hook_of_a_pipeline_stage_surfaces_on_its_p2p(tmp_path):
    proc, doc = trace_json(tmp_path / "run", "--nproc-per-node", 2, [
        str(JOBS / "pipelining.py"), "--schedule", "1f1b", "--steps", 6, "--slow-rank", 0, "--slow-in", "backward"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    _named(doc, tmp_path / "run", 0, "backward, no module")
    assert doc["time"]["stragglers"][0]["axis"] == "world"  # the stages' sends and receives (the job has no mesh)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.alone
def test_a_sleep_in_a_module_forward_is_named_across_two_elastic_agents(tmp_path):
    """Two torch elastic agents on 127.0.0.1 (c10d rendezvous) as two nodes of a 2-rank DDP job, writing one
    directory (`torchrun -m meshscope.trace`): rank 1, on the second node, sleeps in ``net.2``'s forward.
    Each rank's offset to rank 0 was also estimated through the job's store: the error printed is the
    estimate's against the one clock the two agents share."""
    port, shared = _port(), tmp_path / "trace"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MESHSCOPE_TRACE_DIR": str(shared), "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                                "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                "--rdzv-id", "time", "-m", "meshscope.trace", str(JOBS / "ddp.py"), "--steps", "6",
                                "--slow-rank", "1", "--slow-in", "forward"],
                               env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True) for node in (0, 1)]
    try:
        outs = [a.communicate(timeout=180) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, 9)
    assert [a.returncode for a in agents] == [0, 0], "\n".join(err[-2000:] for _, err in outs)
    from meshscope.trace.assemble import load

    result = load(shared)  # the node that ended last wrote result.json: it is read again with every rank
    assert sorted(r.rank for r in result.ranks) == [0, 1]
    _named(json.loads(json.dumps(result.to_json())), shared, 1, "forward, net.2")
    print(f"clock estimate through the store, largest error: {result.time.clock_true_error_ms} ms")
    assert result.time.clock_true_error_ms is not None and result.time.clock_true_error_ms < 5.0
