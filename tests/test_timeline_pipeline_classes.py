"""The forecast's step simulation (`forecast.timeline`) with a pipeline's inner stages played by their class: a
fake world traces one rank per class, and a pipeline's odd inner stages are one class (docs/trace.md), so stage 3
is played by stage 1. Its members issue the same calls with their peers relabelled by offset, so a receive from
stage 3 must be matched with stage 1's send to the next stage (offset +1), not with whatever stage 1 sends to the
class of the receiver (found with Megatron GPT-3 175B on TP 8 x PP 8: stage 2's forward sends to stage 3 were
paired with stage 1's backward receives from stage 2, and its class's step came out 23.1 s instead of 15.2 s).
Stage 3 runs as a player of its own, stage 1's program at stage 3's place: played by stage 1 itself, its backward
(which waits for stage 4's) and stage 1's (which waits for stage 2's, which waits for stage 3's) waited for each
other, and the calls were timed without their partners."""

from meshscope.core.events import CommEvent
from meshscope.forecast.timeline import Simulation

PP = (0, 1, 2, 3, 4)
PLAYS = {0: 0, 1: 1, 2: 2, 3: 1, 4: 4}
"""A pipeline of 5 as a fake world's classes: the first, the odd inner ones (1 and 3), the even inner one, the last."""


def _p2p(rank, seq, op, peer):
    return CommEvent(rank, seq, op, "pp", PP, "forward", "bfloat16", 1024, 1024, peer=peer, step=1)


def _stage(rank, backward=False):
    """Stage `rank` of a pipeline of one microbatch: receive from the stage before (but the first), compute 1 s,
    send to the stage after (but the last); with `backward`, then receive from the stage after (but the last),
    compute 2 s, send to the stage before (but the first)."""
    ledger, program = [], []

    def move(op, peer, wait):
        ledger.append(_p2p(rank, len(ledger), op, peer))
        program.append(["i", len(ledger) - 1, 0])
        if wait:
            program.append(["w", len(ledger) - 1, 0])

    if rank > 0:
        move("recv", rank - 1, True)
    program.append(["c", "forward", {"bfloat16": 1.0}, 0, 0, 0])
    if rank < PP[-1]:
        move("send", rank + 1, False)
    if backward:
        if rank < PP[-1]:
            move("recv", rank + 1, True)
        program.append(["c", "backward", {"bfloat16": 2.0}, 0, 0, 0])
        if rank > 0:
            move("send", rank - 1, False)
    return ledger, program


def _run(backward):
    traced = sorted(set(PLAYS.values()))  # 0, 1, 2, 4: stage 3 is played by stage 1
    stages = {r: _stage(r, backward) for r in traced}
    sim = Simulation({r: p for r, (_, p) in stages.items()}, {r: ledger for r, (ledger, _) in stages.items()},
                     PLAYS.get, compute_s=lambda item: item[2]["bfloat16"], call_s=lambda e: 0.0)
    return traced, sim, sim.run()


def test_a_pipeline_stage_played_by_its_class_is_matched_by_offset():
    traced, sim, out = _run(backward=False)
    assert not sim.unmatched  # every send finds its receive at the mirrored offset, played or traced
    # each stage computes a second after the one before: stage 3 (stage 1's program at its place) 3-4 s, so stage 4
    # receives at 4 s and ends at 5 s (matched with stage 1's own send, at 2 s, it had ended at 3 s; unmatched, at 1)
    assert [out[r].end_s for r in traced] == [1.0, 2.0, 3.0, 5.0]
    assert out[4].calls[0].start == 4.0 and out[4].calls[0].waited_for_peers == 4.0


def test_a_played_stages_backward_waits_for_the_stages_after_it_not_for_its_representative():
    traced, sim, out = _run(backward=True)
    assert not sim.unmatched  # timed alone, stage 2's backward had begun at 3 s and stage 0's ended at 9 s
    # forward: stage s computes s to s+1 s; stage 4 then its backward, 5-7 s; each stage before it 2 s later
    # (stage 3, played, 7-9 s): stage 2 ends at 11 s, stage 1 at 13 s, stage 0 at 15 s
    assert [out[r].end_s for r in traced] == [15.0, 13.0, 11.0, 7.0]


def test_a_played_stages_collective_is_with_the_ranks_of_its_own_stage():
    # TP 2 x PP 4, rank = tp + 2 * stage; stage 2 (ranks 4, 5) played by stage 1 (ranks 2, 3). Each stage receives
    # from the one before (but the first), computes 1 s, all-reduces over its TP pair (1 s), sends on (but the
    # last). Stage 2's all-reduce is its own pair's (played 4 and 5), not stage 1's (2 and 3, which ran at 3-4 s).
    plays = {0: 0, 1: 1, 2: 2, 3: 3, 4: 2, 5: 3, 6: 6, 7: 7}

    def stage(rank):
        s, column = rank // 2, tuple(rank % 2 + 2 * k for k in range(4))
        ledger, program = [], []
        if s > 0:
            ledger.append(CommEvent(rank, 0, "recv", "pp", column, "forward", "bfloat16", 1, 1, peer=rank - 2, step=1))
            program += [["i", 0, 0], ["w", 0, 0]]
        program.append(["c", "forward", {"bfloat16": 1.0}, 0, 0, 0])
        tp = (rank - rank % 2, rank - rank % 2 + 1)
        ledger.append(CommEvent(rank, len(ledger), "all_reduce", "tp", tp, "forward", "bfloat16", 1, 1, step=1))
        program += [["i", len(ledger) - 1, 0], ["w", len(ledger) - 1, 0]]
        if s < 3:
            ledger.append(CommEvent(rank, len(ledger), "send", "pp", column, "forward", "bfloat16", 1, 1,
                                    peer=rank + 2, step=1))
            program.append(["i", len(ledger) - 1, 0])
        return ledger, program

    traced = sorted(set(plays.values()))
    stages = {r: stage(r) for r in traced}
    seconds = {"all_reduce": 1.0}
    sim = Simulation({r: p for r, (_, p) in stages.items()}, {r: ledger for r, (ledger, _) in stages.items()},
                     plays.get, compute_s=lambda item: item[2]["bfloat16"],
                     call_s=lambda e: seconds.get(e.op, 0.0))
    out = sim.run()
    assert not sim.unmatched
    # stage s computes at 2 s, all-reduces at 2 s + 1, sends at 2 s + 2: stage 3 ends at 8 s
    assert [out[r].end_s for r in traced] == [2.0, 2.0, 4.0, 4.0, 8.0, 8.0]


def test_a_played_stages_other_point_to_point_group_is_its_own_stages():
    # CP 2 x PP 5, rank = cp + 2 * stage; stage 3 (6, 7) played by stage 1 (2, 3). Each stage receives from the one
    # before, computes 1 s, exchanges with its cp peer (a send and a receive of 1 s in one batch, both waited), sends
    # on. Stage 3's exchange is between 6 and 7 at 7-8 s, not stage 1's (2 and 3, at 3-4 s): stage 4 ends at 10 s.
    plays = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 2, 7: 3, 8: 8, 9: 9}

    def stage(rank):
        s, cp = rank // 2, rank % 2
        column, ring = tuple(cp + 2 * k for k in range(5)), (2 * s, 2 * s + 1)
        ledger, program = [], []

        def issue(op, axis, group, peer):
            ledger.append(CommEvent(rank, len(ledger), op, axis, group, "forward", "bfloat16", 1, 1, peer=peer, step=1))
            program.append(["i", len(ledger) - 1, 0])
            return len(ledger) - 1

        if s > 0:
            program.append(["w", issue("recv", "pp", column, rank - 2), 0])
        program.append(["c", "forward", {"bfloat16": 1.0}, 0, 0, 0])
        sent, received = issue("send", "cp", ring, ring[1 - cp]), issue("recv", "cp", ring, ring[1 - cp])
        program += [["w", sent, 0], ["w", received, 0]]
        if s < 4:
            issue("send", "pp", column, rank + 2)
        return ledger, program

    traced = sorted(set(plays.values()))
    stages = {r: stage(r) for r in traced}
    sim = Simulation({r: p for r, (_, p) in stages.items()}, {r: ledger for r, (ledger, _) in stages.items()},
                     plays.get, compute_s=lambda item: item[2]["bfloat16"],
                     call_s=lambda e: 1.0 if e.axis == "cp" else 0.0)
    out = sim.run()
    assert not sim.unmatched
    assert [out[r].end_s for r in traced] == [2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 10.0, 10.0]
