"""Steady steps found from a rank's own calls (`core.steady`), never from a fixed step number: pure cases
with known answers, and DDP with ``static_graph=True``, whose bucket rebuild comes a step later than plain
DDP's (torch's own order, `tests/jobs/ddp.py`'s docstring: the oracle)."""

from __future__ import annotations

import json

import pytest

from meshscope.core.events import CommEvent
from meshscope.core.steady import MIN_RUN, WARMUP_LIMIT, Steady, find, of_ranks, warmup_note
from meshscope.trace.checks import steady_steps

from .helpers import ROOT, cli_here


def _call(k, op="all_reduce", b=64, step=None, ins=None):
    return CommEvent(0, k, op, "world", (0, 1), "backward", "float32", b, b, step=step, input_splits=ins,
                     output_splits=ins)


def _steps(*shapes) -> dict[int, list[CommEvent]]:
    """Steps 0.. each as a list of (op, bytes) pairs."""
    return {k: [_call(i, op, b, k) for i, (op, b) in enumerate(calls)] for k, calls in enumerate(shapes)}


SET_UP = [("broadcast", 1024), ("all_reduce", 1024)]
STEADY = [("all_reduce", 256)] * 4


def test_the_run_starts_after_the_warm_up_the_calls_show():
    plain = _steps(SET_UP, [("all_reduce", 1024)], *[STEADY] * 4)
    assert find(plain, 6).steps == [2, 3, 4, 5]
    static = _steps(SET_UP, [("all_reduce", 1024)], [("broadcast", 20), ("broadcast", 16)] + STEADY, *[STEADY] * 3)
    s = find(static, 6)
    assert s.steps == [3, 4, 5] and [k for k, _ in s.warmup] == [1, 2]
    assert "broadcast on world 2 where the steady step has 0" in dict(s.warmup)[2]
    assert "all_reduce on world 1 where the steady step has 4" in dict(s.warmup)[1]


def test_a_warm_up_step_alike_the_steady_step_is_said_so():
    """DDP with static_graph and one bucket (TorchRec's dense part): step 1 issues the steady step's calls,
    step 2 adds the bucket rebuild, so the run starts at step 3 and step 1 is warm-up with nothing apart."""
    s = find(_steps(SET_UP, STEADY, [("broadcast", 20)] + STEADY, STEADY, STEADY), 5)
    assert s.first == 3 and dict(s.warmup)[1] == "the steady step's calls, but the next step differs"


def test_step_0_is_never_steady_and_step_1_can_be():
    s = find(_steps(STEADY, STEADY, STEADY), 3)
    assert s.first == 1 and s.steps == [1, 2] and s.warmup == ()


def test_a_trace_too_short_for_a_run_is_undecided_and_a_long_one_is_decided():
    alternating = [[("all_reduce", 64)], [("all_reduce", 128)]]
    short = find(_steps(SET_UP, *alternating * 2), 5)
    assert short.first is None and not short.decided and short.needed(2) == 1 + WARMUP_LIMIT + 2
    long = find(_steps(SET_UP, *alternating * 3), 1 + WARMUP_LIMIT + MIN_RUN)
    assert long.first is None and long.decided


def test_the_check_fails_a_divergence_after_the_run_and_steps_that_never_repeat():
    def check(shapes):
        events = [e for calls in _steps(*shapes).values() for e in calls]
        return steady_steps(events, of_ranks(events, {0: len(shapes)}))
    assert check([SET_UP, STEADY, STEADY, STEADY]).passed
    late = check([SET_UP, STEADY, STEADY, STEADY + [("broadcast", 8)]])
    assert late.failed and "rank 0 step 3 issued 5 calls, steady step 1 4" in late.detail
    never = check([SET_UP] + [[("all_reduce", 64 * (k + 1))] for k in range(6)])
    assert never.failed and "never repeat" in never.detail
    undecided = check([SET_UP, [("all_reduce", 64)], [("all_reduce", 128)]])
    assert undecided.status == "not_checked" and "trace more steps" in undecided.detail


def test_all_to_all_sizes_follow_the_routing():
    a2a = lambda ins: [_call(0, "all_to_all", sum(ins) * 4, ins=ins)]  # noqa: E731
    steps = {0: a2a((1, 1)), 1: a2a((3, 1)), 2: a2a((1, 3)), 3: a2a((2, 2))}
    assert find(steps, 4).steps == [1, 2, 3]


def test_the_note_names_the_warm_up_once_for_ranks_alike():
    s = Steady(6, 3, ((1, "all_reduce on world 1 where the steady step has 4"),
                      (2, "broadcast on world 2 where the steady step has 0")))
    note = warmup_note({0: s, 1: s, 3: Steady(6, 1)})
    assert "ranks 0-1: steady from step 3, skipping step 1: all_reduce" in note and "ranks 3" not in note
    assert warmup_note({0: Steady(6, 1)}) == ""
    assert Steady.from_json(json.loads(json.dumps(s.to_json()))) == s


@pytest.fixture(scope="module")
def static_graph(tmp_path_factory):
    out = tmp_path_factory.mktemp("static") / "run"
    proc = cli_here("trace", "--nproc-per-node", 2, "--out", out, "--json", "--",
                    ROOT / "tests/jobs/ddp.py", "--steps", 6, "--static-graph")
    return proc, json.loads(proc.stdout)


def test_ddp_with_a_static_graph_passes_with_its_rebuild_as_warm_up(static_graph):
    """torch 2.13's DDP with static_graph=True rebuilds its buckets in its third iteration (step 2: two
    int32 broadcasts of the bucket layout, once): it is warm-up, not a divergence."""
    proc, doc = static_graph
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-2000:]
    steps = {s["step"]: [e["op"] for e in s["events"]] for s in doc["per_rank"][0]["steps"]}
    assert steps[2].count("broadcast") == 2 and "broadcast" not in steps[3]  # the oracle: torch's own order
    assert {r: s["first"] for r, s in doc["steady"].items()} == {"0": 3, "1": 3}
    check = next(c for c in doc["checks"] if c["name"] == "steady steps repeat")
    assert check["status"] == "passed" and check["detail"].startswith("steady steps 3-5 on each of 2 ranks")
    assert any("steady from step 3, skipping step 1" in n and "step 2: broadcast on world 2" in n for n in doc["notes"])
    assert doc["time"]["steps"] == [3, 4, 5]
