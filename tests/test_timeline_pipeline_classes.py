"""The forecast's step simulation (`forecast.timeline`) with a pipeline's inner stages played by their class: a
fake world traces one rank per class, and a pipeline's odd inner stages are one class (docs/trace.md), so stage 3
is played by stage 1. Its members issue the same calls with their peers relabelled by offset, so a receive from
stage 3 must be matched with stage 1's send to the next stage (offset +1), not with whatever stage 1 sends to the
class of the receiver (found with Megatron GPT-3 175B on TP 8 x PP 8: stage 2's forward sends to stage 3 were
paired with stage 1's backward receives from stage 2, and its class's step came out 23.1 s instead of 15.2 s)."""

from meshscope.core.events import CommEvent
from meshscope.forecast.timeline import Simulation

PP = (0, 1, 2, 3, 4)
PLAYS = {0: 0, 1: 1, 2: 2, 3: 1, 4: 4}
"""A pipeline of 5 as a fake world's classes: the first, the odd inner ones (1 and 3), the even inner one, the last."""


def _p2p(rank, seq, op, peer):
    return CommEvent(rank, seq, op, "pp", PP, "forward", "bfloat16", 1024, 1024, peer=peer, step=1)


def _stage(rank):
    """Stage `rank` of a forward-only pipeline: receive from the stage before (but the first), compute 1 s, send to
    the stage after (but the last)."""
    ledger, program = [], []
    if rank > 0:
        ledger.append(_p2p(rank, len(ledger), "recv", rank - 1))
        program += [["i", 0, 0], ["w", 0, 0]]
    program.append(["c", "forward", {"bfloat16": 1.0}, 0, 0, 0])
    if rank < PP[-1]:
        ledger.append(_p2p(rank, len(ledger), "send", rank + 1))
        program.append(["i", len(ledger) - 1, 0])
    return ledger, program


def test_a_pipeline_stage_played_by_its_class_is_matched_by_offset():
    traced = sorted(set(PLAYS.values()))  # 0, 1, 2, 4: stage 3 is played by stage 1
    stages = {r: _stage(r) for r in traced}
    sim = Simulation({r: p for r, (_, p) in stages.items()}, {r: ledger for r, (ledger, _) in stages.items()},
                     PLAYS.get, compute_s=lambda item: item[2]["bfloat16"], call_s=lambda e: 0.0)
    out = sim.run()
    assert not sim.unmatched  # every send finds its receive at the mirrored offset, played or traced
    # stage 1 sends at 2 s, so stage 2 computes 2-3 s; stage 4 receives what stage 3 (played by stage 1) sends,
    # at 2 s, and ends at 3 s (unmatched, it started alone at 0 and ended at 1 s)
    assert [out[r].end_s for r in traced] == [1.0, 2.0, 3.0, 3.0]
    assert out[4].calls[0].start == 2.0 and out[4].calls[0].waited_for_peers == 2.0
