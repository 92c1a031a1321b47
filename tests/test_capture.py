"""Capture on real gloo ranks: every collective type, exact events, phases. (A skipped collective's
timeout: tests/test_doctor.py's injected missing-collective run.)"""

import torch.distributed as dist

from meshscope.capture.recorder import Capture, active, suspended
from meshscope.core.events import CommEvent
from meshscope.experiments import get

from .helpers import failed_checks, run_many


def test_every_collective_captured_exactly_on_4_ranks(tmp_path):
    # world 4 tp 2 (tp and dp groups overlap) and tp 4 (world 2: the torchrun test below)
    r4 = run_many(tmp_path / "w4", [("collectives", {}), ("collectives", {"tp": 4})], world=4, timeout=120)
    for result in r4:
        assert result["passed"], failed_checks(result)
        assert result["comm"]["match"]
    tp2 = r4[0]  # the chapter's layout: world 4, tp 2
    per_op = {"all_reduce": 8, "all_gather": 10, "reduce_scatter": 10, "all_to_all": 12, "send": 6, "recv": 6,
              "broadcast": 2, "barrier": 2}
    for row in tp2["comm"]["per_rank"]:
        assert row["captured"] == per_op == row["predicted"]
    events = [CommEvent.from_json(e) for e in tp2["comm"]["events"]["captured"]]
    rank0_tp = [e for e in events if e.rank == 0 and e.axis == "tp"]
    rank0_dp = [e for e in events if e.rank == 0 and e.axis == "dp"]
    assert {e.group for e in rank0_tp} == {(0, 1)} and {e.group for e in rank0_dp} == {(0, 2)}
    first = rank0_tp[0]
    assert (first.op, first.phase, first.bytes_in, first.bytes_out, first.seq) == ("all_reduce", "forward", 128, 128, 0)
    gather = next(e for e in rank0_tp if e.region == "c10d.all_gather_into_tensor")
    assert (gather.bytes_in, gather.bytes_out) == (128, 256)
    # uneven all_to_all_single: member i sends i + j + 1 rows of 8 fp32 to member j
    a2a = {e.rank: e for e in events if e.axis == "tp" and e.region == "c10d.all_to_all_single"}
    assert a2a[0].input_splits == (1, 2) and a2a[0].output_splits == (1, 2)
    assert a2a[1].input_splits == (2, 3) and a2a[1].output_splits == (2, 3)
    assert (a2a[1].bytes_in, a2a[1].bytes_out) == (5 * 32, 5 * 32)
    sends = [e for e in rank0_tp if e.op == "send"]
    assert {e.peer for e in sends} == {1} and len(sends) == 3
    backward = [(e.region, e.op) for e in rank0_tp if e.phase == "backward"]
    assert backward == [("loss.backward", "all_to_all"), ("autograd.AllToAllV", "all_to_all"),
                        ("autograd.ReduceScatterSum", "all_gather"), ("autograd.AllGatherCat", "reduce_scatter"),
                        ("autograd.AllReduceSum", "all_reduce")]
    bwd_a2a = next(e for e in events if e.rank == 1 and e.axis == "tp" and e.phase == "backward"
                   and e.region == "autograd.AllToAllV")
    assert bwd_a2a.input_splits == (2, 3)  # swapped: what rank 1 received, it sends back


def test_capture_patches_only_while_active_and_nests():
    originals = (dist.all_reduce, dist.send, dist.all_to_all_single)
    with Capture():
        assert dist.all_reduce is not originals[0]
        with Capture():
            assert active()
        assert active() and dist.send is not originals[1]
    assert (dist.all_reduce, dist.send, dist.all_to_all_single) == originals
    assert not active()


def test_suspended_restores_torch_and_resumes_every_capture():
    originals = (dist.all_reduce, dist.send)
    with Capture() as outer:
        patched = dist.all_reduce
        with suspended():
            assert not active() and (dist.all_reduce, dist.send) == originals
            with Capture():  # a capture entered while suspended still works
                assert dist.all_reduce is not originals[0]
            assert dist.all_reduce is originals[0]
        assert active() and dist.all_reduce is patched and outer.events == []
    assert (dist.all_reduce, dist.send) == originals
    # a capture that exits while suspended does not come back
    cap = Capture().__enter__()
    with suspended():
        cap.__exit__(None, None, None)
    assert not active() and (dist.all_reduce, dist.send) == originals


def test_predicted_ledger_of_collectives_is_per_group_ordered():
    exp = get("collectives")
    events = exp.predict(exp.config({}))
    for rank in range(4):
        for axis in ("tp", "dp"):
            seqs = [e.seq for e in events if e.rank == rank and e.axis == axis]
            assert seqs == list(range(len(seqs))) and len(seqs) == 28


def test_same_entry_point_runs_as_one_rank_of_a_users_torchrun(tmp_path):
    import json
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "meshscope", "run", "collectives", "--world", "2", "--tp", "2", "--json", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["passed"] and result["world"] == 2, failed_checks(result)
    assert result["comm"]["match"]  # every collective captured exactly on 2 ranks
    assert sorted(p.name for p in (tmp_path / "flight").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]


_INTERLEAVED = """
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
dist.init_process_group("gloo", rank=0, world_size=1)
from meshscope.capture.recorder import Capture, region, suspended
x = torch.ones(3)
log = []
flight = Capture(on_issue=lambda e: log.append(("issued", e.seq, e.region)),
                 on_complete=lambda e: log.append(("completed", e.seq)))
with flight, Capture() as ledger:
    with region("a"):
        dist.all_reduce(x)
        assert log == [("issued", 0, "a"), ("completed", 0)]  # written at the call, not when read
    with suspended():
        dist.all_reduce(x)  # neither capture sees it
    with region("b"):
        dist.all_reduce(x)
print([(e.seq, e.region) for e in ledger.events], log)
dist.destroy_process_group()  # before the interpreter's teardown, which may abort on gloo's live threads
"""


def test_lazy_and_immediate_captures_number_the_same_calls_alike():
    import random
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _INTERLEAVED.format(port=random.randint(20000, 40000))],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ("[(0, 'a'), (1, 'b')] [('issued', 0, 'a'), ('completed', 0), "
                                   "('issued', 1, 'b'), ('completed', 1)]")
