"""A pipeline as picotron builds it (tests/jobs/picotron_pipeline.py): unnamed groups, P2P on the default
group with global peers, a loss all-reduce on the last stage only. Its real trace is held against the
fake world's verdict on the same job, and a fake world's rank classes against every rank traced."""

from __future__ import annotations

from meshscope.core.trace_result import TraceResult
from meshscope.trace.assemble import load

from .helpers import ROOT, fake_equals_real, trace_json
from .test_fake_world import _members, _relabelled

JOB = ROOT / "tests" / "jobs" / "picotron_pipeline.py"


def test_a_family_of_1_rank_groups_that_only_the_last_stage_calls_on_partitions_the_world(tmp_path):
    """pp 2 at dp 1 (world 2): picotron's 1-rank families (tp, cp, dp, cp_dp) are one family of [0], [1],
    named tp, its first; only the last stage (rank 1) all-reduces its loss there. Every rank created all of
    them (the job's docstring), so the real trace lists the family whole, as the fake world's does, and
    both pass (the real one failed 'the tp groups [[1]] leave out ranks [0]' when it read axes from calls)."""
    job = [str(JOB), "--pp", "2", "--steps", "3"]
    fake = fake_equals_real(tmp_path, 2, job)
    real = load(tmp_path / "real")
    assert real.passed, [c for c in real.checks if not c.passed]
    assert real.axes == fake["axes"] == {"pp": [[0, 1]], "tp": [[0], [1]]}
    loss = [e for e in real.events if e.op == "all_reduce"]
    assert {(e.rank, e.group, e.bytes_in) for e in loss} == {(1, (1,), 4)} and len(loss) == 3  # once a step


def test_a_pipeline_on_the_default_group_keeps_each_stage_in_classes_of_its_own(tmp_path):
    """tp 3 x pp 4 (world 12): rank 9 (last stage) and rank 3 (stage 1) are both odd and first of their
    tp, cp and dp groups only, so places on the default group put them in one class; their pipeline's
    places keep them apart. Oracle: every rank traced, each class's ranks issue its representative's
    ledger up to relabelling; and by hand (the job's docstring), per steady step M = 2 sends on an end
    stage, 2M on a middle one, and the loss all-reduce on the last stage only."""
    job = [str(JOB), "--pp", "4", "--tp", "3", "--steps", "3"]
    _, auto = trace_json(tmp_path / "auto", "--fake-world", 12, job)
    _, whole = trace_json(tmp_path / "whole", "--fake-world", 12, "--ranks", ",".join(map(str, range(12))), job)
    assert auto["passed"] and whole["passed"], auto["notes"]
    members = _members(auto["fake_world"]["classes"])
    stage = {r: r // 3 % 4 for r in range(12)}
    assert members == {0: [0], 1: [1, 2], 3: [3], 4: [4, 5], 6: [6], 7: [7, 8], 9: [9], 11: [10, 11]}
    assert all(len({stage[r] for r in ranks}) == 1 for ranks in members.values())
    everyone = TraceResult.from_json(whole)
    for rep, ranks in members.items():
        for r in ranks:
            assert _relabelled(everyone, r) == _relabelled(everyone, rep), (rep, r)
    sends = {r: sum(e.op == "send" for e in everyone.steps_of(r)[1]) for r in range(12)}
    reduces = {r: sum(e.op == "all_reduce" for e in everyone.steps_of(r)[1]) for r in range(12)}
    assert sends == {r: 2 if stage[r] in (0, 3) else 4 for r in range(12)}
    assert reduces == {r: int(stage[r] == 3) for r in range(12)}
