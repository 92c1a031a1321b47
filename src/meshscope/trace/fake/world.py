"""`meshscope trace --fake-world N`: what every rank of an N-rank job issues, before booking a GPU.

Each chosen rank runs the script in a process of its own on the fake backend (`backend`), forked
from a server that imported torch once (`fork_server`), one per usable core at a time; with
``--fake-tensors`` its tensors have no data (`tensors`). With ``--ranks auto`` rank 0 (and beside it
the last rank) runs first; the groups it created (all of them: creation is a global protocol) give
the classes of ranks (`classes.rank_classes`), what those two issued says in which kinds of group a
middle member differs from the last (`classes.ordered_kinds`), and one rank per class is traced: the
lowest. When every one of those first ranks failed the same way (the same exception at the same
line of the script), the others would too: the trace stops there and says so once. Cross-rank checks
run among the ranks traced, and the result says which ranks stand for which. The order matters to what
ranks receive: a rank gets what a rank traced before it sent (`objects`, `replay`), so rank 0's sends
reach every later rank, and a note names the calls that kept a rank's own integers instead (`stood_in`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection

from ...core.events import P2P, rank_ranges
from ...core.rundir import RunDir
from ...core.fake_world import FakeDevice, FakeWorld, RankClass
from ...core.rank_end import Answered, RankEnd
from ...core.trace_result import TraceResult
from ...core.trace_spec import TraceSpec
from ..assemble import assemble, conclude, created_groups, rank_events
from . import files, gpu, stood_in
from .classes import ORDERED, ordered_kinds, rank_classes
from .fork_server import ForkServer, ServerFailed


def trace_fake_world(options, run_dir: RunDir, echo=None) -> TraceResult:
    echo = echo or (lambda line: sys.stderr.write(line))
    world = options.world
    per_node = options.nproc_per_node or min(8, world)
    chosen = options.chosen_ranks()

    def spec(expected):
        return TraceSpec(world=world, command=tuple(options.target), traced=len(expected) if expected else 1,
                         expected=tuple(expected) if expected else None, nproc_per_node=per_node, steps=options.steps,
                         fake_world=True, ranks=options.ranks)

    run_dir.begin(spec(chosen))
    classes, same, again, ordered = None, None, [], ORDERED
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if options.measure_on:  # each rank's clock times its own work: one rank at a time
        cores = 1
    codes: dict[int, int] = {}
    asked: list[int] = []  # the first ranks handed to the server: each must end with a record
    server = ForkServer(run_dir, options.rank_options(run_dir.path), world, per_node)
    failure = None
    try:  # one rank per usable core, each forked from a server that imported torch once
        if chosen is None:  # auto: rank 0 first, then one representative per class of its groups
            # The last rank, the last member of every group it is in, is a class of its own or its
            # class's representative (a traced member is preferred): traced beside rank 0 on a second core
            asked = [0, world - 1] if cores > 1 and world > 1 else [0]
            echo(f"meshscope trace: fake world of {world}: tracing ranks {asked} to find the classes of ranks\n")
            codes.update(server.run(asked, cores, more=True))
            first = [run_dir.read_end(r) for r in asked]
            same = failed_alike(first)
            if same is None:
                groups = created_groups(run_dir)
                # what the first ranks issued says in which kinds of group a member's place beyond first or
                # not counts; a rank that did not end may not have reached its pipeline's sends
                ordered = ordered_kinds(world, groups, (e for r in asked for e in rank_events(run_dir, r))) if all(
                    end.ended for end in first) else ORDERED
                classes = rank_classes(world, groups, ordered, exact=options.work)
                chosen = sorted(_representative(members, codes) for members in classes.values())
        if same is None:
            echo(f"meshscope trace: fake world of {world}: tracing ranks {chosen}\n")
            codes.update(server.run([r for r in chosen if r not in codes], cores))
            ranks: list[int] = []
            for _ in range(RETRACE_ROUNDS):
                ranks = retrace(run_dir, chosen, ranks)
                if not ranks:
                    break
                echo(f"meshscope trace: fake world of {world}: tracing ranks {ranks} again: they received values "
                     f"from ranks not yet traced\n")
                codes.update(server.run(ranks, cores))
                again = sorted({*again, *ranks})
    except ServerFailed as exc:
        failure = str(exc)
    except BaseException:  # Ctrl-C or a bug of meshscope's while ranks run: none is left running
        server.close(abort=True)
        raise
    server.close()
    traced = chosen if same is None and chosen else asked  # the server failed before the classes were known
    run_dir.write_spec(spec(traced).to_json())
    ends = [run_dir.read_end(r) for r in traced]
    patched = tuple(dict.fromkeys(row for end in ends for row in end.patched))
    section = FakeWorld(world, tuple(traced), tuple(
        RankClass(_representative(m, codes), rank_ranges(m), len(m)) for m in sorted(classes.values(), key=min))
        if classes else None,
        f"one rank per class of rank 0's group creations: ranks in the same place of every kind of group (its "
        f"size, and whether first member or not; first, {'each' if options.work else 'odd or even'} middle, or "
        f"last member {_ordered_text(ordered)}); a script that branches on its rank number can defeat this"
        if classes else "the ranks given" if options.chosen_ranks() is not None else
        "the first ranks only: they failed the same way, so the classes were not traced", patched, stand_in(ends))
    result = assemble(run_dir, account=failure, fake_world=section)
    failed = [end.rank for end in ends if end.status in FAILED]
    result.notes += fake_notes(result, stood_in.read(run_dir, traced), stood_in.unfilled(run_dir, failed))
    if again:
        result.notes.append(f"ranks {again} were traced again after the others: they failed after receiving values "
                            f"from ranks not yet traced, received them from a rank traced again since, or received a "
                            f"point-to-point message's from a rank traced after them (what is shown is that second "
                            f"run)")
    if same is not None:
        result.notes.append(f"ranks {asked} failed the same way ({same}); the other classes of ranks were not "
                            f"traced: they run the same script")
    return conclude(run_dir, result)


RETRACE_ROUNDS = 4
"""Rounds of `retrace` at most: an interleaved pipeline's ranks each wait on a stage the other ranks hold
(rank 0's stage 2 needs stage 1's shapes, which need stage 0's), so each round lets one more stage through."""


FAILED = ("error", "missing")
"""How a rank that `retrace` may take again for its failure ended: a rank killed in native code by what it made
up may leave no record (fbgemm's heap corruption: SIGABRT, ``free(): invalid pointer``), only its stand-ins,
written as they happen (`replay.Replay._stood`)."""


def retrace(run_dir: RunDir, traced: list[int], again: Collection[int] = ()) -> list[int]:
    """The ranks of `traced` to trace once more, after all the others, so that they receive what was sent
    (`objects`, `pipeline`, `replay`): those that failed or left no record (`FAILED`) after a P2P message they
    got a stand-in for, where a record they looked for has been written since (`RankEnd.unheard`), or after
    they kept their own integers for what a rank sent that ended after them (`stood_in.unsent`); those that
    passed but kept their own for what a rank traced `again` in the last round sent (its first run was cut
    short, or sized what it sent by a stand-in of its own); and those that passed but kept their own integers
    in a P2P receive from a rank that ended after them, or whose record of a P2P message it did not find has
    been written since. A pipeline's last stage runs beside rank 0, before any
    rank of the stage that sends it its inputs' shapes, and rank 0 before every rank of the stage that sends
    it its gradients' (Colossal-AI 0.5.0 pickles both into P2P messages, pipeline/p2p.py
    ``_send_recv_serialization_object``: each rank of a pipeline gets what the others send only in a second
    run, `replay.Call.mirror`); rank 0 runs before every rank whose counts it receives (TorchRec's KJT
    all-to-alls: fbgemm crashed on the counts the fake backend left it, `replay.Call.put`)."""
    ends = {r: run_dir.read_end(r) for r in traced}
    stood = stood_in.read(run_dir, traced)

    def later(rank: int, among, ops: tuple[str, ...] | None = None) -> bool:
        senders = stood_in.unsent(stood[rank][1], ops) if rank in stood else set()
        return any(s in ends and s in among and ends[s].time > ends[rank].time for s in senders)

    def written(end: RankEnd) -> bool:
        """A P2P message's record it looked for is there now. Ranks run side by side, so its sender may have
        ended first yet written the record after the rank looked (a pipeline's first stage, whose gradients'
        metadata come from the stage after it: under load that stage ended first, and no end time said so)."""
        return any(any(run_dir.path.glob(p)) for p in end.unheard)

    return [r for r, end in ends.items()
            if end.status in FAILED and (written(end) or later(r, ends))
            or end.ended and (later(r, again) or later(r, ends, P2P) or written(end))]


def stand_in(ends: list[RankEnd]) -> FakeDevice | None:
    """The stand-in GPU of the ranks that mapped CUDA, with the queries it answered on any of them."""
    key = next((end.device for end in ends if end.device), "")
    if not key:
        return None
    g = gpu.GPUS[key]
    return FakeDevice(key, g.name, g.total_memory, g.major, g.minor, g.multi_processor_count,
                      tuple(dict.fromkeys(call for end in ends for call in end.device_calls)))


def failed_alike(ends: list[RankEnd]) -> str | None:
    """'ValueError at train.py:12' when every one of `ends` failed with the same exception at the same
    place of the script, else None; None too where one failed after a stand-in for a peer's message
    (`RankEnd.unheard`) or after integers it made up for a peer's (`RankEnd.made_up`): the ranks traced after
    it may send them (`retrace`), and the other classes run the same script on what was really sent."""
    if not ends or any(e.status != "error" or e.unheard or e.made_up for e in ends):
        return None
    ways = {(e.exception or e.error, e.where) for e in ends}
    if len(ways) != 1:
        return None
    what, where = ways.pop()
    return f"{what} at {where}" if where else what


def fake_notes(result: TraceResult, stood: dict | None = None, unfilled: dict | None = None) -> list[str]:
    """What the fake backend stood in for, in this trace, each note only where its calls occur (`stood`: the
    calls that kept a rank's own integers for a peer's, `stood_in.read`; `unfilled`: the failed ranks' receives
    that held zeros, `stood_in.unfilled`); and how the ranks' files were kept apart."""
    notes = []
    a2a = sum(1 for e in result.events if e.assumed and e.op == "all_to_all")
    objects = sum(r.stood_in for r in result.ranks)
    if a2a:
        notes.append(f"fake backend: an all-to-all's sizes are assumed where the rank kept its own counts for a "
                     f"peer's before it (a peer not traced before it), or where it was not replayed (a functional "
                     f"collective's, or under --fake-tensors every one): {a2a} calls carry an `assumed` field naming "
                     f"those values")
    if objects:
        notes.append(f"fake backend: an object collective (broadcast_object_list, all_gather_object, scatter_object_list, "
                     f"gather_object) or P2P object message (send_object_list) gets what the ranks traced before it "
                     f"sent; from any other rank it gets a stand-in (its own object; a pipeline stage's metadata, the "
                     f"same stage's from another rank or derived from its outputs): {objects} such calls got one, and "
                     f"the bytes of the calls sized from them are assumed (their `assumed` field)")
    if any(e.op == "recv" for e in result.events):
        notes.append("fake backend: a receive gets no data from a peer not traced before it (zeros, or for integers "
                     "what the rank sent that peer in the message in its place the other way; what a peer traced "
                     "before it sent is replayed); a pipeline's warm-up vote is each rank's own stages' "
                     "(docs/trace.md, 'A large world on one CPU')")
    axes = {e.group: e.axis for e in result.events}
    kept_own = stood_in.note(stood or {}, axes)
    if kept_own:
        notes.append(kept_own)
    zeros = stood_in.unfilled_note(unfilled or {}, axes)
    if zeros:
        notes.append(zeros)
    device = result.fake_world.device if result.fake_world else None
    if device is not None and device.answered:
        notes.append(gpu.note(list(device.answered), gpu.GPUS[device.key]))
    answered = [a for r in result.ranks for a in r.answered]
    if answered:
        notes.append(answered_note(answered, sum(1 for r in result.ranks if r.answered)))
    kept = files.note(result.ranks)
    return notes + ([kept] if kept else [])


ANSWERED_SHOWN = 6
"""Places an answered-reads note names (the rest are in ``ranks/rank<R>.json``)."""


def answered_note(answered: list[Answered], ranks: int) -> str:
    """What ``--fake-tensors`` answered without data, by place, most read first."""
    total: dict[tuple[str, str, str], list[int]] = {}
    for a in answered:
        counts = total.setdefault((a.at, a.script, a.answer), [0, 0])
        counts[0] += a.count
        counts[1] += a.sized
    places = sorted(total.items(), key=lambda item: -item[1][0])
    shown = "; ".join(f"{at}{f' (from {script})' if script != at else ''}: {n}, {answer}"
                      for (at, script, answer), (n, _) in places[:ANSWERED_SHOWN])
    more = f"; and {len(places) - ANSWERED_SHOWN} more places (ranks/rank<R>.json)" if len(places) > ANSWERED_SHOWN else ""
    sized = sum(s for _, (_, s) in places)
    sizes = (f"; {sized} calls issued by a function after it read an integer carry assumed sizes (`assumed`)"
             if sized else "")
    reads = sum(n for _, (n, _) in places)
    return (f"--fake-tensors: tensors have no values, so {reads} value read{'s' if reads > 1 else ''} on {ranks} "
            f"rank{'s' if ranks > 1 else ''} {'were' if reads > 1 else 'was'} answered without data: {shown}{more}{sizes}")


def _ordered_text(ordered: set[str] | str) -> str:
    if ordered == ORDERED:
        return "in every kind"
    if not ordered:
        return "in none: the first ranks issued no point-to-point call and no call rooted past a group's first member"
    return f"in {', '.join(sorted(repr(d) for d in ordered))}, where the first ranks issued point-to-point or rooted calls"


def _representative(members: list[int], traced) -> int:
    """A class's traced rank: one already traced if any, else its lowest."""
    return next((r for r in members if r in traced), min(members))
