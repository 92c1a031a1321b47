"""What a fake world's rank receives from an object collective or a P2P object message: the source's real
object where it was traced.

torch sends picklable objects (``broadcast_object_list``, ``all_gather_object``, ``scatter_object_list``,
``gather_object``) as two calls on the group: the sizes of their pickles (int64), then the bytes (uint8),
each sized from what the first delivered (torch 2.13 distributed_c10d.py, ``broadcast_object_list`` and
siblings). The fake backend hands a rank back what it holds, so a non-source rank of a broadcast decodes
the ``torch.empty`` it received the sizes in: a negative dimension, a 94 TB allocation, ``EOFError``,
``UnpicklingError`` (every Lightning Trainer broadcasts its log_dir this way); a scatter's receiver
likewise; an all-gather gets its own object in every slot.

So torch's own code runs each call, and issues what a real rank issues (the same two calls, the same
dtypes and root); what the peers would have sent is put into the tensors it receives into, right after
the fake backend returned (`_receiving`):

- each rank records what it sends (a source's objects, a rank's own object for an all-gather or a
  gather) in the run directory (``objects/rank<R>/``, `RunDir.objects`) before it receives anything;
- a rank reads a sender's record: rank 0 is traced first, so a later rank receives what rank 0 sent,
  and the sizes of the calls are the real ones. A sender traced at the same time (``--ranks auto``
  traces rank 0 and the last rank together) is waited for when the fork server forked it first
  (`alongside`): a rank waits only for ranks forked before it, so no two ranks ever wait for each
  other. A sender forked after it, or never traced, is not known;
- what is not known is stood in for by the rank's own object, and the call whose sizes follow from
  it (the bytes) has ``bytes_in`` and ``bytes_out`` marked assumed (`Exchange.assumed`, stamped by the
  recorder as `CommEvent.assumed`).

``send_object_list`` / ``recv_object_list`` (two sends, or two ``batch_isend_irecv`` of one op each:
the sizes, then the bytes) are matched as P2P is: the k-th message from one rank to another on a group
(`Exchange.p2p_key`). A receiver whose sender is unknown gets its own list back, or what the library
that called it knows the sender sends (`standing_in`: pipelining's gradient metadata, `pipeline`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ...capture.work import outside_the_job
from ...core.rundir import RunDir, write_atomic
from ..entry_points import rebind

POLL_S = 0.02
"""How often a rank looks for the record of a sender that runs beside it."""

SIZED = ("bytes_in", "bytes_out")
"""The fields a stand-in decides: the bytes of the call sized by the objects' pickles."""


@dataclass
class _Delivery:
    """What one c10d call of an object collective receives: a value per tensor it receives into."""

    values: list
    stand_in: bool = False
    """Sized by this rank's own stand-in: the call's bytes are assumed."""


class _Inbox(threading.local):
    queues: dict[str, list[_Delivery]] | None = None
    """c10d function name -> what its next calls on this thread receive, in order."""
    stand_in: Callable[[list], list] | None = None
    """What an unknown sender of a P2P object message is taken to have sent (`standing_in`), from the
    receiver's list; None: the receiver's own list."""
    inside: int = 0
    """Object collectives running on this thread: their c10d calls are theirs to deliver, not `replay`'s."""


_inbox = _Inbox()


class Exchange:
    """This rank's side of the object collectives: its records, its readings, the calls it stood in for."""

    def __init__(self):
        self.run_dir: RunDir | None = None
        self.rank = -1
        self.alongside: dict[int, int] = {}
        """Rank -> pid of the ranks the fork server was running when it forked this one."""
        self.earlier: set[int] = set()
        """The ranks that had ended when this one began: with `alongside`, the ranks it reads records of (a
        rank forked after it may have written one by then, or not: what it receives must not hang on that)."""
        self.calls: dict[str, int] = {}
        self.stood_in: list[tuple[str, float, float]] = []
        """(group name, from, to) of the calls sized by a stand-in (perf_counter: the recorders' clock)."""
        self.unheard: set[str] = set()
        """The records of P2P messages this rank looked for and did not find (`RankEnd.unheard`): object messages',
        and those of `replay`'s receives of integers."""

    def begin(self, run_dir: RunDir, rank: int) -> None:
        self.run_dir, self.rank = run_dir, rank
        ends = run_dir.rank_end(rank).parent
        self.earlier = ({int(p.stem.removeprefix("rank")) for p in ends.glob("rank*.json")} - {rank}
                        if ends.is_dir() else set())

    def key(self, group) -> str:
        """The call's name, the same on every member: the group's name and how many object collectives this
        rank issued on it before (every member issues them in the same order)."""
        return self.named(group.group_name)

    def p2p_key(self, group, src: int, dst: int) -> str:
        """A P2P object message's name, the same on both sides: the group's, the pair's (global ranks) and
        how many messages `src` sent `dst` on it before (the k-th send meets the k-th receive)."""
        return self.named(f"{group.group_name}-p2p-{src}-{dst}")

    def named(self, name: str) -> str:
        """`name` and how many times this rank asked for it before: the k-th message of a kind a library
        names itself (`pipeline`'s stage metadata), and the counter of `key` and `p2p_key`."""
        n = self.calls[name] = self.calls.get(name, -1) + 1
        return f"{name}-{n}"

    def _running(self, rank: int, pid: int | None) -> bool:
        """Whether `rank`, forked before this one (`pid`), is still running and may yet write a record."""
        return pid is not None and _alive(pid) and not self.run_dir.rank_end(rank).exists()

    def read_any(self, key: str, kind: str) -> list[bytes] | None:
        """What any other traced rank recorded as `key`, the lowest first, waiting while a rank forked
        before this one still runs; None if none has."""
        mine = self.run_dir.objects(self.rank)
        while True:
            for path in sorted(mine.parent.glob(f"rank*/{key}.pkl"),
                               key=lambda p: int(p.parent.name.removeprefix("rank"))):
                if path.parent != mine:
                    sent_kind, pickles = pickle.loads(path.read_bytes())
                    if sent_kind == kind:
                        return pickles
            if not any(self._running(rank, pid) for rank, pid in self.alongside.items()):
                break
            time.sleep(POLL_S)
        self.unheard.add(str((mine.parent / "rank*" / f"{key}.pkl").relative_to(self.run_dir.path)))
        return None

    def before(self, rank: int) -> bool:
        """Whether `rank` was forked before this one (ended, or running beside it): whose records it reads."""
        return rank in self.alongside or rank in self.earlier

    def _path(self, rank: int, key: str):
        return self.run_dir.objects(rank) / f"{key}.pkl"

    def record(self, key: str, kind: str, pickles) -> None:
        """What this rank sent in call `key` (an object collective's pickles; `replay`'s packed tensors)."""
        folder = self.run_dir.objects(self.rank)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self._path(self.rank, key), pickle.dumps((kind, pickles)))

    def read(self, rank: int, key: str, kind: str, p2p: bool = False):
        """What `rank` sent in call `key`, waiting for it while it runs beside this rank; None if unknown
        (and, for a `p2p` message, noted in `unheard`)."""
        if rank == self.rank:
            return None
        path, pid = self._path(rank, key), self.alongside.get(rank)
        if pid is None and rank not in self.earlier:  # forked after this rank, or never: not known
            if p2p:
                self.heard_nothing(rank, key)
            return None
        while not path.exists() and self._running(rank, pid):
            time.sleep(POLL_S)
        if not path.exists():  # a rank writes its records before its end: this look is the last word
            if p2p:
                self.heard_nothing(rank, key)
            return None
        sent_kind, pickles = pickle.loads(path.read_bytes())
        return pickles if sent_kind == kind else None

    def heard_nothing(self, rank: int, key: str) -> None:
        """`rank`'s record `key` of a P2P message was not there to read (`unheard`)."""
        self.unheard.add(str(self._path(rank, key).relative_to(self.run_dir.path)))

    def assumed(self, group: str, t: float) -> tuple[str, ...]:
        """The fields of the call issued at `t` on `group` that a stand-in sized."""
        return SIZED if any(g == group and t0 <= t <= t1 for g, t0, t1 in self.stood_in) else ()


EXCHANGE = Exchange()


def alongside(running: dict[int, int]) -> None:
    """The fork server's word, in a rank it just forked: the ranks (-> pid) it runs beside."""
    EXCHANGE.alongside = dict(running)


def _alive(pid: int) -> bool:
    """Whether a rank the fork server forked is still there (or not yet reaped: its end says it is done)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pickled(obj) -> bytes:
    """``obj`` as torch pickles it for an object collective (``_object_to_tensor``'s pickler)."""
    f = io.BytesIO()
    c10d._pickler(f).dump(obj)
    return f.getvalue()


def unpickled(data: bytes):
    """The object a record holds, as torch unpickles what it received (``_tensor_to_object``)."""
    return c10d._unpickler(io.BytesIO(data)).load()


def _longs(*values: int):
    return torch.tensor(values, dtype=torch.long)


def _sizes(pickles: list[bytes]):
    return _longs(*map(len, pickles))


def _bytes(data: bytes, width: int | None = None):
    out = torch.zeros(len(data) if width is None else width, dtype=torch.uint8)
    if data:
        out[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def _group(given):
    group = given or dist.group.WORLD
    return group if dist.get_rank(group) >= 0 else None  # not a member: torch's own code warns and returns


def _group_rank(group, rank, group_rank) -> int:
    return group_rank if group_rank is not None else dist.get_group_rank(group, 0 if rank is None else rank)


def _members(group, key: str, kind: str, own: bytes) -> tuple[list[bytes], bool]:
    """Every member's pickle of an all-gather or gather (the unknown ones: `own`), and whether all are known."""
    me = dist.get_rank(group)
    got = [[own] if i == me else EXCHANGE.read(dist.get_global_rank(group, i), key, kind)
           for i in range(dist.get_world_size(group))]
    return [own if p is None else p[0] for p in got], None not in got


def inside() -> bool:
    """Whether an object collective is running on this thread (its calls are delivered here, not by `replay`)."""
    return _inbox.inside > 0


def _run(original, args, kwargs, **queues: list[_Delivery]):
    _inbox.queues = queues
    try:
        return original(*args, **kwargs)
    finally:
        _inbox.queues = None


def _wrapping(body):
    """An object function of c10d replaced by ``body(original, args, kwargs, given, group)`` (`given`: its
    arguments by name) on a member of the group; a rank outside it calls torch's own, which warns and
    returns."""
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            given = signature.bind(*args, **kwargs).arguments
            group = _group(given.get("group"))
            if group is None:
                return original(*args, **kwargs)
            _inbox.inside += 1
            try:
                return body(original, args, kwargs, given, group)
            finally:
                _inbox.inside -= 1
        return wrapper
    return make


@_wrapping
def _broadcast_object_list(original, args, kwargs, given, group):
    key, objects = EXCHANGE.key(group), given["object_list"]
    root = _group_rank(group, given.get("src"), given.get("group_src"))
    if dist.get_rank(group) == root:  # it sends what it holds: nothing to receive
        EXCHANGE.record(key, "broadcast_object_list", [pickled(o) for o in objects])
        return original(*args, **kwargs)
    sent = EXCHANGE.read(dist.get_global_rank(group, root), key, "broadcast_object_list")
    known = sent is not None and len(sent) == len(objects)
    pickles = sent if known else [pickled(o) for o in objects]
    return _run(original, args, kwargs, broadcast=[
        _Delivery([_sizes(pickles)]), _Delivery([_bytes(b"".join(pickles))], stand_in=not known)])


@_wrapping
def _all_gather_object(original, args, kwargs, given, group):
    key, own = EXCHANGE.key(group), pickled(given["obj"])
    EXCHANGE.record(key, "all_gather_object", [own])
    pickles, known = _members(group, key, "all_gather_object", own)
    width = max(map(len, pickles))
    sizes, data = [_sizes([p]) for p in pickles], [_bytes(p, width) for p in pickles]
    # torch 2.13 all-gathers into a list of tensors; torch 2.15 into one (``all_gather_single``)
    return _run(original, args, kwargs,
                all_gather=[_Delivery(sizes), _Delivery(data, stand_in=not known)],
                all_gather_single=[_Delivery([torch.cat(sizes)]), _Delivery([torch.cat(data)], stand_in=not known)])


@_wrapping
def _gather_object(original, args, kwargs, given, group):
    key, own = EXCHANGE.key(group), pickled(given["obj"])
    EXCHANGE.record(key, "gather_object", [own])
    pickles, known = _members(group, key, "gather_object", own)
    width = max(map(len, pickles))  # every member sends its pickle resized to the largest
    root = _group_rank(group, given.get("dst"), given.get("group_dst"))
    received = [_bytes(p, width) for p in pickles] if dist.get_rank(group) == root else []
    return _run(original, args, kwargs, all_gather=[_Delivery([_sizes([p]) for p in pickles])],
                gather=[_Delivery(received, stand_in=not known)])


@_wrapping
def _scatter_object_list(original, args, kwargs, given, group):
    key, me = EXCHANGE.key(group), dist.get_rank(group)
    root = _group_rank(group, given.get("src"), given.get("group_src"))
    if me == root:
        sent = [pickled(o) for o in given["scatter_object_input_list"]]
        EXCHANGE.record(key, "scatter_object_list", sent)
    else:
        sent = EXCHANGE.read(dist.get_global_rank(group, root), key, "scatter_object_list")
    known = sent is not None and len(sent) == dist.get_world_size(group)
    mine = sent[me] if known else pickled(given["scatter_object_output_list"][0])
    width = max(map(len, sent)) if known else len(mine)  # the source pads every pickle to its largest
    # the source's own max size is already in the tensor it broadcasts; its scatter receives nothing
    # from the fake backend, so it too is handed its own element
    return _run(original, args, kwargs, broadcast=[] if me == root else [_Delivery([_longs(width)])],
                scatter=[_Delivery([_bytes(mine, width)], stand_in=not known), _Delivery([_sizes([mine])])])


@_wrapping
def _send_object_list(original, args, kwargs, given, group):
    dst = dist.get_global_rank(group, _group_rank(group, given.get("dst"), given.get("group_dst")))
    key = EXCHANGE.p2p_key(group, dist.get_rank(), dst)
    EXCHANGE.record(key, "send_object_list", [pickled(o) for o in given["object_list"]])
    return original(*args, **kwargs)


@_wrapping
def _recv_object_list(original, args, kwargs, given, group):
    objects = given["object_list"]
    src = dist.get_global_rank(group, _group_rank(group, given.get("src"), given.get("group_src")))
    sent = EXCHANGE.read(src, EXCHANGE.p2p_key(group, src, dist.get_rank()), "send_object_list", p2p=True)
    known = sent is not None and len(sent) == len(objects)
    if not known:
        stood = _inbox.stand_in(list(objects)) if _inbox.stand_in else objects
        sent = [pickled(o) for o in stood]
    # the sizes, then the bytes, each by recv or (use_batch) by an irecv of batch_isend_irecv
    queue = [_Delivery([_sizes(sent)]), _Delivery([_bytes(b"".join(sent))], stand_in=not known)]
    return _run(original, args, kwargs, recv=queue, irecv=queue)


@contextlib.contextmanager
def standing_in(make: Callable[[list], list]):
    """While this runs, a P2P object message from a sender not traced is taken to be ``make(receiver's
    list)`` (its bytes assumed), not the receiver's own list: what a library knows a peer sends."""
    before, _inbox.stand_in = _inbox.stand_in, make
    try:
        yield
    finally:
        _inbox.stand_in = before


def _receiving(name: str, into):
    """c10d's `name` that, inside an object collective, puts what the peers sent into the tensors it received
    into (`into`: bound arguments -> those tensors) once the fake backend returned."""
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def receive(*args, **kwargs):
            queue = (_inbox.queues or {}).get(name)
            if not queue:
                out = original(*args, **kwargs)
                if name in ZEROED and _inbox.queues is None:  # a P2P tensor of the job's own, not an object's
                    # the fake world's doing, not the job's (`outside_the_job`): counted, the zeros read the buffer
                    # and so needed the receive at once, before a send the job issues in the same batch (Megatron's
                    # interleaved schedule receives the next microbatch with the send of this one), and a forecast's
                    # pipeline waited on itself
                    with torch.no_grad(), outside_the_job():  # a stage's receive buffer is a leaf that requires grad
                        for tensor in into(signature.bind(*args, **kwargs).arguments):
                            tensor.zero_()
                return out
            # a call nested in this one (torch's handle_torch_function calls this name again) is not the one
            # delivered to: it finds no queue
            delivery, queues, _inbox.queues = queue.pop(0), _inbox.queues, None
            began = time.perf_counter()
            try:
                out = original(*args, **kwargs)
            finally:
                _inbox.queues = queues
            given = signature.bind(*args, **kwargs).arguments
            if delivery.stand_in:
                group = given.get("group") or dist.group.WORLD
                EXCHANGE.stood_in.append((group.group_name, began, time.perf_counter()))
            for tensor, value in zip(into(given), delivery.values):
                tensor.copy_(value)
            return out
        return receive
    return make


ZEROED = ("recv", "irecv")
"""Receives whose buffer a fake world fills with zeros: what the fake backend leaves there is whatever
``torch.empty`` held, and a pipeline's later stage that computes on it can read NaN (torchtitan 0.3.0
stops on a non-finite loss, trainer.py)."""

RECEIVERS = {"broadcast": lambda a: [a["tensor"]], "all_gather": lambda a: a["tensor_list"],
             "gather": lambda a: a.get("gather_list") or [], "scatter": lambda a: [a["tensor"]],
             "recv": lambda a: [a["tensor"]], "irecv": lambda a: [a["tensor"]],
             "all_gather_single": lambda a: [a["output_tensor"]]}
"""The c10d calls torch's object collectives make, and what each receives into (torch 2.13; torch 2.15's
``all_gather_object`` gathers its sizes and its bytes each into one tensor, ``all_gather_single``, not a list)."""

COLLECTIVES = {"broadcast_object_list": _broadcast_object_list, "all_gather_object": _all_gather_object,
               "gather_object": _gather_object, "scatter_object_list": _scatter_object_list,
               "send_object_list": _send_object_list, "recv_object_list": _recv_object_list}


@functools.cache
def deliver_objects() -> None:
    """The object collectives deliver what their senders sent (the module docstring)."""
    for name, into in RECEIVERS.items():
        rebind(getattr(c10d, name), _receiving(name, into)(getattr(c10d, name)))
    for name, make in COLLECTIVES.items():
        rebind(getattr(c10d, name), make(getattr(c10d, name)))
