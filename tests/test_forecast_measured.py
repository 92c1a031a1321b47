"""``--measure-on``: each compute segment timed as it runs (`capture.segment_clock`), the forecast taking those
times instead of the roofline's. The boundaries by a clock that counts the ops run (each segment holds exactly its
own ops: its start is marked before its first op runs); end to end on the CPU, a world-1 job's forecast step
against the step the job timed itself (tests/jobs/timed_steps.py); the bad inputs' one-line errors."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
import torch.distributed as dist

from meshscope.capture.job_context import JobContext
from meshscope.capture.work import CountingMode, WorkCounter

from .helpers import CountClock, cli_here


def test_a_measured_segment_holds_its_own_ops_from_before_the_first(monkeypatch):
    """mm, relu | all_reduce | mm (reads the reduced tensor: waits first), sum: two segments of two ops each; a
    start marked after its first op ran would give 1, an end marked after the next op 3."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    context = JobContext()
    context.install()
    ran: list[str] = []
    counter = WorkCounter(0, context, clock=CountClock(lambda: len(ran)))  # a segment's time: the ops it counted
    count = counter.count
    monkeypatch.setattr(counter, "count", lambda func, *rest: (ran.append(func.__name__), count(func, *rest)))
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 2)
    calls = itertools.count()
    try:
        with CountingMode(counter, lambda: next(calls)):
            y = (x @ w1).relu()
            dist.all_reduce(y)
            (y @ w2).sum()
    finally:
        context.remove()
        dist.destroy_process_group()
    items = counter.finish().items
    assert [item[0] for item in items] == ["c", "i", "w", "c"], items
    assert ran == ["mm.default", "relu.default", "mm.default", "sum.default"], ran
    assert [item[6] for item in items if item[0] == "c"] == [2, 2]
    assert items[0][2] == {"float32": 2 * 4 * 8 * 8} and items[3][2] == {"float32": 2 * 4 * 8 * 2}


def test_a_measured_segment_leaves_out_what_the_fake_process_group_does():
    """torch's fake process group copies an all-gather's input into every rank's chunk of its output (torch 2.13
    c10d/FakeProcessGroup.hpp): 1,024 copies a call at world 1,024, which a GPU's measured segments took in (an 8B
    model under FSDP2 at world 1,024 on an H100: 14-16 s of side-stream time a step), where NCCL's kernel writes
    the output and the forecast times the call on its link. mm | all_gather_into_tensor | sum of what it
    gathered: neither segment saw its 2 x 32 elements written."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    context = JobContext()
    context.install()
    gathered = torch.zeros(8, 8)
    counter = WorkCounter(0, context, clock=CountClock(lambda: int(gathered.count_nonzero())))  # elements written
    calls = itertools.count()
    try:
        with CountingMode(counter, lambda: next(calls)):
            y = torch.ones(4, 8) @ torch.ones(8, 8)
            dist.all_gather_into_tensor(gathered, y)
            gathered.sum()
    finally:
        context.remove()
        dist.destroy_process_group()
    items = counter.finish().items
    assert [item[0] for item in items] == ["c", "i", "w", "c"], items
    assert int(gathered.count_nonzero()) == 64
    assert [item[6] for item in items if item[0] == "c"] == [0, 0]


def test_a_world_1_jobs_measured_forecast_is_the_step_it_timed_itself(tmp_path):
    """On the CPU the measured segments are the job's own ops on one thread: the forecast step (their sum; no
    link at world 1) is at most the step the script timed (the Python between its ops is in no segment) and
    most of it (4 Linear(512, 512), batch 256: 28.8 of 30.1 ms on this project's 2-core box, 2026-12-05)."""
    out = tmp_path / "t"
    proc = cli_here("forecast", "--fake-world", 1, "--measure-on", "cpu", "--cluster", "h100-sxm", "--out", out,
                    "--json", "--", "tests/jobs/timed_steps.py", "--steps", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["compute_source"].startswith("measured") and "CPU" in doc["compute_source"]
    timed = {int(s): float(t) for s, t in re.findall(r"^step (\d+) seconds ([\d.]+)$",
                                                      (out / "logs" / "rank0.log").read_text(), re.M)}
    assert sorted(timed) == list(range(6))
    step = doc["step"]
    assert 0.75 * timed[step] <= doc["step_s"] <= 1.02 * timed[step], (doc["step_s"], timed)
    work = json.loads((out / "work" / "rank0.json").read_text())
    assert work["measured_on"].startswith("this machine's CPU")
    measured = [item for item in work["items"] if item[0] == "c"]
    assert measured and all(len(item) == 7 and item[6] > 0 for item in measured)


def test_a_measured_fsdp2_rank_holds_adamws_state_once(tmp_path):
    """With real tensors DTensor's sharding propagation still runs each of foreach AdamW's ops again at its global
    shape, on fake tensors of its own (torch 2.13 distributed/tensor/_sharding_prop.py): those are torch's, not the
    rank's. tests/jobs/fsdp2.py at world 2 (4 blocks of hidden 512 and the root: 4,725,760 fp32 parameters, a
    9,451,520-byte shard per rank) with foreach AdamW (torch's default on a GPU): the peak's optimizer part is the
    two moments' shards, as with fake tensors; counted as the rank's, they made the peak step 0's optimizer, 9
    shards (an 8B model under FSDP2 at world 8, measured on an H200: 134.6 GiB where its own peak is 67)."""
    shard = 4 * (4 * (2 * 512 * 1024 + 1024 + 512) + 2 * (512 * 512 + 512)) // 2
    proc = cli_here("forecast", "--fake-world", 2, "--measure-on", "cpu", "--cluster", "h100-sxm", "--out",
                    tmp_path / "t", "--json", "--", "tests/jobs/fsdp2.py", "--hidden", 512, "--blocks", 4, "--foreach")
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_at = json.loads(proc.stdout)["classes"][0]["peak_at"]
    assert peak_at["by_phase"]["optimizer"] == 2 * shard, peak_at
    assert (peak_at["step"], peak_at["phase"]) == (1, "backward"), peak_at


@pytest.mark.parametrize("args, words", [
    (("--measure-on", "cuda"), "--measure-on cuda: this machine has no CUDA device"),
    (("--measure-on", "cpu", "--fake-tensors"), "--measure-on and --fake-tensors: choose one"),
])
def test_measure_on_bad_input_is_one_line(tmp_path, args, words):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = cli_here("forecast", "--fake-world", 1, "--cluster", "h100-sxm", *args, "--out", tmp_path / "t", "--",
                    "tests/jobs/timed_steps.py")
    assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "t").exists()
