"""``collectives``: every collective type, issued in every mesh group where it makes sense.

A self-test of the capture against an independent plan: on a tp x dp world (default 4 = 2 x 2) each
rank issues, in its tp group and then its dp group, every c10d collective (including uneven
``all_to_all``/``all_to_all_single`` splits and send/recv, isend/irecv and batch_isend_irecv pairs), the
project's autograd collectives forward and backward, and torch's functional collectives. The predicted
ledger comes from the same plan through `events.payload_bytes`, and each result is checked
numerically (every rank contributes known values), so a collective that ran in the wrong group or
moved the wrong rows fails even if its ledger entry looks right.

Legend: R = rows per member (4), C = columns (8), G = group size, i = this rank's index in the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ...capture.recorder import Capture, region
from ...core.errors import UsageError
from ...core.events import CommEvent, payload_bytes
from ...core.mesh import Layout
from ...core.result import Check
from ...models import collectives as coll
from .. import register
from ..template import Experiment, RankOutput

ROWS, COLS = 4, 8
AXES = ("tp", "dp")


@dataclass(frozen=True)
class CollectivesConfig:
    world: int = 4
    """Number of ranks."""
    tp: int = 2
    """Tensor-parallel size; dp = world / tp."""
    skip_rank: int | None = None
    """Fault knob (tests, doctor): this rank skips its first all_reduce, so its peers wait for it."""

    @cached_property
    def layout(self) -> Layout:
        """The mesh this configuration runs on (once validation has filled in every size)."""
        return Layout(self.world, tp=self.tp)


def _splits(i: int, g: int) -> list[int]:
    """Uneven all_to_all splits: member i sends i + j + 1 rows to member j."""
    return [i + j + 1 for j in range(g)]


def plan(group_size: int, index: int, peer_of) -> list[tuple]:
    """The calls a member issues in one group: (region, op, phase, numel_in, in_splits, out_splits, peer).

    `peer_of(k)` maps a group index to a global rank (for P2P). Shared by run and predict.
    """
    g, i, n = group_size, index, ROWS * COLS
    ins, outs = _splits(i, g), [_splits(j, g)[i] for j in range(g)]
    nxt, prv = peer_of((i + 1) % g), peer_of((i - 1) % g)
    calls = [
        ("c10d.all_reduce", "all_reduce", "forward", n, None, None, None),
        ("c10d.all_gather", "all_gather", "forward", n, None, None, None),
        ("c10d.all_gather_into_tensor", "all_gather", "forward", n, None, None, None),
        ("c10d.reduce_scatter", "reduce_scatter", "forward", n * g, None, None, None),
        ("c10d.reduce_scatter_tensor", "reduce_scatter", "forward", n * g, None, None, None),
        # gloo's list all_to_all needs equal tensors: even splits there, uneven ones below.
        ("c10d.all_to_all", "all_to_all", "forward", n * g, [ROWS] * g, [ROWS] * g, None),
        ("c10d.all_to_all_single", "all_to_all", "forward", sum(ins) * COLS, ins, outs, None),
        ("c10d.broadcast", "broadcast", "forward", n, None, None, None),
        ("c10d.barrier", "barrier", "forward", 0, None, None, None),
    ]
    # P2P ring: even members send first, odd receive first, so blocking calls never deadlock.
    ring = [("c10d.send", "send", "forward", n, None, None, nxt), ("c10d.recv", "recv", "forward", n, None, None, prv)]
    calls += ring if i % 2 == 0 else ring[::-1]
    ring = [("c10d.isend", "send", "forward", n, None, None, nxt), ("c10d.irecv", "recv", "forward", n, None, None, prv)]
    calls += ring
    calls += [("c10d.batch_isend_irecv", "send", "forward", n, None, None, nxt),
              ("c10d.batch_isend_irecv", "recv", "forward", n, None, None, prv)]
    calls += [
        ("autograd.AllReduceSum", "all_reduce", "forward", n, None, None, None),
        ("autograd.AllGatherCat", "all_gather", "forward", n, None, None, None),
        ("autograd.ReduceScatterSum", "reduce_scatter", "forward", n * g, None, None, None),
        ("autograd.AllToAllV", "all_to_all", "forward", sum(ins) * COLS, ins, outs, None),
        ("funcol.all_reduce", "all_reduce", "forward", n, None, None, None),
        ("funcol.all_gather_single", "all_gather", "forward", n, None, None, None),
        ("funcol.reduce_scatter_single", "reduce_scatter", "forward", n * g, None, None, None),
        ("funcol.all_to_all_single_autograd", "all_to_all", "forward", sum(ins) * COLS, ins, outs, None),
    ]
    # One loss over every autograd output; backward runs in reverse order of the forward calls,
    # each with its dual (chapter Q10, Q11, Q21: AR<->AR, AG<->RS, A2A<->A2A with the splits swapped). The project's
    # Functions label their backward with the forward's region; torch's functional collective gets
    # the region active around loss.backward().
    calls += [
        ("loss.backward", "all_to_all", "backward", sum(outs) * COLS, outs, ins, None),
        ("autograd.AllToAllV", "all_to_all", "backward", sum(outs) * COLS, outs, ins, None),
        ("autograd.ReduceScatterSum", "all_gather", "backward", n, None, None, None),
        ("autograd.AllGatherCat", "reduce_scatter", "backward", n * g, None, None, None),
        ("autograd.AllReduceSum", "all_reduce", "backward", n, None, None, None),
    ]
    return calls


class Collectives(Experiment):
    Config = CollectivesConfig
    faults = {"missing-collective": {"skip_rank": 1}}

    def validate(self, cfg) -> None:
        if cfg.world % cfg.tp:
            raise UsageError(f"--tp {cfg.tp} does not divide --world {cfg.world}; pick a divisor of {cfg.world}")
        if cfg.world < 2:
            raise UsageError(f"--world {cfg.world} is too small; collectives need at least 2 ranks")


    def predict(self, cfg) -> list[CommEvent]:
        layout = cfg.layout
        events = []
        for rank in range(layout.world):
            for axis in AXES:
                ranks = tuple(layout.group_of(axis, rank))
                if len(ranks) < 2:
                    continue
                calls = plan(len(ranks), ranks.index(rank), lambda k: ranks[k])
                for seq, (reg, op, ph, numel, ins, outs, peer) in enumerate(calls):
                    if op == "all_to_all":  # uneven: bytes follow the splits
                        b_in, b_out = sum(ins) * COLS * 4, sum(outs) * COLS * 4
                    else:
                        b_in, b_out = payload_bytes(op, numel, len(ranks), 4)
                    events.append(CommEvent(rank, seq, op, layout.canonical(axis), ranks, ph,
                                            "" if op == "barrier" else "float32", b_in, b_out, reg, None,
                                            tuple(ins) if ins else None, tuple(outs) if outs else None, peer))
        return events

    def run_rank(self, ctx, cfg) -> RankOutput:
        mesh = ctx.mesh(cfg.layout)
        checks = []
        with Capture() as cap:
            for axis in AXES:
                group = mesh[axis]
                if group.size > 1:
                    checks += _exercise(group, ctx.rank, ctx.device, skip=ctx.rank == cfg.skip_rank)
        ok = all(c.passed for c in checks)
        bad = [c.name for c in checks if not c.passed]
        summary = Check("collective results numerically right", ok,
                        f"{len(checks)} results checked" + (f"; wrong: {', '.join(bad[:4])}" if bad else ""))
        return RankOutput(ctx.rank, cap.events, checks=[summary])


def _exercise(group, rank: int, device, skip: bool = False) -> list[Check]:
    """Issue the plan's calls in `group`; return one numeric check per call."""
    g, i, pg = group.size, group.local_rank(rank), group.pg
    peer = lambda k: group.ranks[k]  # noqa: E731
    nxt, prv = peer((i + 1) % g), peer((i - 1) % g)

    def val(member: int, rows: int = ROWS) -> torch.Tensor:
        """Member `member`'s contribution: rows filled with member + 1."""
        return torch.full((rows, COLS), float(member + 1), device=device)

    def same(name, got, want) -> Check:
        return Check(name, torch.equal(got, want), "")

    total = float(sum(range(1, g + 1)))
    checks = []

    def reg(name):
        return region(name)

    with reg("c10d.all_reduce"):
        t = val(i)
        if skip:
            t = torch.full_like(t, total)  # the planted fault: the call is never issued
        else:
            dist.all_reduce(t, group=pg)
        checks.append(same("all_reduce", t, torch.full_like(t, total)))
    with reg("c10d.all_gather"):
        out = [torch.empty(ROWS, COLS, device=device) for _ in range(g)]
        dist.all_gather(out, val(i), group=pg)
        checks.append(same("all_gather", torch.cat(out), torch.cat([val(j) for j in range(g)])))
    with reg("c10d.all_gather_into_tensor"):
        out = torch.empty(ROWS * g, COLS, device=device)
        dist.all_gather_into_tensor(out, val(i), group=pg)
        checks.append(same("all_gather_into_tensor", out, torch.cat([val(j) for j in range(g)])))
    with reg("c10d.reduce_scatter"):
        out = torch.empty(ROWS, COLS, device=device)
        dist.reduce_scatter(out, [val(i) * (j + 1) for j in range(g)], group=pg)
        checks.append(same("reduce_scatter", out, torch.full_like(out, total * (i + 1))))
    with reg("c10d.reduce_scatter_tensor"):
        out = torch.empty(ROWS, COLS, device=device)
        dist.reduce_scatter_tensor(out, torch.cat([val(i) * (j + 1) for j in range(g)]), group=pg)
        checks.append(same("reduce_scatter_tensor", out, torch.full_like(out, total * (i + 1))))
    ins, outs = _splits(i, g), [_splits(j, g)[i] for j in range(g)]
    expect_a2a = torch.cat([val(j, outs[j]) for j in range(g)])
    with reg("c10d.all_to_all"):
        out = [torch.empty(ROWS, COLS, device=device) for _ in range(g)]
        dist.all_to_all(out, [val(i) for _ in range(g)], group=pg)
        checks.append(same("all_to_all", torch.cat(out), torch.cat([val(j) for j in range(g)])))
    with reg("c10d.all_to_all_single"):
        out = torch.empty(sum(outs), COLS, device=device)
        dist.all_to_all_single(out, val(i, sum(ins)), output_split_sizes=outs, input_split_sizes=ins, group=pg)
        checks.append(same("all_to_all_single", out, expect_a2a))
    with reg("c10d.broadcast"):
        t = val(i); dist.broadcast(t, src=group.ranks[0], group=pg)
        checks.append(same("broadcast", t, val(0)))
    with reg("c10d.barrier"):
        dist.barrier(group=pg)
    got = torch.empty(ROWS, COLS, device=device)
    if i % 2 == 0:
        with reg("c10d.send"):
            dist.send(val(i), dst=nxt, group=pg)
        with reg("c10d.recv"):
            dist.recv(got, src=prv, group=pg)
    else:
        with reg("c10d.recv"):
            dist.recv(got, src=prv, group=pg)
        with reg("c10d.send"):
            dist.send(val(i), dst=nxt, group=pg)
    checks.append(same("send/recv", got, val((i - 1) % g)))
    got = torch.empty(ROWS, COLS, device=device)
    with reg("c10d.isend"):
        work_s = dist.isend(val(i), dst=nxt, group=pg)
    with reg("c10d.irecv"):
        work_r = dist.irecv(got, src=prv, group=pg)
    work_s.wait(); work_r.wait()
    checks.append(same("isend/irecv", got, val((i - 1) % g)))
    got = torch.empty(ROWS, COLS, device=device)
    with reg("c10d.batch_isend_irecv"):
        ops = [dist.P2POp(dist.isend, val(i), nxt, pg), dist.P2POp(dist.irecv, got, prv, pg)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    checks.append(same("batch_isend_irecv", got, val((i - 1) % g)))

    # Autograd collectives: forward here, backward through one loss below.
    leaves = [val(i).requires_grad_() for _ in range(3)] + [val(i, sum(ins)).requires_grad_(), val(i, sum(ins)).requires_grad_()]
    with reg("autograd.AllReduceSum"):
        y_ar = coll.AllReduceSum.apply(leaves[0], group)
    with reg("autograd.AllGatherCat"):
        y_ag = coll.AllGatherCat.apply(leaves[1], group)
    with reg("autograd.ReduceScatterSum"):
        y_rs = coll.ReduceScatterSum.apply(torch.cat([leaves[2]] * g), group)
    with reg("autograd.AllToAllV"):
        y_a2a = coll.AllToAllV.apply(leaves[3], group, ins, outs)
    with reg("funcol.all_reduce"):
        f = funcol.all_reduce(val(i), "sum", pg)
        checks.append(same("funcol.all_reduce", f * 1, torch.full((ROWS, COLS), total, device=device)))
    with reg("funcol.all_gather_single"):
        f = funcol.all_gather_tensor(val(i), 0, pg) if not hasattr(funcol, "all_gather_single") else funcol.all_gather_single(val(i), 0, pg)
        checks.append(same("funcol.all_gather", f * 1, torch.cat([val(j) for j in range(g)])))
    with reg("funcol.reduce_scatter_single"):
        rs = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
        f = rs(torch.cat([val(i)] * g), "sum", 0, pg)
        checks.append(same("funcol.reduce_scatter", f * 1, torch.full((ROWS, COLS), total, device=device)))
    with reg("funcol.all_to_all_single_autograd"):
        y_f = funcol.all_to_all_single_autograd(leaves[4], outs, ins, pg)
    checks += [same("AllReduceSum fwd", y_ar, torch.full_like(y_ar, total)),
               same("AllGatherCat fwd", y_ag, torch.cat([val(j) for j in range(g)])),
               same("ReduceScatterSum fwd", y_rs, torch.full_like(y_rs, total)),
               same("AllToAllV fwd", y_a2a, expect_a2a),
               same("funcol a2a fwd", y_f * 1, expect_a2a)]
    # Independent branches of one loss: the autograd engine runs them newest node first, so the
    # backward collectives come in reverse order of the forward ones.
    loss = (y_f * 1).sum() + y_a2a.sum() + y_rs.sum() + y_ag.sum() + y_ar.sum()
    with reg("loss.backward"):
        loss.backward()
    checks += [same("AllReduceSum bwd", leaves[0].grad, torch.full_like(leaves[0], float(g))),
               same("AllGatherCat bwd", leaves[1].grad, torch.full_like(leaves[1], float(g))),
               same("ReduceScatterSum bwd", leaves[2].grad, torch.full_like(leaves[2], float(g))),
               same("AllToAllV bwd", leaves[3].grad, torch.ones_like(leaves[3])),
               same("funcol a2a bwd", leaves[4].grad, torch.ones_like(leaves[4]))]
    return checks


register(Collectives, "collectives", "every collective type in the tp and dp groups, captured and checked", world=4, tp=2)
