"""What a fake world's rank receives from tensor collectives and P2P messages: what the traced rank that sent
it sent (`trace.fake.replay`), else a stand-in (its own part in that place, else zeros), named in a note, with
what it sized assumed; a rank that failed on values it made up is traced again after their sender
(`trace.fake.world.retrace`).

Oracles: the hand count of tests/jobs/received_sizes.py's docstring (every call after the first of each
pair is sized by values received in it), and the real gloo trace of the same script under `meshscope diff`."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import pytest
import torch
import torch.distributed as dist

from meshscope.cli.trace_command import cmd_diff
from meshscope.core.rank_end import RankEnd
from meshscope.core.rundir import RunDir
from meshscope.core.trace_result import TraceResult
from meshscope.trace.fake import receives, stood_in
from meshscope.trace.fake.world import retrace

from .helpers import ROOT, CountClock, trace_json

JOB = [str(ROOT / "tests" / "jobs" / "received_sizes.py")]
SIZES = ("bytes_in", "bytes_out")
EVEN = ("output_splits", "bytes_out")
UNEVEN = ("input_splits", "output_splits", "bytes_in", "bytes_out")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """The job's gloo trace at world 2, its fake world of 2 (ranks 0 and 1, 1 forked after 0), rank 1 alone, and
    the fake world of 2 where rank 0 checks what it received."""
    out = tmp_path_factory.mktemp("replay")
    runs = {"gloo": ("--nproc-per-node", 2), "fake": ("--fake-world", 2), "alone": ("--fake-world", 2, "--ranks", 1),
            "checked": ("--fake-world", 2, [*JOB, "--check", 0])}
    traced = {}
    for name, flags in runs.items():
        proc, doc = trace_json(out / name, *(flags if isinstance(flags[-1], list) else (*flags, JOB)))
        assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
        traced[name] = (out / name, TraceResult.from_json(doc))
    return traced


def _calls(result: TraceResult, rank: int) -> list[tuple]:
    return [(e.step, e.op, e.dtype, e.bytes_in, e.bytes_out, e.input_splits, e.output_splits, e.peer)
            for e in result.events if e.rank == rank]


def test_a_later_rank_receives_what_rank_0_sent_and_issues_what_gloo_did(traces, capsys):
    """Rank 1 runs after rank 0 and receives what it sent: the broadcast 5 sizes its all_reduce (20 B, not its
    own 2's 8 B), rank 0's counts size its uneven all-to-all ([3, 4] rows in, not the mirror [2, 4]) and its
    receives (24 B): every call is gloo's, none assumed. Rank 0 cannot know rank 1's sends: its all-gather of
    sizes and count exchange keep its own, a note names both, and what they sized is assumed; `meshscope diff`
    compares everything else (fake == gloo)."""
    (gloo_dir, gloo), (fake_dir, fake) = traces["gloo"], traces["fake"]
    assert fake.fake_world.traced == (0, 1)
    assert _calls(fake, 1) == _calls(gloo, 1)
    assert not any(e.assumed for e in fake.events if e.rank == 1)
    rank0 = [(e.step, e.op, e.assumed) for e in fake.events if e.rank == 0]
    per_step = [("broadcast", ()), ("all_reduce", ()), ("all_gather", ()), ("all_gather", SIZES),
                ("all_to_all", EVEN), ("all_to_all", UNEVEN), ("send", ()), ("send", ())]
    assert rank0 == [(step, op, assumed) for step in (0, 1) for op, assumed in per_step]
    note = next(n for n in fake.notes if "kept the rank's own" in n)
    assert note.startswith("fake backend: 4 calls") and (
        "rank 0: all_gather on default_pg [0-1] at step 0 (rank 1 not traced before it), all_to_all on "
        "default_pg [0-1] at step 0 (rank 1 not traced before it)") in note

    assert cmd_diff(argparse.Namespace(dir_a=gloo_dir, dir_b=fake_dir, json=True)) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["same"] and not diff["rows"], diff
    assert diff["assumed"]["calls"] == {"a": 0, "b": 6}


def test_a_sender_not_traced_is_named_and_what_its_value_sized_is_assumed(traces):
    """Rank 1 alone: rank 0 was not traced, so its broadcast, all-gather, count exchange and receive keep rank
    1's own integers; each is named in the note (op, group, step, the sender) and the sizes of the calls the
    same function issued after it are assumed (the all_reduce of 2 floats, the padded gather, the uneven
    all-to-all, the rows received), not presented as known."""
    _, alone = traces["alone"]
    assert alone.fake_world.traced == (1,)
    per_step = [("broadcast", ()), ("all_reduce", SIZES), ("all_gather", ()), ("all_gather", SIZES),
                ("all_to_all", EVEN), ("all_to_all", UNEVEN), ("recv", ()), ("recv", SIZES)]
    assert [(e.step, e.op, e.assumed) for e in alone.events] == [(s, op, a) for s in (0, 1) for op, a in per_step]
    all_reduce = next(e for e in alone.events if e.op == "all_reduce")
    assert all_reduce.bytes_in == 8  # its own 2 floats: made up, and marked so
    note = next(n for n in alone.notes if "kept the rank's own" in n)
    assert note.startswith("fake backend: 8 calls on rank 1 ") and (
        "rank 1: broadcast on default_pg [0-1] at step 0 (rank 0 not traced before it), all_gather on "
        "default_pg [0-1] at step 0 (rank 0 not traced before it)") in note and "and 4 more" in note


def test_a_rank_that_failed_on_values_it_made_up_is_traced_again_after_their_sender(traces, capsys):
    """With --check 0 rank 0 exits at the first value it received that is not gloo's: its all-gather of sizes,
    rank 1's part of which it could not know (rank 1 runs after it), as TorchRec's rank 0 crashed in fbgemm on
    counts it made up. Rank 0 is traced again after rank 1, and receives what rank 1 sent; rank 1, whose calls
    after rank 0's exit got nothing from it, is traced again after that. Both then issue what gloo did, none
    assumed, and the note says so."""
    (gloo_dir, _), (checked_dir, checked) = traces["gloo"], traces["checked"]
    assert not any(e.assumed for e in checked.events)
    assert any(n.startswith("ranks [0, 1] were traced again after the others") for n in checked.notes), checked.notes
    assert not any("kept the rank's own" in n for n in checked.notes)
    assert cmd_diff(argparse.Namespace(dir_a=gloo_dir, dir_b=checked_dir, json=True)) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["same"] and diff["assumed"]["calls"] == {"a": 0, "b": 0}, diff


@pytest.mark.parametrize("op, want", [("SUM", [5, 1, 9]), ("MAX", [4, 1, 5]), ("MIN", [1, 0, 4]),
                                      ("BAND", [0, 0, 4]), ("AVG", [2, 0, 4])])
def test_a_reduction_of_known_parts_is_torchs(op, want):
    """What a rank gets from a reduction whose members' inputs are all known, by hand."""
    parts = [torch.tensor([1, 0, 4]), torch.tensor([4, 1, 5])]
    assert receives.reduce(getattr(torch.distributed.ReduceOp, op), parts).tolist() == want


def test_the_note_names_the_first_calls_per_rank_and_counts_the_rest():
    call = stood_in.StandIn("broadcast", "default_pg", (0, 1, 2, 3), 2, ((0, "not traced before it"),
                                                                        (2, "not traced before it")))
    text = stood_in.note({3: (5, [call] * 5)}, {})
    assert ("5 calls on rank 3 " in text and "rank 3: broadcast on default_pg [0-3] at step 2 (ranks 0,2 not traced "
            "before it), broadcast" in text and "; and 1 more (objects/rank<R>/stood-in.json)" in text)
    assert stood_in.note({}, {}) is None


def test_the_note_names_an_unnamed_group_by_its_axis():
    """picotron names no group (torch's placeholder 'undefined'): the note says the axis its members make in the
    trace's layout (inferred), as the table does, and 'group' where they make none."""
    call = stood_in.StandIn("all_reduce", stood_in.UNNAMED, (0, 2), 0, ((2, "not traced before it"),))
    assert "rank 0: all_reduce on pp [0,2] at step 0" in stood_in.note({0: (1, [call])}, {(0, 2): "pp"})
    assert "rank 0: all_reduce on group [0,2] at step 0" in stood_in.note({0: (1, [call])}, {(0, 1): "tp"})


def test_the_made_up_receive_names_an_unnamed_group_by_its_axis():
    """`RankEnd.made_up` (the doctor's words for a rank that failed after it) names a group the job named not as
    the note does: by the axis its members make, 'group' where they make none."""
    from meshscope.trace.fake.replay import Replay

    replay = Replay()
    replay.named = [stood_in.StandIn("all_reduce", stood_in.UNNAMED, (0, 2), 0, ((2, stood_in.UNTRACED),))]
    assert replay.made_up(lambda: {(0, 2): "pp"}) == ("all_reduce on pp [0,2] at step 0 (rank 2 not traced before it): it "
                                             "held the rank's own")
    assert replay.made_up(dict).startswith("all_reduce on group [0,2] at step 0")
    assert Replay().made_up(lambda: 1 / 0) == ""  # no stand-in: the group log is not read


def test_retrace_takes_a_failed_rank_after_its_senders_and_a_rank_they_cut_short_after_them(tmp_path):
    """`world.retrace` on stand-in records by hand: rank 0 failed after keeping its own for rank 1, which ended
    after it: traced again; rank 2 failed on rank 5's, never traced: not; rank 1 passed, keeping its own where
    rank 0 (which failed first) sent nothing: traced again only once rank 0 was, and ended after it."""
    run_dir = RunDir(tmp_path)

    def end(rank, status, time):
        run_dir.rank_end(rank).parent.mkdir(exist_ok=True)
        run_dir.rank_end(rank).write_text(json.dumps(RankEnd(rank, status, time=time).to_json()))

    def kept(rank, sender, why):
        stood_in.write(run_dir, rank, 1, [stood_in.StandIn("all_to_all", "default_pg", (0, 1, 2), 0, ((sender, why),))])

    end(0, "error", 1.0), end(1, "ok", 2.0), end(2, "error", 2.5)
    kept(0, 1, stood_in.UNTRACED), kept(1, 0, stood_in.UNSENT), kept(2, 5, stood_in.UNTRACED)
    assert retrace(run_dir, [0, 1, 2]) == [0]
    end(0, "ok", 3.0)
    stood_in.clear(run_dir, 0)
    assert retrace(run_dir, [0, 1, 2], [0]) == [1]
    assert retrace(run_dir, [0, 1, 2], []) == []


def test_retrace_takes_a_rank_whose_missing_p2p_record_was_written_since_whenever_its_sender_ended(tmp_path):
    """Ranks run side by side: rank 1 (a pipeline's next stage) ended at 2.0, before rank 0 (3.0), yet wrote the
    record of its message after rank 0 looked for it. Rank 0 passed, so only that record now being there says
    a second run would receive it (under load the end times said nothing: test_fake_world's pipelining case
    kept an assumed receive on a fresh clone); rank 2, whose missing record is still missing, is not taken."""
    run_dir = RunDir(tmp_path)
    run_dir.rank_end(0).parent.mkdir(exist_ok=True)
    record = run_dir.objects(1) / "p2p-0.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    for rank, time, unheard in ((0, 3.0, ("objects/rank1/p2p-*.json",)), (1, 2.0, ()),
                                (2, 3.5, ("objects/rank7/p2p-*.json",))):
        run_dir.rank_end(rank).write_text(json.dumps(RankEnd(rank, "ok", time=time, unheard=unheard).to_json()))
    assert retrace(run_dir, [0, 1, 2]) == [0]


def test_retrace_takes_a_rank_that_left_no_record_after_the_senders_it_kept_its_own_for(tmp_path):
    """A rank killed in native code may leave no record, only the stand-ins it wrote as they happened (TorchRec's
    rank 0, fbgemm's heap corruption: ``free(): invalid pointer``, SIGABRT): it is traced again once rank 1,
    whose counts it kept its own for, ended; one that kept its own for a rank never traced is not."""
    run_dir = RunDir(tmp_path)
    run_dir.rank_end(1).parent.mkdir(exist_ok=True)
    run_dir.rank_end(1).write_text(json.dumps(RankEnd(1, "ok", time=2.0).to_json()))
    for rank, sender in ((0, 1), (2, 5)):
        stood_in.write(run_dir, rank, 1, [stood_in.StandIn("all_to_all", "default_pg", (0, 1, 2), 0,
                                                           ((sender, stood_in.UNTRACED),))])
    assert run_dir.read_end(0).status == "missing"
    assert retrace(run_dir, [0, 1, 2]) == [0]


@pytest.fixture
def rank_0_of_2(tmp_path, monkeypatch):
    """This process as rank 0 of a fake group of 2 whose rank 1 was never traced (an empty run directory), in
    process: `replay.Call`s record and read there."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meshscope.trace.fake.objects import EXCHANGE

    for name, value in (("run_dir", RunDir(tmp_path)), ("rank", 0), ("alongside", {}), ("earlier", set()),
                        ("calls", {}), ("unheard", set())):
        monkeypatch.setattr(EXCHANGE, name, value)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


LEFT = -7
"""What a backend that writes nothing leaves in a receive buffer (``torch.empty``'s bytes), in these tests."""


def _left(*shape):
    return torch.full(shape, LEFT)


STAND_INS = {  # c10d function -> (its arguments on rank 0, what it receives into, what that holds after: by hand)
    # its own chunk [10, 11, 12] stands for rank 1's of as many rows; where rank 1's is said to be 2 rows, zeros
    "all_to_all_single": (lambda: {"output": _left(6), "input": torch.tensor([10, 11, 12, 20, 21]),
                                   "output_split_sizes": [3, 3], "input_split_sizes": [3, 2]},
                          lambda g: g["output"], [10, 11, 12, 10, 11, 12]),
    "all_to_all_single uneven": (lambda: {"output": _left(5), "input": torch.tensor([10, 11, 12, 20, 21]),
                                          "output_split_sizes": [3, 2], "input_split_sizes": [3, 2]},
                                 lambda g: g["output"], [10, 11, 12, 0, 0]),
    "all_to_all": (lambda: {"output_tensor_list": [_left(2), _left(2)],
                            "input_tensor_list": [torch.tensor([1, 2]), torch.tensor([3, 4])]},
                   lambda g: torch.cat(g["output_tensor_list"]), [1, 2, 1, 2]),
    "all_gather": (lambda: {"tensor_list": [_left(2), _left(2)], "tensor": torch.tensor([5, 6])},
                   lambda g: torch.cat(g["tensor_list"]), [5, 6, 5, 6]),
    "all_gather_into_tensor": (lambda: {"output_tensor": _left(4), "input_tensor": torch.tensor([5, 6])},
                               lambda g: g["output_tensor"], [5, 6, 5, 6]),
    "gather": (lambda: {"tensor": torch.tensor([5, 6]), "gather_list": [_left(2), _left(2)], "dst": 0},
               lambda g: torch.cat(g["gather_list"]), [5, 6, 5, 6]),
    "scatter": (lambda: {"tensor": _left(2), "src": 1}, lambda g: g["tensor"], [0, 0]),
    "broadcast": (lambda: {"tensor": torch.tensor([3, 4]), "src": 1}, lambda g: g["tensor"], [3, 4]),
}


@pytest.mark.parametrize("case", list(STAND_INS))
def test_a_part_from_a_rank_not_traced_is_the_ranks_own_in_its_place_or_zeros(rank_0_of_2, case):
    """Whatever the backend left in a part rank 1 (not traced) sends rank 0, rank 0 holds a stand-in: its own
    part in that place (an all-to-all's chunk to itself, an all-gather's or gather's input, a broadcast's own
    tensor) where it is of the part's size, else zeros (a scatter's receiver has none). Not the bytes left
    there: the backend here writes nothing (torch.empty's bytes), and torch 2.13's fills an uneven all-to-all's
    chunk j with the rank's first rows (FakeProcessGroup.hpp ``alltoall_base``), so the KJT lengths TorchRec's
    rank 0 took for rank 1's came from one chunk of its input and their ids' count from another: fbgemm's
    permute ran off the end of its buffer. The call names rank 1 (noted, and what it sized assumed); only
    zeros leave it unfilled."""
    from meshscope.trace.fake.replay import Call

    function = case.split()[0]
    make, received, want = STAND_INS[case]
    op, handle = receives.HANDLERS[function]
    given = make()
    call = Call(op, rank_0_of_2, False).collective()
    handle(call, lambda: None, given)
    assert received(given).tolist() == want
    assert call.missing == {1: stood_in.UNTRACED}
    assert call.unfilled == (want[-1] == 0)


def test_a_list_all_to_all_whose_parts_differ_by_peer_runs_and_is_recorded_as_issued(rank_0_of_2):
    """Rank 0 sends rank 1 three rows and receives one from it (counts exchanged first, as NCCL jobs do): torch
    2.13's fake backend copies input j into output j and raised ("output with shape [1] doesn't match the
    broadcast shape [2]"). The call now runs, the recorder reads it as the script issued it (by hand: 5 int64
    rows in, [2, 3]; 3 out, [2, 1]), the rank's own chunk lands in its slot and rank 1's part (not traced, of
    another size than rank 0's own) holds zeros."""
    import torch.distributed as dist

    from meshscope.capture import dispatch
    from meshscope.trace.fake.replay import Call

    outputs, inputs = [_left(2), _left(1)], [torch.tensor([1, 2]), torch.tensor([3, 4, 5])]
    seen = []
    dispatch.install()
    op, handle = receives.HANDLERS["all_to_all"]
    with dispatch.Recorder(lambda *call: seen.append(call)):
        handle(Call(op, rank_0_of_2, False).collective(), lambda: dist.all_to_all(outputs, inputs),
               {"output_tensor_list": outputs, "input_tensor_list": inputs})
    assert torch.cat(outputs).tolist() == [1, 2, 0]
    assert [(c[0], c[2], c[3], c[4], list(c[6]), list(c[7])) for c in seen] == [
        ("all_to_all", "int64", 40, 24, [2, 3], [2, 1])]


@contextlib.contextmanager
def _rank_0_counted(tmp_path, clock=None):
    """Rank 0's work counter (with `clock`: its segments measured) and replay, the counter's mode on in the block;
    each c10d op the mode sees issues one call."""
    from meshscope.capture.job_context import JobContext
    from meshscope.capture.work import CountingMode, WorkCounter
    from meshscope.trace.fake.replay import Replay

    context = JobContext()
    context.install()
    counter = WorkCounter(0, context, clock=clock)
    replay = Replay()
    replay.begin(RunDir(tmp_path), 0, context, on=True)
    calls = iter(range(10))
    try:
        with CountingMode(counter, lambda: next(calls)):
            yield counter, replay
    finally:
        context.remove()


def test_what_a_rank_is_given_in_a_call_is_not_its_work(rank_0_of_2, tmp_path):
    """The stand-ins a rank's all-gather slots get (rank 1 not traced: rank 0's own input in its place) and the
    copy of its own slot are this fake world's writes, where NCCL's kernel writes the output: under --work none
    is counted or held (at world 1,024 an all-gather writes 1,023 slots: 7.2 s of an 8B model's measured step on
    an H100), while the call itself is still the rank's: its issue and its output, needed where first read."""
    given = {"output_tensor": _left(4), "input_tensor": torch.tensor([5, 6])}
    op, handle = receives.HANDLERS["all_gather_into_tensor"]
    with _rank_0_counted(tmp_path) as (counter, replay):
        replay.run(op, handle, lambda: dist.all_gather_into_tensor(**given), given, rank_0_of_2, sys._getframe())
        given["output_tensor"].sum()
    assert given["output_tensor"].tolist() == [5, 6, 5, 6]
    items = counter.finish().items
    assert [item[0] for item in items] == ["i", "w", "c"], items
    assert items[2][4] == 4 * 8 + 8  # the sum: it reads the gathered 4 int64 and writes one


def test_a_list_all_to_all_issued_as_one_is_needed_where_its_parts_are_written(rank_0_of_2, tmp_path):
    """An all-to-all whose parts differ by peer is issued as one tensor with splits, and what that received is
    copied into the job's parts: those copies stand for the job reading what the call wrote, so the call is
    needed there (a wait item before them), not left running to the step's end as if nothing read it."""
    given = {"output_tensor_list": [_left(1), _left(2)], "input_tensor_list": [torch.tensor([1]),
                                                                              torch.tensor([3, 4, 5])]}
    op, handle = receives.HANDLERS["all_to_all"]
    with _rank_0_counted(tmp_path) as (counter, replay):
        replay.run(op, handle, lambda: dist.all_to_all(**given), given, rank_0_of_2, sys._getframe())
        given["output_tensor_list"][1].sum()
    assert [item[0] for item in counter.finish().items] == ["i", "w", "c"]


def test_a_measured_segment_ends_before_the_replays_own_work(rank_0_of_2, tmp_path):
    """What a fake world's replay does before it issues the call (its clones of what a reduction sends, its
    record of it) is not the rank's compute: the segment open before ends at the replay's first op, so a clock
    sees none of the replay's steps in it, nor in the segment after the call."""
    taken = []  # the replay's own steps: the clock's time

    def handle(call, issue, given):
        torch.ones(1)  # the replay's first op: its own, like `_all_reduce`'s clone of what it sends
        taken.extend((1, 2))
        return issue()

    tensor = torch.ones(4)
    with _rank_0_counted(tmp_path, CountClock(lambda: len(taken))) as (counter, replay):
        tensor.mul_(2)
        replay.run("all_reduce", handle, lambda: dist.all_reduce(tensor), {"tensor": tensor}, rank_0_of_2,
                   sys._getframe())
        tensor.sum()
    items = counter.finish().items
    assert [item[0] for item in items] == ["c", "i", "w", "c"], items
    assert [item[6] for item in items if item[0] == "c"] == [0, 0]


def test_an_all_gather_above_the_cap_gives_each_part_the_ranks_own_without_reading_a_record(rank_0_of_2, monkeypatch):
    """No member's part of a float all-gather above the cap is recorded (each is this rank's size), so each is
    rank 0's own input in its place, as part by part, written at once: no member's record is read (at world 1,024
    the 1,023 reads and copies were half a rank's time under --real-tensors, py-spy on the box, 2026-12-07)."""
    from meshscope.trace.fake import replay

    monkeypatch.setattr(replay, "CAP_FLOAT", 8)
    monkeypatch.setattr(replay.Call, "sent", lambda self, j: pytest.fail(f"read rank {j}'s record"))
    op, handle = receives.HANDLERS["all_gather_into_tensor"]
    given = {"output_tensor": torch.full((6,), float(LEFT)), "input_tensor": torch.tensor([1.0, 2.0, 3.0])}
    call = replay.Call(op, rank_0_of_2, False).collective()
    handle(call, lambda: None, given)
    assert given["output_tensor"].tolist() == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    assert call.missing == {} and not call.unfilled
