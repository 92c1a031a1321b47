"""One step of a job on a cluster, rank class by rank class: compute on the job's streams, each call on its
group's stream, from where the job issued it to where it first needs what the call produced.

Each traced rank's program (`capture.work`: compute segments, calls issued, calls first needed, orders between
streams, in order) runs on the streams a GPU runs it on:

- **the job's streams**: the default (compute) stream and each stream the job selected (FSDP2's copy-in,
  all-gather and reduce-scatter streams), each running its segments one after the other, ordered against
  each other only where the job ordered them (``wait_stream``, an event recorded and waited for): the CPU is
  taken to run ahead of the GPU, as it does between two waits; at a call's first read a stream waits until the
  call has finished (the compute stream's wait is the call's *exposed* part);
- **one stream per group** (NCCL runs each communicator's kernels on its own stream): a group's calls run in
  issue order, each starting once the rank has issued it (after the work before it on the stream it was issued
  on, which the call's stream waits for, as ``ProcessGroupNCCL`` makes it), its previous call on the group has finished, and every
  member has issued its matching call. Point-to-point calls issued back to back on one group with no compute
  between them run together (``batch_isend_irecv``: one NCCL group call), a send and its receive at once.

A rank that was not traced is played by its class's representative (`FakeWorld.classes`): a member's
matching call is the representative's call of the same axis, size and position, a pipeline peer's receive
the representative's receive from the member at the mirrored offset in the group (a class's members issue the
same calls with their peers relabelled by offset: its odd inner stages each receive from the stage before
them). A forecast's trace traces every stage of a pipeline (`trace.fake.classes.rank_classes`' `exact`); in a
trace whose classes put stages together, a stage of a traced rank's pipeline played by a rank at another stage of
it runs as a player of its own: the representative's program, at its own place, its peers the stages next to that
place and its collectives' members the ranks of its own stage (a stage's calls wait for the stages after it in
backward, which its representative, earlier in the pipeline, reaches only after its own: played by the
representative itself, the two would wait for each other, and a trace of Megatron GPT-3 175B at TP 8 x PP 8 x DP
16 timed its pipeline's calls without their partners, the bubble unseen). Calls on different groups share no
bandwidth in this model (docs/forecast.md says what that leaves out), and every rank starts the step at 0: the
step's own syncs (gradient all-reduce, a loss broadcast) align the ranks the way a real step's previous end does.

The result per traced rank: when its step ended, the compute it ran, and per call the start, end and the
time the compute stream waited on it, split into waiting for a member that had not issued yet (a pipeline
bubble, a slower rank class) and waiting for the transfer itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..capture.work import COMPUTE, EVENT_WAITED, HOST_WORK, ISSUE, RECORDED, STREAM_WAITS, WAIT
from ..core.events import P2P, CommEvent


@dataclass
class CallTime:
    """One call of one traced rank in the forecast step."""

    event: CommEvent
    seconds: float
    """Its time on its link (`collective_time`), alone."""
    issued: float | None = None
    """When the rank issued it (its compute stream's time there); None until the simulation reaches it."""
    ready: float = 0.0
    """When it could have started on this rank alone: issued, and the group's stream free."""
    start: float | None = None
    end: float | None = None
    waited: float = 0.0
    """How long the compute stream waited for it (its exposed time)."""
    waited_for_peers: float = 0.0
    """Of `waited`, the part before every member had issued it (a bubble, a slower class)."""
    alone: bool = False
    """Timed without its partners: their matching calls were not found in the trace."""


@dataclass
class RankTimeline:
    """One traced rank's forecast step."""

    rank: int
    compute_s: float = 0.0
    """Compute-stream busy time, the host's work included (it holds the stream)."""
    side_compute_s: float = 0.0
    """Busy time of the job's other streams (FSDP2's copy-in and copy-out, a side stream's own work)."""
    waited_on_streams_s: float = 0.0
    """How long the compute stream waited for the job's other streams (``wait_stream``, an event)."""
    end_s: float = 0.0
    """When its step ended: its last compute, or its last call if later."""
    calls: dict[int, CallTime] = field(default_factory=dict)
    """Ledger index -> its call, in issue order."""
    compute_by_phase: dict[str, float] = field(default_factory=dict)


class Simulation:
    """The step of every traced rank, resolved together (module doc).

    `programs`: traced rank -> its step's items (`capture.work.WorkLog.items` between two step marks);
    `ledgers`: traced rank -> its whole ledger (the items' call indices point into it); `represent`: global rank
    -> the traced rank playing it; `compute_s(item)` and `call_s(event)`: seconds."""

    def __init__(self, programs: dict[int, list], ledgers: dict[int, list[CommEvent]], represent,
                 compute_s, call_s):
        self.traced, self.represent = programs, represent
        self._rep = self._players(programs, ledgers, represent)  # player (a global rank) -> the traced rank it runs
        self.programs = {p: programs[r] for p, r in self._rep.items()}
        self.ledgers = {p: ledgers[r] for p, r in self._rep.items()}
        self.compute_s = compute_s
        self.ranks = {p: RankTimeline(p) for p in self.programs}
        for p, items in self.programs.items():
            for item in items:
                if item[0] == ISSUE:
                    e = self.ledgers[p][item[1]]
                    self.ranks[p].calls[item[1]] = CallTime(e, call_s(e))
        # each call's group as a small number (a group of 1,024 ranks is a tuple of 1,024 to hash and compare),
        # and per (rank, group) its calls in issue order with how many of them have run: a group's calls run in
        # that order on its stream (`_earlier_done`)
        groups: dict[tuple, int] = {}
        self._gid: dict[tuple[int, int], int] = {}
        self._on_group: dict[tuple[int, int], list[int]] = {}
        for r, tl in self.ranks.items():
            for i in sorted(tl.calls):
                gid = self._gid[(r, i)] = groups.setdefault(tl.calls[i].event.group, len(groups))
                self._on_group.setdefault((r, gid), []).append(i)
        self._run_on_group: dict[tuple[int, int], int] = {}
        self._keys: dict[tuple[int, int], tuple] = {}  # (rank, call) -> its matching key
        self._by_key = {r: self._positions(r) for r in self.programs}
        self._stream_free: dict[tuple[int, int], float] = {}  # (rank, group id) -> when its last call ended
        self._batch: dict[tuple[int, int], list[int]] = {}  # (rank, call) -> the P2P calls issued with it
        self._resolving: set[tuple[int, int]] = set()  # (rank, first call of a batch) being resolved
        self.unmatched: set[tuple[int, int]] = set()
        """(traced rank, call) of calls with a partner whose matching call the trace does not show, or timed alone
        (`CallTime.alone`) to untie a wait."""

    def _players(self, programs, ledgers, represent) -> dict[int, int]:
        """Player -> the traced rank whose program it runs: each traced rank, and each rank its players send to or
        receive from (at the offsets their representatives do, in the same group) that is played by a rank at
        another place of that group, where the group's members are not all of one class (a ring's are alike: a
        member playing its neighbour is as early as the neighbour; a pipeline's stages are not)."""
        offsets: dict[int, dict[tuple, set[int]]] = {}  # traced rank -> (axis, group) -> the peers' offsets
        for r, items in programs.items():
            for item in items:
                if item[0] == ISSUE:
                    e = ledgers[r][item[1]]
                    if e.op in P2P and e.peer is not None and r in e.group and e.peer in e.group:
                        offsets.setdefault(r, {}).setdefault((e.axis, e.group), set()).add(
                            (e.group.index(e.peer) - e.group.index(r)) % len(e.group))
        self._columns = {(r, axis): group for r, places in offsets.items() for axis, group in places}
        self._place: dict[int, tuple[str, tuple[int, ...]]] = {}  # a played stage -> the (axis, group) it is in
        players = {r: r for r in programs}
        alike: dict[tuple[int, ...], bool] = {}
        queue = [(r, r, place) for r, places in offsets.items() for place in places]
        while queue:
            p, r, (axis, group) = queue.pop()
            if alike.setdefault(group, len({represent(m) for m in group}) < 2):
                continue
            at = group.index(p)
            for offset in offsets[r][(axis, group)]:
                g = group[(at + offset) % len(group)]
                played = represent(g)
                if g not in players and played in programs and played != g and played in group:
                    players[g] = played
                    self._place[g] = (axis, group)
                    queue.append((g, played, (axis, group)))
        return players

    def _player(self, rank: int):
        """Who plays global `rank` in the step: itself where it is a player, else its class's representative."""
        return rank if rank in self._rep else self.represent(rank)

    def _member(self, p: int, member: int, group: tuple[int, ...]):
        """Who plays `member` of `group` (a call's, as the representative of player `p` issued it) for `p`: where
        `p` is a stage played by a rank at another stage and not in `group`, the rank of `p`'s stage at
        `member`'s place (the stage at `p`'s place in the pipeline of `member`'s representative)."""
        if p not in self._place or p in group:
            return self._player(member)
        axis, mine = self._place[p]
        column = self._columns.get((self.represent(member), axis))
        if column is None or len(column) != len(mine):
            return self._player(member)
        return self._player(column[mine.index(p)])

    @staticmethod
    def _offset(e: CommEvent, rank: int, peer: int) -> int | None:
        """`peer`'s position in `e`'s group less `rank`'s, modulo the group's size (None where either is no member)."""
        group = list(e.group)
        if rank not in group or peer not in group:
            return None
        return (group.index(peer) - group.index(rank)) % len(group)

    def _p2p_kind(self, r: int, e: CommEvent) -> tuple:
        """A point-to-point call's kind: its direction and its peer by offset in the group (as the fake world's rank
        classes relabel peers), so that a class playing ranks at several places of a pipeline (its odd inner stages)
        answers each of its members' neighbours as the neighbour at that offset; a receive from any source (peer
        -1), or a peer outside the group, by the peer's representative."""
        offset = self._offset(e, self._rep[r], e.peer) if e.peer is not None and e.peer >= 0 else None
        if offset is None:
            return (e.op, self.represent(e.peer))
        return (e.op, e.axis, len(e.group), "offset", offset)

    def _positions(self, r: int) -> dict:
        """Matching key -> call index: (axis, group size, op, n) for the n-th such call on groups of that axis and size;
        (direction, axis, group size, "offset", peer's offset, n) for the n-th send to (or receive from) the member at
        that offset."""
        out, counts = {}, {}
        for index in self.ranks[r].calls:
            e = self.ledgers[r][index]
            kind = self._p2p_kind(r, e) if e.op in P2P else (e.axis, len(e.group), e.op)
            n = counts.get(kind, 0)
            counts[kind] = n + 1
            out[(*kind, n)] = index
            self._keys[(r, index)] = (*kind, n)
        return out

    def _partners(self, r: int, index: int) -> list[tuple[int, int]]:
        """(traced rank, call index) of the calls that must be issued before `r`'s call `index` can run."""
        e = self.ledgers[r][index]
        key = self._keys[(r, index)]
        if e.op in P2P:
            mirror = "recv" if e.op == "send" else "send"
            if len(key) == 6:  # by offset: the stage at that offset from this player's own place
                _, axis, size, _, offset, n = key
                other = (self._player(e.group[(e.group.index(r) + offset) % size]) if r in e.group else
                         self._member(r, e.peer, e.group))
                wanted = (mirror, axis, size, "offset", (-offset) % size, n)
            else:
                other = self.represent(e.peer)
                wanted = (mirror, self._rep[r], key[-1])
            found = self._by_key.get(other, {}).get(wanted)
            if found is None and r in self.traced:
                self.unmatched.add((r, index))
            return [(other, found)] if found is not None else []
        out = []
        for member in e.group:
            other = self._member(r, member, e.group)
            if other != r and other in self._by_key:
                found = self._by_key[other].get(key)
                if found is None:
                    if r in self.traced:
                        self.unmatched.add((r, index))
                else:
                    out.append((other, found))
        return out

    # -- running it -----------------------------------------------------------------------------------
    def run(self) -> dict[int, RankTimeline]:
        pc = {r: 0 for r in self.programs}
        clock = {r: {0: 0.0} for r in self.programs}  # rank -> stream -> when its work so far ends
        # rank -> stream -> the call whose end its clock is at, where it last waited for one and did nothing since
        self._held: dict[int, dict[int, int]] = {r: {} for r in self.programs}
        self._events: dict[tuple[int, int], tuple[float, int | None]] = {}  # (rank, event) -> (time, call held at)
        last_issue: dict[int, int | None] = {r: None for r in self.programs}
        while True:
            progress = False
            for r, items in self.programs.items():
                while pc[r] < len(items):
                    if not self._advance(r, items[pc[r]], clock, last_issue):
                        break
                    pc[r] += 1
                    progress = True
            if all(pc[r] == len(items) for r, items in self.programs.items()):
                break
            if not progress:
                # waits no partner's issue can untie (a call whose match the trace does not show, or issued
                # after the wait on it in a partner's order): time the first such call without its partners
                r = next(r for r, items in self.programs.items() if pc[r] < len(items))
                self._resolve(r, self.programs[r][pc[r]][1], alone=True)
        for r, tl in self.ranks.items():  # calls the step never waited on (a last bucket, a send): they end it
            for index, call in tl.calls.items():
                if call.end is None and not self._resolve(r, index):
                    self._resolve(r, index, alone=True)
            tl.end_s = max([*clock[r].values(), *(c.end for c in tl.calls.values())])
        return {r: self.ranks[r] for r in self.traced}

    def _advance(self, r: int, item, clock, last_issue) -> bool:
        """Run one item of `r`'s program; False if it must wait for a partner not reached yet."""
        tl = self.ranks[r]
        streams, held = clock[r], self._held[r]
        kind = item[0]
        if kind == HOST_WORK:  # the CPU works once the job's streams have done what it reads (FSDP2's offload
            # synchronizes its copies to the host before its optimizer step), and issues nothing meanwhile: every
            # stream of the job goes on after it (a group's calls in flight run on)
            start = max(streams.values())
            tl.waited_on_streams_s += start - streams.get(0, 0.0)
            s = self.compute_s(item)
            for stream in streams:
                streams[stream] = start + s
            held.clear()
            tl.compute_s += s
            tl.compute_by_phase[item[1]] = tl.compute_by_phase.get(item[1], 0.0) + s
            last_issue[r] = None
        elif kind == COMPUTE:
            s, stream = self.compute_s(item), item[5]
            streams[stream] = streams.get(stream, 0.0) + s
            held.pop(stream, None)
            if stream:
                tl.side_compute_s += s
            else:
                tl.compute_s += s
                tl.compute_by_phase[item[1]] = tl.compute_by_phase.get(item[1], 0.0) + s
            last_issue[r] = None
        elif kind in (STREAM_WAITS, EVENT_WAITED):
            stream = item[1] if kind == STREAM_WAITS else item[2]
            until, call = ((streams.get(item[2], 0.0), held.get(item[2])) if kind == STREAM_WAITS else
                           self._events.get((r, item[1]), (0.0, None)))
            now = streams.get(stream, 0.0)
            if until > now:
                if stream == 0 and call is not None:  # the other stream waits for a call: its exposed time
                    self._exposed(tl.calls[call], until - now, now)
                elif stream == 0:
                    tl.waited_on_streams_s += until - now
                streams[stream] = until
                if call is not None:
                    held[stream] = call
                else:
                    held.pop(stream, None)
        elif kind == RECORDED:
            self._events[(r, item[1])] = (streams.get(item[2], 0.0), held.get(item[2]))
        elif kind == ISSUE:
            call = tl.calls[item[1]]
            call.issued = streams.get(item[2], 0.0)
            prev = last_issue[r]
            if prev is not None and call.event.op in P2P and tl.calls[prev].event.op in P2P \
                    and tl.calls[prev].event.group == call.event.group:
                batch = self._batch.setdefault((r, prev), [prev])
                batch.append(item[1])
                self._batch[(r, item[1])] = batch
            last_issue[r] = item[1]
        elif kind == WAIT:
            call = tl.calls.get(item[1])
            if call is None:  # issued in an earlier step: finished by now
                return True
            if call.end is None and not self._resolve(r, item[1]):
                return False
            stream = item[2]
            now = streams.get(stream, 0.0)
            if call.end > now:
                if stream == 0:  # the compute stream waits: the call's exposed time
                    self._exposed(call, call.end - now, now)
                streams[stream] = call.end
                held[stream] = item[1]
            last_issue[r] = None
        return True

    @staticmethod
    def _exposed(call: CallTime, wait: float, now: float) -> None:
        """The compute stream, at `now`, waits `wait` for `call` (directly, or through a stream or event that
        waited for it: FSDP2's all-gather stream waits for its call, c10d's ``Work.wait``, and the compute stream
        for an event recorded there after): the call's exposed time, split as `CallTime.waited_for_peers` says."""
        call.waited += wait
        call.waited_for_peers += min(wait, max(0.0, call.start - max(call.ready, now)))

    def _resolve(self, r: int, index: int, alone: bool = False) -> bool:
        """Give `r`'s call `index` (and the calls batched with it) a start and an end, once every partner has
        issued its own; False if one has not yet. A collective starts on every member at once: when the last
        member issued it and every member's stream of the group is free."""
        batch = self._batch.get((r, index), [index])
        if (r, min(batch)) in self._resolving:  # reached again through a partner: its own resolution decides
            return False
        self._resolving.add((r, min(batch)))
        try:
            return self._resolve_batch(r, batch, alone)
        finally:
            self._resolving.discard((r, min(batch)))

    def _resolve_batch(self, r: int, batch: list[int], alone: bool) -> bool:
        tl = self.ranks[r]
        calls = [tl.calls[i] for i in batch]
        gid = self._gid[(r, batch[0])]
        if any(c.issued is None for c in calls) or not self._earlier_done(r, min(batch), gid, alone):
            return False
        free = self._stream_free.get((r, gid), 0.0)
        launched = max(max(c.issued for c in calls), free)  # a batch is launched once, when its last call is issued
        # each call of a batch starts once its own pair is ready, whether or not the batch's other calls' partners
        # are (an interleaved pipeline's stage sends a microbatch on in the batch that receives the next one, from a
        # stage still waiting for what it sends): a start found is kept while the rest wait
        for i, c in zip(batch, calls):
            if c.start is None:
                c.start = self._pair_start(r, i, launched, alone)
        if any(c.start is None for c in calls):
            return False
        # several to one peer in one direction run one after another; the batch, one NCCL group, ends with its last,
        # and so does every call's Work
        lanes: dict[tuple, float] = {}
        for c in calls:
            lane = (c.event.op, c.event.peer)
            lanes[lane] = max(lanes.get(lane, 0.0), c.start) + c.seconds
        end = max(lanes.values())
        for c in calls:
            c.ready, c.end, c.alone = launched, end, alone
        if alone and r in self.traced:
            self.unmatched.update((r, i) for i in batch)
        self._stream_free[(r, gid)] = end
        return True

    def _pair_start(self, r: int, index: int, launched: float, alone: bool) -> float | None:
        """When `r`'s call `index`, launched at `launched` (its batch issued, its group's stream free), starts: once
        every partner issued its own and its group's stream is free, or where a partner's side started already (the
        call starts there on every member, not before it is launched); None while a partner has not issued it."""
        ready, started = launched, None
        for other, j in [] if alone else self._partners(r, index):
            partner = self.ranks[other].calls[j]
            if partner.start is not None:
                started = partner.start if started is None else max(started, partner.start)
                continue
            first = min(self._batch.get((other, j), [j]))  # its batch runs together with it
            other_gid = self._gid[(other, j)]
            if partner.issued is None or not self._earlier_done(other, first, other_gid, False):
                return None
            ready = max(ready, partner.issued, self._stream_free.get((other, other_gid), 0.0))
        return ready if started is None else max(started, launched)

    def _earlier_done(self, r: int, index: int, gid: int, alone: bool) -> bool:
        """Whether `r`'s calls on group `gid` before `index` have run (resolving them where they can): a group's
        calls run in issue order on its stream."""
        key = (r, gid)
        order, calls = self._on_group[key], self.ranks[r].calls
        while True:
            k = self._run_on_group.get(key, 0)  # read again: resolving a call may have moved it on
            if k >= len(order) or order[k] >= index:
                return True
            i = order[k]
            if calls[i].end is None and not self._resolve(r, i, alone):
                return False
            self._run_on_group[key] = max(k + 1, self._run_on_group.get(key, 0))
