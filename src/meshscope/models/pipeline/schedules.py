"""Pipeline schedules as pure functions: the ordered F/B actions of one stage, and its P2P program.

The chapter's GPipe and 1F1B (docs/chapter.md, Q16 and Q17): GPipe is fill-drain (every microbatch forward, then
every backward); 1F1B splits into warmup, a steady one-forward-one-backward phase and a cooldown, which bounds
the activations a stage keeps. Both the runtime and the predictor walk the SAME list returned here, so the
captured P2P ledger and the predicted one cannot drift apart.

P2P program. A stage's actions imply its messages: F_i receives activation i from stage s-1 before
computing and sends activation i to stage s+1 after; B_i receives gradient i from s+1 before and sends
gradient i to s-1 after. Two consecutive messages with the same neighbour (no compute between them)
are fused into one `Exchange` -- posted together, then waited -- when they are adjacent on BOTH ends
of the boundary (Megatron's send_forward_recv_backward / send_backward_recv_forward; torch's
``_batch_p2p(fwd_sends + bwd_recvs)``). Inside an exchange the activation goes first on both ends, so
even a transport that runs P2P in posting order on one stream (NCCL without a group) cannot cross-wait.

Why that is deadlock-free for any pp and M with blocking calls: `check_matched` verifies that on every
boundary both stages issue the identical sequence of exchanges. A stage blocked in an exchange waits
on one neighbour only, and the stages form a path, so a cycle of waits would have to be two
neighbours waiting on each other; but both sit at the same position of their common exchange
sequence, i.e. in the same exchange, which then completes. The chapter's "PP hang" rows (send/recv
order or shapes differing between stages; docs/chapter.md, Faults the doctor names) are exactly what this
rules out.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Action:
    """One compute action of a stage: forward ("F") or backward ("B") of one microbatch."""

    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def gpipe(pp: int, stage: int, microbatches: int) -> list[Action]:
    """Fill-drain: all forwards, then all backwards in microbatch order (torch's ScheduleGPipe).

    The chapter's measured rank-0 timeline drained B7..B0 (docs/chapter.md, Q16); draining in order instead
    makes the weight gradient accumulate in the same order as 1F1B, so the two schedules train bit-identically.
    """
    return [Action("F", i) for i in range(microbatches)] + [Action("B", i) for i in range(microbatches)]


def one_f_one_b(pp: int, stage: int, microbatches: int) -> list[Action]:
    """1F1B in Megatron's formulation (equal to torch's Schedule1F1B._step_microbatches)."""
    m = microbatches
    # Warmup: stage s must run pp - s - 1 forwards before the first gradient can come back to it.
    warmup = min(pp - stage - 1, m)
    acts = [Action("F", i) for i in range(warmup)]
    # Steady: one forward then one backward, so at most warmup + 1 activations are ever stashed.
    for k in range(m - warmup):
        acts += [Action("F", warmup + k), Action("B", k)]
    # Cooldown: drain the backwards of the warmup forwards.
    acts += [Action("B", i) for i in range(m - warmup, m)]
    return acts


def actions(schedule: str, pp: int, stage: int, microbatches: int) -> list[Action]:
    """The ordered compute actions of `stage` (0-based) of a `pp`-stage pipeline over M microbatches."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    return (gpipe if schedule == "gpipe" else one_f_one_b)(pp, stage, microbatches)


def peak_stash(acts: list[Action]) -> int:
    """Most microbatches whose forward ran and whose backward has not: activations kept alive."""
    live = peak = 0
    for a in acts:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak


def stash_bound(schedule: str, pp: int, stage: int, microbatches: int) -> int:
    """The chapter's figure (docs/chapter.md, Q17): GPipe keeps all M; 1F1B keeps min(M, pp - stage)."""
    return microbatches if schedule == "gpipe" else min(microbatches, pp - stage)


@dataclass(frozen=True)
class Message:
    """One P2P message across boundary b (between stages b and b+1)."""

    kind: str
    """``activation`` (stage b -> b+1, forward) or ``gradient`` (b+1 -> b, backward)."""
    microbatch: int
    boundary: int

    @property
    def sender(self) -> int:
        return self.boundary if self.kind == "activation" else self.boundary + 1

    @property
    def receiver(self) -> int:
        return self.boundary + 1 if self.kind == "activation" else self.boundary

    @property
    def phase(self) -> str:
        return "forward" if self.kind == "activation" else "backward"

    @property
    def region(self) -> str:
        return f"pp.boundary{self.boundary}.{self.kind}"


@dataclass(frozen=True)
class Exchange:
    """Messages with one neighbour, posted together and then waited for (activation first)."""

    peer_stage: int
    messages: tuple[Message, ...]


def _raw(schedule: str, pp: int, stage: int, m: int) -> list[Action | Message]:
    """Actions with their implied messages, unfused, in issue order."""
    out: list[Action | Message] = []
    for a in actions(schedule, pp, stage, m):
        if a.kind == "F":
            before = [Message("activation", a.microbatch, stage - 1)] if stage > 0 else []
            after = [Message("activation", a.microbatch, stage)] if stage < pp - 1 else []
        else:
            before = [Message("gradient", a.microbatch, stage)] if stage < pp - 1 else []
            after = [Message("gradient", a.microbatch, stage - 1)] if stage > 0 else []
        out += [*before, a, *after]
    return out


def _peer(msg: Message, stage: int) -> int:
    return msg.receiver if msg.sender == stage else msg.sender


def _adjacent_pairs(raw: list, stage: int) -> set[frozenset]:
    """Consecutive same-neighbour message pairs of one stage's raw list."""
    return {frozenset((a, b)) for a, b in zip(raw, raw[1:])
            if isinstance(a, Message) and isinstance(b, Message) and _peer(a, stage) == _peer(b, stage)}


def program(schedule: str, pp: int, stage: int, microbatches: int) -> list[Action | Exchange]:
    """The stage's actions interleaved with its P2P exchanges, in issue order (runtime and predictor)."""
    raw = _raw(schedule, pp, stage, microbatches)
    fusable = {s: _adjacent_pairs(_raw(schedule, pp, s, microbatches), s) for s in (stage - 1, stage + 1) if 0 <= s < pp}
    out: list[Action | Exchange] = []
    i = 0
    while i < len(raw):
        item = raw[i]
        if isinstance(item, Action):
            out.append(item)
            i += 1
            continue
        peer = _peer(item, stage)
        nxt = raw[i + 1] if i + 1 < len(raw) else None
        if isinstance(nxt, Message) and frozenset((item, nxt)) in fusable[peer] and _peer(nxt, stage) == peer:
            msgs = sorted((item, nxt), key=lambda m: m.kind != "activation")
            i += 2
        else:
            msgs = [item]
            i += 1
        out.append(Exchange(peer, tuple(msgs)))
    return out


def check_matched(schedule: str, pp: int, microbatches: int) -> None:
    """Raise if two neighbouring stages would issue different exchange sequences on their boundary."""
    progs = [program(schedule, pp, s, microbatches) for s in range(pp)]
    for b in range(pp - 1):
        up = [e.messages for e in progs[b] if isinstance(e, Exchange) and e.peer_stage == b + 1]
        down = [e.messages for e in progs[b + 1] if isinstance(e, Exchange) and e.peer_stage == b]
        if up != down:
            k = next((k for k, (u, d) in enumerate(zip(up, down)) if u != d), min(len(up), len(down)))
            raise RuntimeError(
                f"{schedule} pp={pp} M={microbatches}: stages {b} and {b + 1} disagree at exchange #{k} of "
                f"boundary {b} ({up[k:k + 1]} vs {down[k:k + 1]}); blocking P2P would deadlock")
