"""The forecast's step simulation (`forecast.timeline`) on programs written by hand: each expected time is
worked out in the test from the two-stream rules of the module (compute stream, one stream per group)."""

from meshscope.core.events import CommEvent
from meshscope.forecast.timeline import Simulation


def _event(rank, index, op, group, axis="dp", peer=None):
    return CommEvent(rank, index, op, axis, tuple(group), "backward", "float32", 1024, 1024, peer=peer, step=1)


def _compute(seconds, stream=0):
    return ["c", "backward", {"float32": seconds}, 0, 0, stream]


def _sim(programs, ledgers, represent=None, seconds=None):
    seconds = seconds or {}
    return Simulation(programs, ledgers, represent or (lambda r: r),
                      compute_s=lambda item: item[2] if item[0] == "h" else item[2].get("float32", 0.0),
                      call_s=lambda e: seconds.get((e.rank, e.seq), 1.0)).run()


def test_a_call_waited_at_once_is_exposed_whole_and_one_waited_later_hides_behind_compute():
    # rank 0 alone in its group: compute 2 s, issue call 0 (1 s), wait at once -> exposed 1 s;
    # issue call 1 (1 s), compute 3 s, wait -> hidden
    ledger = [_event(0, 0, "all_reduce", [0]), _event(0, 1, "all_reduce", [0])]
    program = [_compute(2.0), ["i", 0, 0], ["w", 0, 0], ["i", 1, 0], _compute(3.0), ["w", 1, 0]]
    tl = _sim({0: program}, {0: ledger})[0]
    assert tl.calls[0].waited == 1.0 and tl.calls[1].waited == 0.0
    assert tl.compute_s == 5.0 and tl.end_s == 6.0  # 2 + 1 (exposed) + 3


def test_calls_on_one_group_queue_on_its_stream():
    # two 1-s calls issued back to back at t=0 on one group, waited together: the second ends at 2 s
    ledger = [_event(0, 0, "all_reduce", [0]), _event(0, 1, "all_reduce", [0])]
    tl = _sim({0: [["i", 0, 0], ["i", 1, 0], ["w", 0, 0], ["w", 1, 0]]}, {0: ledger})[0]
    assert (tl.calls[0].end, tl.calls[1].start, tl.calls[1].end) == (1.0, 1.0, 2.0)
    assert tl.end_s == 2.0


def test_a_collective_starts_when_its_slowest_member_issued_it():
    # ranks 0 and 1 in one group; rank 1 computes 4 s before issuing, rank 0 1 s: both end at 5 s, and rank 0's
    # 4-s wait is 3 s of waiting for its peer and 1 s of the transfer
    group = [0, 1]
    ledgers = {0: [_event(0, 0, "all_reduce", group)], 1: [_event(1, 0, "all_reduce", group)]}
    programs = {0: [_compute(1.0), ["i", 0, 0], ["w", 0, 0]], 1: [_compute(4.0), ["i", 0, 0], ["w", 0, 0]]}
    out = _sim(programs, ledgers)
    assert out[0].end_s == out[1].end_s == 5.0
    assert out[0].calls[0].waited == 4.0 and out[0].calls[0].waited_for_peers == 3.0
    assert out[1].calls[0].waited == 1.0 and out[1].calls[0].waited_for_peers == 0.0


def test_a_pipeline_receive_waits_for_the_stage_before_it():
    # stage 0 computes 2 s and sends (0.5 s); stage 1 receives, then computes 1 s: it ends at 3.5 s
    pp = [0, 1]
    ledgers = {0: [_event(0, 0, "send", pp, "pp", peer=1)], 1: [_event(1, 0, "recv", pp, "pp", peer=0)]}
    programs = {0: [_compute(2.0), ["i", 0, 0]], 1: [["i", 0, 0], ["w", 0, 0], _compute(1.0)]}
    out = _sim(programs, ledgers, seconds={(0, 0): 0.5, (1, 0): 0.5})
    assert out[1].calls[0].start == 2.0 and out[1].end_s == 3.5
    assert out[1].calls[0].waited_for_peers == 2.0  # the bubble
    assert out[0].end_s == 2.5  # its send ends with the transfer


def test_an_untraced_rank_is_played_by_its_class():
    # a world of 4 in one dp group; ranks 2, 3 are played by rank 1 (4 s of compute), 0 by itself (1 s)
    group = [0, 1, 2, 3]
    ledgers = {0: [_event(0, 0, "all_reduce", group)], 1: [_event(1, 0, "all_reduce", group)]}
    programs = {0: [_compute(1.0), ["i", 0, 0], ["w", 0, 0]], 1: [_compute(4.0), ["i", 0, 0], ["w", 0, 0]]}
    out = _sim(programs, ledgers, represent={0: 0, 1: 1, 2: 1, 3: 1}.get)
    assert out[0].end_s == 5.0


def test_batched_sends_and_receives_run_together():
    # batch_isend_irecv on one pp group: a send and a receive issued back to back take max(1, 1) = 1 s, not 2
    pp = [0, 1]
    ledgers = {0: [_event(0, 0, "send", pp, "pp", peer=1), _event(0, 1, "recv", pp, "pp", peer=1)],
               1: [_event(1, 0, "recv", pp, "pp", peer=0), _event(1, 1, "send", pp, "pp", peer=0)]}
    programs = {0: [["i", 0, 0], ["i", 1, 0], ["w", 1, 0]], 1: [["i", 0, 0], ["i", 1, 0], ["w", 0, 0]]}
    out = _sim(programs, ledgers)
    assert out[0].end_s == out[1].end_s == 1.0


def test_a_call_issued_on_a_side_stream_runs_beside_compute_until_the_compute_stream_waits_for_it():
    # FSDP2's pattern: the side stream 1 waits for nothing, issues an all-gather (2 s) while the compute
    # stream computes 3 s, then the compute stream reads it: hidden. A reduce-scatter issued after the side
    # stream waited for the compute stream (wait_stream) starts only then: 3 s + 1 s, exposed 1 s at the end.
    ledger = [_event(0, 0, "all_gather", [0]), _event(0, 1, "reduce_scatter", [0])]
    program = [["i", 0, 1], _compute(3.0), ["w", 0, 0], ["j", 1, 0], ["i", 1, 1], ["w", 1, 0]]
    tl = _sim({0: program}, {0: ledger}, seconds={(0, 0): 2.0, (0, 1): 1.0})[0]
    assert tl.calls[0].waited == 0.0 and tl.calls[1].start == 3.0 and tl.calls[1].waited == 1.0
    assert tl.end_s == 4.0


def test_a_side_stream_that_waited_for_a_call_passes_the_wait_on_as_the_calls_exposed_time():
    # FSDP2 under c10d's Work.wait: its all-gather stream 1 issues a 2-s all-gather and waits for it there, records
    # event 0; the compute stream, at 0.5 s, waits for the event (1.5 s) and again, through wait_stream, for
    # stream 1 after a second 1-s call: both waits are the calls' exposed time, none a wait on a side stream's
    # work. Once stream 1 computes after its wait (0.25 s), a wait for it is for that work.
    ledger = [_event(0, 0, "all_gather", [0]), _event(0, 1, "all_gather", [0])]
    program = [_compute(0.5), ["i", 0, 1], ["w", 0, 1], ["e", 0, 1], ["v", 0, 0],
               ["i", 1, 1], ["w", 1, 1], ["j", 0, 1], _compute(0.25, stream=1), ["j", 0, 1]]
    tl = _sim({0: program}, {0: ledger}, seconds={(0, 0): 2.0, (0, 1): 1.0})[0]
    assert (tl.calls[0].waited, tl.calls[1].waited) == (1.5, 1.0)
    assert tl.waited_on_streams_s == 0.25 and tl.end_s == 3.25


def test_an_event_orders_the_compute_stream_after_a_side_streams_work():
    # side stream 1 computes 2 s (a copy) and records event 0; the compute stream waits for it at t = 0.5
    program = [_compute(0.5), _compute(2.0, stream=1), ["e", 0, 1], ["v", 0, 0], _compute(1.0)]
    tl = _sim({0: program}, {0: []})[0]
    assert tl.end_s == 3.0 and tl.waited_on_streams_s == 1.5 and tl.side_compute_s == 2.0


def test_a_wait_whose_partner_never_issues_is_timed_alone_and_counted():
    group = [0, 1]
    ledgers = {0: [_event(0, 0, "all_reduce", group)], 1: [_event(1, 0, "all_gather", group)]}
    sim = Simulation({0: [["i", 0, 0], ["w", 0, 0]], 1: [["i", 0, 0], ["w", 0, 0]]}, ledgers, lambda r: r,
                     compute_s=lambda item: 0.0, call_s=lambda e: 1.0)
    out = sim.run()
    assert out[0].end_s == 1.0 and sim.unmatched == {(0, 0), (1, 0)}


def test_sends_to_one_peer_in_one_batch_run_one_after_another():
    # two 1-s sends to rank 1 in one batch share the link to it: 2 s, not 1
    pp = [0, 1]
    ledgers = {0: [_event(0, 0, "send", pp, "pp", peer=1), _event(0, 1, "send", pp, "pp", peer=1)],
               1: [_event(1, 0, "recv", pp, "pp", peer=0), _event(1, 1, "recv", pp, "pp", peer=0)]}
    programs = {0: [["i", 0, 0], ["i", 1, 0]], 1: [["i", 0, 0], ["i", 1, 0], ["w", 0, 0], ["w", 1, 0]]}
    out = _sim(programs, ledgers)
    assert out[0].end_s == out[1].end_s == 2.0


def test_a_collective_starts_on_every_member_at_once():
    # rank 0's first call (an uneven all-to-all) takes 3 s, rank 1's side of it 1 s; the second call waits for
    # both members' streams: it runs 3-4 s on both ranks
    group = [0, 1]
    ledgers = {r: [_event(r, 0, "all_to_all", group), _event(r, 1, "all_reduce", group)] for r in (0, 1)}
    programs = {r: [["i", 0, 0], ["i", 1, 0], ["w", 1, 0]] for r in (0, 1)}
    out = _sim(programs, ledgers, seconds={(0, 0): 3.0, (1, 0): 1.0, (0, 1): 1.0, (1, 1): 1.0})
    assert [(out[r].calls[1].start, out[r].calls[1].end) for r in (0, 1)] == [(3.0, 4.0), (3.0, 4.0)]


def test_the_hosts_work_waits_for_the_jobs_streams_and_holds_back_all_of_them():
    # CPU offload's step: compute 1 s, a copy on side stream 1 (2 s, its gradients to the host) once it waited for
    # the compute stream (1-3), a reduce-scatter (2 s) issued on stream 1 after it (3-5, on its group's stream);
    # the optimizer on the host (3 s) starts once streams 0 and 1 are done (3: the compute stream waited 2 s) and
    # ends at 6, when both go on; the next all-gather (1 s) is issued at 6, beside 1 s of compute (6-7)
    ledger = [_event(0, 0, "reduce_scatter", [0]), _event(0, 1, "all_gather", [0], axis="dp")]
    program = [_compute(1.0), ["j", 1, 0], _compute(2.0, stream=1), ["i", 0, 1], ["h", "optimizer", 3.0],
               ["i", 1, 0], _compute(1.0), ["w", 0, 0], ["w", 1, 0]]
    tl = _sim({0: program}, {0: ledger}, seconds={(0, 0): 2.0, (0, 1): 1.0})[0]
    assert (tl.calls[0].start, tl.calls[0].end, tl.calls[1].start, tl.calls[1].end) == (3.0, 5.0, 6.0, 7.0)
    assert tl.calls[0].waited == 0.0 and tl.calls[1].waited == 0.0 and tl.waited_on_streams_s == 2.0
    assert tl.compute_s == 5.0 and tl.compute_by_phase == {"backward": 2.0, "optimizer": 3.0} and tl.end_s == 7.0


def test_each_call_of_a_batch_starts_when_its_own_pair_is_ready():
    # rank 0 sends to rank 1 and receives from rank 2 in one batch at t = 0, and waits; rank 1 receives at 0; rank 2
    # computes 5 s before it sends. The send to rank 1 runs at 0 (its pair is ready), the receive at 5; the batch, one
    # NCCL group, ends with the receive at 6, and rank 1's receive at 1.
    group = (0, 1, 2)
    ledgers = {0: [_event(0, 0, "send", group, "pp", peer=1), _event(0, 1, "recv", group, "pp", peer=2)],
               1: [_event(1, 0, "recv", group, "pp", peer=0)], 2: [_event(2, 0, "send", group, "pp", peer=0)]}
    programs = {0: [["i", 0, 0], ["i", 1, 0], ["w", 0, 0], ["w", 1, 0]], 1: [["i", 0, 0], ["w", 0, 0]],
                2: [_compute(5.0), ["i", 0, 0]]}
    out = _sim(programs, ledgers)
    assert (out[0].calls[0].start, out[0].calls[1].start, out[0].calls[0].end, out[0].end_s) == (0.0, 5.0, 6.0, 6.0)
    assert out[1].calls[0].end == 1.0 and out[1].end_s == 1.0
