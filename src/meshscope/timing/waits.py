"""Who waited for whom: every collective instance's arrivals on one clock, and the waits they imply.

A collective instance is the k-th call of one group on each of its members (gloo and NCCL run a
group's calls in issue order on every member). Its members cannot start it before the last one
arrives, so each other member waits ``last arrival - own arrival``. Point-to-point calls pair as the
trace's check pairs them (the k-th send i->j with the k-th recv on j from i), the wait on the
receiving side.

**Arrival is not issue**: a call queued asynchronously (DDP's bucket all-reduces from autograd's
thread, FSDP2's prefetched all-gathers, any ``async_op=True``) is issued while the rank's earlier
calls on that group are still running, and a group runs its calls in order, so the rank arrives at
the call only when it issued it AND its previous call on the group completed:
``arrival = max(t_issue, previous t_complete on the group)``; a point-to-point message queues behind
nothing, its arrival is its issue. Without a completion time (a fake
world, or a rank that recorded none) the previous call's issue stands in, which can only make an
arrival earlier, never a wait longer.

**On a GPU** a call's CPU issue runs ahead of the GPU, so a slow kernel delays no issue: where a call
has its arrival on the GPU (`CommEvent.t_gpu`, NCCL), that is its issue here, and its group's previous
call completed on the GPU at its own arrival plus its time there (`CommEvent.gpu_ms`: torch's Flight
Recorder times a collective from when its stream started it, which is that arrival, to its end).

All times are on the common clock: a rank's ``t_issue`` and ``t_complete`` (seconds since its own
start) plus its offset (`trace.clock`). A fake world's ranks run one after another: waits mean
nothing there, and the trace says so instead of calling this.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..core.events import P2P, CommEvent


@dataclass(frozen=True)
class Instance:
    """One collective instance (or one send/recv pair): who arrived when, and who waited for whom."""

    axis: str
    group: tuple[int, ...]
    seq: int
    """Its position on the group (for a pair: the k-th message from sender to receiver)."""
    op: str
    step: int
    arrivals: dict[int, float]
    """Member -> its arrival on the common clock."""
    waits: dict[int, float]
    """Member -> how long it waited for the last arrival (0 for the last)."""
    last: int
    """The member that arrived last (for a pair: the sender when the receiver waited)."""
    calls: dict[int, CommEvent] = field(default_factory=dict, compare=False, repr=False)
    """Member -> its call."""

    @property
    def skew(self) -> float:
        return max(self.arrivals.values()) - min(self.arrivals.values())

    @property
    def caused(self) -> float:
        """The others' mean wait: what the last member's lateness cost each of them."""
        others = [w for r, w in self.waits.items() if r != self.last]
        return sum(others) / len(others) if others else 0.0


def arrivals(events: list[CommEvent], offsets: dict[int, float]) -> dict[CommEvent, float]:
    """Each call's arrival on the common clock (module docstring)."""
    out: dict[CommEvent, float] = {}
    by: dict[tuple, list[CommEvent]] = defaultdict(list)
    for e in events:
        if e.t_issue is None:
            continue
        if e.op in P2P:  # point-to-point messages do not queue behind a group's collectives
            out[e] = _issued(e, offsets)
        else:
            by[(e.rank, e.axis, e.group)].append(e)
    for calls in by.values():
        before = None  # the group's previous call's completion, on the common clock
        for e in sorted(calls, key=lambda c: c.seq):
            ready = _issued(e, offsets)
            out[e] = ready if before is None else max(ready, before)
            before = completed(e, out[e], offsets)
            if before is None:
                before = ready
    return out


def _issued(e: CommEvent, offsets: dict[int, float]) -> float:
    return (e.t_gpu if e.t_gpu is not None else e.t_issue) + offsets.get(e.rank, 0.0)


def completed(e: CommEvent, arrived: float, offsets: dict[int, float]) -> float | None:
    """When `e`, arrived at `arrived`, completed on the common clock: on the GPU where it was timed
    there, else when its rank saw its work complete; None where neither is known."""
    if e.t_gpu is not None and e.gpu_ms is not None:
        return arrived + e.gpu_ms * 1e-3
    return None if e.t_complete is None else e.t_complete + offsets.get(e.rank, 0.0)


def instances(events: list[CommEvent], offsets: dict[int, float]) -> list[Instance]:
    """Every collective instance whose members were all traced, and every send/recv pair."""
    when = arrivals(events, offsets)
    traced = {e.rank for e in events}
    members: dict[tuple, dict[int, CommEvent]] = defaultdict(dict)
    sends: dict[tuple, list[CommEvent]] = defaultdict(list)
    recvs: dict[tuple, list[CommEvent]] = defaultdict(list)
    for e in events:
        if e not in when:
            continue
        if e.op == "send":
            sends[(e.rank, e.peer)].append(e)
        elif e.op == "recv":
            recvs[(e.peer, e.rank)].append(e)
        elif e.op not in P2P:
            members[(e.axis, e.group, e.seq)][e.rank] = e
    out = []
    for (axis, group, seq), calls in members.items():
        if len(calls) < 2 or not set(group) <= traced or len(calls) != len(group):
            continue
        arrived = {r: when[e] for r, e in calls.items()}
        start = max(arrived.values())
        last = max(arrived, key=lambda r: (arrived[r], r))
        first = next(iter(calls.values()))
        out.append(Instance(axis, group, seq, first.op, first.step or 0, arrived,
                            {r: start - t for r, t in arrived.items()}, last, dict(calls)))
    for (src, dst), sent in sends.items():
        got = sorted(recvs.get((src, dst), []), key=lambda e: when[e])
        for k, (s, r) in enumerate(zip(sorted(sent, key=lambda e: when[e]), got)):
            arrived = {src: when[s], dst: when[r]}
            wait = max(0.0, when[s] - when[r])  # the receiver waits for the send; a send is buffered
            out.append(Instance(s.axis, (src, dst), k, "send/recv", r.step or 0, arrived, {src: 0.0, dst: wait},
                                src if wait > 0 else dst, {src: s, dst: r}))
    return sorted(out, key=lambda i: (min(i.arrivals.values()), i.axis, i.seq))


@dataclass
class RankTime:
    """One rank's time on one axis in one step."""

    inside: float = 0.0
    """Seconds from its arrivals to its calls' completions (where it recorded them)."""
    waiting: float = 0.0
    """Seconds it waited for a later member."""
    caused: float = 0.0
    """Seconds its lateness cost the others, each instance's mean wait of the others."""


@dataclass
class StepTime:
    """Per axis and rank, one step's time in and around its collectives."""

    step: int
    ranks: dict[tuple[str, int], RankTime] = field(default_factory=dict)

    def of(self, axis: str, rank: int) -> RankTime:
        return self.ranks.setdefault((axis, rank), RankTime())


def per_step(events: list[CommEvent], offsets: dict[int, float],
             found: list[Instance] | None = None) -> dict[int, StepTime]:
    """Step -> per (axis, rank): time inside collectives, waiting, and waits caused (`found`: the
    events' `instances`, where already known)."""
    out: dict[int, StepTime] = {}
    when = arrivals(events, offsets)
    for e, arrived in when.items():
        end = completed(e, arrived, offsets)
        if end is not None:
            step = out.setdefault(e.step or 0, StepTime(e.step or 0))
            step.of(e.axis, e.rank).inside += max(0.0, end - arrived)
    for inst in found if found is not None else instances(events, offsets):
        step = out.setdefault(inst.step, StepTime(inst.step))
        for rank, wait in inst.waits.items():
            step.of(inst.axis, rank).waiting += wait
        step.of(inst.axis, inst.last).caused += inst.caused
    return dict(sorted(out.items()))
