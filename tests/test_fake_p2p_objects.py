"""A pickled object sent as its length, then its bytes, over ``batch_isend_irecv`` (Colossal-AI 0.5.0's pipeline
P2P, tests/jobs/pickled_p2p.py) in a fake world: every stage gets what the other sent (`trace.fake.replay`,
`trace.fake.world.retrace`), held against the job's hand count and its gloo trace; a stage whose sender is
not traced is named with the receive it held zeros in."""

from __future__ import annotations

import json

from meshscope.core.rank_end import RankEnd
from meshscope.core.rundir import RunDir
from meshscope.trace.fake import stood_in
from meshscope.trace.fake.world import retrace

from .helpers import ROOT, cli_here, trace_json

JOB = [str(ROOT / "tests" / "jobs" / "pickled_p2p.py"), "--check", "--steps", "2"]

# one step of each stage at tp 2, M = 2, by hand (the job's docstring): (op, bytes_in, bytes_out) in order
STAGE_0 = [("all_reduce", 64, 64), ("send", 8, 0), ("send", 80, 0), ("send", 64, 0), ("all_reduce", 96, 96),
           ("send", 8, 0), ("recv", 0, 8), ("send", 80, 0), ("recv", 0, 80), ("send", 96, 0), ("recv", 0, 64),
           ("recv", 0, 8), ("recv", 0, 80), ("recv", 0, 96)]
STAGE_1 = [("recv", 0, 8), ("recv", 0, 80), ("recv", 0, 64), ("all_reduce", 64, 64), ("send", 8, 0), ("recv", 0, 8),
           ("send", 80, 0), ("recv", 0, 80), ("send", 64, 0), ("recv", 0, 96), ("all_reduce", 96, 96), ("send", 8, 0),
           ("send", 80, 0), ("send", 96, 0)]


def test_pickled_metadata_over_batch_isend_irecv_reaches_every_stage_as_on_gloo(tmp_path):
    """tp 2 x pp 2, ``--ranks auto``: rank 3 (stage 1), traced beside rank 0, hears nothing from rank 1 and fails on
    the zeros it unpickles; rank 0 takes for its gradients' metadata what it sent as its activations' (the
    mirror). Each is traced again after its senders and gets their bytes: every rank issues the hand count
    of every step, nothing assumed and no stand-in left, and the gloo trace's ledgers. Before, ranks 0 and 3
    both failed 'EOFError: Ran out of input' and the trace stopped there."""
    _, real = trace_json(tmp_path / "real", "--nproc-per-node", 4, JOB)
    proc, fake = trace_json(tmp_path / "fake", "--fake-world", 4, JOB)
    assert real["passed"] and fake["passed"], proc.stderr[-3000:]
    for rank_doc in fake["per_rank"]:
        want = STAGE_0 if rank_doc["rank"] < 2 else STAGE_1
        for step in rank_doc["steps"]:
            assert [(e["op"], e["bytes_in"], e["bytes_out"]) for e in step["events"]] == want, (rank_doc["rank"], step)
            assert not any(e["assumed"] for e in step["events"])
    assert sorted(r["rank"] for r in fake["per_rank"]) == [0, 1, 2, 3]
    assert not any("kept the rank's own" in n or "held zeros" in n for n in fake["notes"]), fake["notes"]
    diff = json.loads(cli_here("diff", tmp_path / "real", tmp_path / "fake", "--json").stdout)
    assert diff["same"] and diff["assumed"]["calls"] == {"a": 0, "b": 0}, diff


def test_a_stage_whose_sender_is_not_traced_is_named_with_the_receive_that_held_zeros(tmp_path):
    """``--ranks 3``: no rank ever sends rank 3 its inputs' metadata, so its first receive (the pickle's length)
    holds zeros and the job's own unpickling fails; the result names that receive and the rank to trace,
    instead of leaving the script's EOFError unexplained, and the doctor blames the fake world, not the script."""
    proc, doc = trace_json(tmp_path / "alone", "--fake-world", 4, "--ranks", "3", JOB)
    assert proc.returncode == 1 and not doc["passed"]
    (note,) = [n for n in doc["notes"] if "held zeros" in n]
    assert note.startswith("fake backend: rank 3 failed after a receive of integers"), note
    assert "recv on axis1 [1,3] at step 0 (rank 1 not traced before it)" in note
    assert note.endswith("trace rank 1 too (--ranks)"), note
    # the rank's record names it too (`RankEnd.made_up`), by the axis the note names: the doctor's blame
    root = doc["doctor"]["findings"][0]
    assert root["root_cause"] and root["kind"] == "fake-world-gap" and root["entry"].startswith("EOFError"), root
    assert "recv on axis1 [1,3] at step 0 (rank 1 not traced before it): it held zeros" in root["cause"], root


def test_a_rank_that_passed_on_a_p2p_stand_in_is_traced_again_after_its_sender(tmp_path):
    """`world.retrace` by hand: rank 0 passed, keeping its own integers in a receive from rank 2, which ended after
    it: traced again; rank 1 passed, keeping its own in an all_reduce with rank 3, which ended after it: not (a
    collective's stand-in is traced again only where the rank failed); rank 3 kept its own in a receive from
    rank 5, never traced: not."""
    run_dir = RunDir(tmp_path)
    for rank, time in ((0, 1.0), (1, 1.0), (2, 2.0), (3, 2.0)):
        run_dir.rank_end(rank).parent.mkdir(exist_ok=True)
        run_dir.rank_end(rank).write_text(json.dumps(RankEnd(rank, "ok", time=time).to_json()))
    for rank, op, sender in ((0, "recv", 2), (1, "all_reduce", 3), (3, "recv", 5)):
        call = stood_in.StandIn(op, stood_in.UNNAMED, tuple(sorted((rank, sender))), 0, ((sender, stood_in.UNTRACED),))
        stood_in.write(run_dir, rank, 1, [call])
    assert retrace(run_dir, [0, 1, 2, 3]) == [0]
