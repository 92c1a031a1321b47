"""Diagnoses of point-to-point traffic: send/recv pairing between two ranks, and the pipeline's
activation gradient that never came back.

Between two ranks of a group, gloo and NCCL match messages in issue order, so the k-th send a->b pairs with
the k-th recv of b from a (the chapter's "PP hang" diagnosis: send/recv order or shape mismatch;
docs/chapter.md, "Faults the doctor names"). Async sends and receives
are logged as completed when posted; a blocking ``send``/``recv`` stays pending while it waits.
"""

from __future__ import annotations

from collections import defaultdict

from ..core.events import P2P, CommEvent
from ..core.findings import Finding
from .evidence import RankLog, blocked_in, brief, issued_at, last_call, pending


def _stopped(errors: dict[int, str], r: int) -> str:
    return f"; rank {r} stopped with: {errors[r]}" if r in errors else ""


def p2p(ranks: dict[int, RankLog], errors: dict[int, str] | None = None) -> list[Finding]:
    """P2P pairing, per pair of ranks in one group: the k-th send a->b is matched by the k-th recv of b
    from a (gloo and NCCL match point-to-point messages of a group between two ranks in issue order).
    One finding per pair, the likeliest first: a size mismatch, then an order mismatch, then an unmatched message.
    `errors`: rank -> the error it stopped with, quoted when that rank is the silent end."""
    errors = errors or {}
    by_pair: dict[tuple, list[CommEvent]] = defaultdict(list)  # (group, rank, peer) -> rank's calls in order
    for r, info in ranks.items():
        for e in info.issued:
            if e.op in P2P and e.peer is not None:
                by_pair[(e.group, r, e.peer)].append(e)
    out = []
    for group, a, b in sorted({(g, min(r, q), max(r, q)) for g, r, q in by_pair}):
        if a in ranks and b in ranks:
            ab, ba = by_pair.get((group, a, b), []), by_pair.get((group, b, a), [])
            found = _p2p_size(ranks, a, b, ab, ba) or _p2p_order(ranks, a, b, ab, ba) or \
                _p2p_unmatched(ranks, errors, a, b, ab, ba)
            if found:
                out.append(found)
    return out


def _directions(a, b, ab, ba):
    """(src, dst, sends src->dst, recvs of dst from src) for both directions of a pair."""
    for src, dst, mine, theirs in ((a, b, ab, ba), (b, a, ba, ab)):
        yield src, dst, [e for e in mine if e.op == "send"], [e for e in theirs if e.op == "recv"]


def _p2p_size(ranks, a, b, ab, ba) -> Finding | None:
    for src, dst, sends, recvs in _directions(a, b, ab, ba):
        for k, (s, rv) in enumerate(zip(sends, recvs)):
            if s.bytes_in != rv.bytes_out or s.dtype != rv.dtype:
                return Finding("p2p", s.axis, list(s.group), [src, dst],
                               f"message #{k} {src}->{dst}: send {brief(s)} {s.dtype}, recv {brief(rv)} {rv.dtype}",
                               "size mismatch between a send and its recv: the receiver expects another shape "
                               "or dtype than is sent (a pipeline hang; see docs/chapter.md, Faults the doctor names)", issued_at(ranks, s, rv))
    return None


def _p2p_order(ranks, a, b, ab, ba) -> Finding | None:
    """Both ends at the same position of their common P2P sequence issue the same op, and block."""
    for k, (x, y) in enumerate(zip(ab, ba)):
        if x.op == y.op and (pending(ranks, x) or pending(ranks, y)):
            verb = "send" if x.op == "send" else "receive"
            return Finding("p2p", x.axis, list(x.group), [a, b],
                           f"P2P #{k} between {a} and {b}: both {verb} first (rank {a}: {brief(x)}; "
                           f"rank {b}: {brief(y)})",
                           f"order mismatch: both ends {verb} first and block; matching sends and receives must be "
                           "issued in complementary order (a pipeline hang; see docs/chapter.md, Faults the doctor names)", issued_at(ranks, x, y))
    return None


def _p2p_unmatched(ranks, errors, a, b, ab, ba) -> Finding | None:
    """The earliest message of either direction that has no counterpart on the other end."""
    found = []
    for src, dst, sends, recvs in _directions(a, b, ab, ba):
        k = min(len(sends), len(recvs))
        if len(sends) > k:
            e, silent = sends[k], dst
            entry = f"message #{k} {src}->{dst}: rank {src} issued {brief(e)}; rank {dst} never posted the recv"
            cause = "a send without the matching recv"
        elif len(recvs) > k:
            e, silent = recvs[k], src
            entry = f"message #{k} {src}->{dst}: rank {dst} issued {brief(e)}; rank {src} never sent it"
            cause = "a recv without the matching send"
        else:
            continue
        cause += f": one side waits forever; rank {silent} last issued {last_call(ranks[silent])}{_stopped(errors, silent)}"
        # A silent rank blocked in another call never got here: date the wait by its block.
        block = blocked_in(ranks, silent)
        t = issued_at(ranks, e) if block is None else max(issued_at(ranks, e), issued_at(ranks, block))
        found.append(Finding("p2p", e.axis, list(e.group), [src, dst], entry, cause, t, derived=block is not None))
    return min(found, key=lambda f: (f.t, f.derived), default=None)


def pp_no_grad(ranks: dict[int, RankLog]) -> list[Finding]:
    """A stage that received activations from an upstream peer, went past their backward, and sent
    no gradient back to it. Dated by the first such activation: that is where the edge went missing."""
    out = []
    for r, info in sorted(ranks.items()):
        got: dict[int, list[CommEvent]] = defaultdict(list)
        sent_back = defaultdict(int)
        for e in info.issued:
            if e.axis != "pp" or e.peer is None:
                continue  # only pipeline-boundary traffic carries activations and their gradients
            if e.op == "recv" and e.phase == "forward":
                got[e.peer].append(e)
            if e.op == "send" and e.phase == "backward":
                sent_back[e.peer] += 1
        for peer, recvs in sorted(got.items()):
            if sent_back[peer] or not _past_backward(info, recvs):
                continue
            waiting = [e for e in ranks[peer].issued if e.op == "recv" and e.peer == r and e.phase == "backward"] \
                if peer in ranks else []
            wait = f"; rank {peer} waits in its {brief(waiting[0])}" if waiting else ""
            out.append(Finding("pp-no-grad", "pp", sorted([r, peer]), [r],
                               f"rank {r} received {len(recvs)} forward messages from rank {peer}, ran past their "
                               f"backward and sent no gradient back{wait}",
                               "plain send/recv does not connect autograd across processes: the receiving stage "
                               "must send the activation gradient back and the sender call backward with it "
                               "(see docs/chapter.md, Q14 and Q15)", issued_at(ranks, recvs[0])))
    return out


def _past_backward(info: RankLog, recvs: list[CommEvent]) -> bool:
    """Whether the rank finished a backward after receiving: it issued a backward or optimizer call, or
    received the same activation (region, microbatch) again, i.e. began the next step. A rank that
    stopped before its backward (e.g. a shape check failed) owes no gradient yet."""
    labels = [(e.region, e.microbatch) for e in recvs if e.region]
    return any(e.phase in ("backward", "optimizer") for e in info.issued) or len(labels) > len(set(labels))
