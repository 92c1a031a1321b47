"""What a fake world's rank receives from a tensor collective or a P2P message: what the traced rank that
sent it sent, where that rank ran before it.

The fake backend hands a rank back what it holds (torch 2.13's fake process group: a broadcast's receiver
keeps its own tensor, an all-gather's slots and an even all-to-all's chunks hold the rank's own input, an
uneven all-to-all's chunk j its first rows, FakeProcessGroup.hpp ``alltoall_base``; a scatter's receiver and a
receive get nothing, torch.empty's bytes). A value received that decides what comes next was then made up
without a word: DeepSpeed 0.19.8's ZeRO-3 broadcasts rank 0's module-trace length at its first forward and
every other rank compares its own, -1 (runtime/zero/utils.py, ``assert_lst_len_same_as_other_ranks``), so
every rank but 0 failed as if the script were wrong; TorchRec 1.8.0's uneven KJT all-to-alls delivered counts
that disagree with the indices, and fbgemm corrupted the heap.

So, as `objects` does for object collectives, what a traced rank sends is put into what a later rank
receives:

- each c10d function of `receives.HANDLERS` called on a member of its group (not inside an object
  collective, whose calls `objects` delivers; not on a tensor subclass: DTensor, and ``--fake-tensors``'
  FakeTensors, which hold no data) records what it sends in the run directory (`objects.Exchange`,
  ``objects/rank<R>/``): a collective is named by its group and how many of these calls this rank issued on
  it before (every member issues them in the same order), a P2P message by its pair and how many messages
  the sender sent the receiver on the group before;
- once the fake backend returned, the rank reads each sender's record (waiting only for a rank forked before
  it that still runs, never reading one forked after it: `objects.Exchange.read`) and writes what that
  sender sent into the part of its output that comes from it; a reduction reduces the members' inputs where
  every member's is known;
- a payload above the cap (`cap`: 64 KiB of floating point, 1 MiB of integers or booleans) is not recorded,
  only marked so: a record is a file written by every traced rank per call, and an activation's or a
  gradient's values size nothing a trace holds; the counts, lengths, offsets and flags that do are small.

What is not known is stood in for, never left as the fake backend left it (`Call.put`): the sender was not
traced before this rank (rank 0 runs first, so its sends reach every later rank; what later ranks send does
not reach rank 0), or its record was itself sent after it kept its own integers (`Call.derived`). A
collective's part takes the rank's own part in its place, where it is of the part's size: an all-to-all's
chunk to itself, an all-gather's or a gather's input; a broadcast's receiver keeps its tensor; in an integer
reduction a member not known is taken to send what this rank sends. Else it holds zeros (a scatter's receiver
has no part of its own). Where ranks are alike, the own chunk is what a peer sends: TorchRec 1.8.0's KJT
all-to-alls send each rank its own tables' features, so the counts, the lengths and the ids it takes for a
peer's agree, as fbgemm's permute and bounds check need. The fake backend's did not (the counts of its chunk
to that peer, the lengths of its first chunk): table-wise at 2, rank 0 corrupted the heap in fbgemm's
``permute_2D_sparse_data`` (SIGSEGV, or SIGABRT ``free(): invalid pointer`` leaving no record); row-wise at 4,
fbgemm's bounds check aborted ("last element in offsets: 55, indices size: 53").

A P2P receive of integers from a sender with no record takes what this rank sent that peer in the message in
its place the other way, where that was integers of its size (`Call.mirror`): a pipeline's backward mirrors
its forward, so a stage traced before the next one gets its gradients' sizes from its activations'.
Colossal-AI 0.5.0 pickles each stage's metadata into a P2P message of its length, then one of its bytes, and
unpickles what it receives (pipeline/p2p.py ``_send_recv_serialization_object``): at tp 2 x pp 2 its rank 0
unpickled zeros for its gradients' metadata, rank 3 beside it zeros for its inputs', both failed
(``EOFError``) and the trace stopped there. Where there is no such message (a stage's first receive from the
stage before it), the receive holds zeros (a job's floating-point receive too, `objects.ZEROED`: torch.empty's
bytes can be NaN). A rank that fails after a receive of integers that held zeros (a P2P message's, or a
collective's part) is named with that call (`stood_in.UNFILLED`).

Where a stand-in's payload is integers or booleans, which can size a later call, the call is noted
(`stood_in.StandIn`, read by `world` into the result's note), and what it may have sized is marked assumed
(`Replay.assumed`): the sizes of the calls the function that received it issues after it while it runs (the
rule of `values.Reads` for a value read without data), and every later all-to-all's splits (they are passed
down from far above). A floating-point payload's stand-in is not noted: it sizes nothing. A rank that failed
on what it made up, got it from a sender traced again since, or got a P2P message's from a rank that ended
after it, is traced once more after its senders (`world.retrace`: each stage of a pipeline hears from the
others in a second run); so is a rank killed in native code after it kept its own, which leaves no record.

Not replayed: torch's functional collectives (DTensor's, compiled graphs', ``_functional_collectives``) and
the calls C++ issues itself (FSDP2's gathers, DDP's rebuild broadcasts: their sizes are the parameters'; a
fake world's DDP bucket all-reduce is `backend.fake_allreduce_hook`'s Python call, and is); an all-to-all
among them keeps its assumed splits and makes every later one's assumed; ``all_reduce_coalesced`` and
``all_gather_coalesced``; a receive from any source.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
from bisect import bisect_right

import torch
import torch.distributed as dist

from ...capture.work import outside_the_job
from ...core.rundir import RunDir
from ..entry_points import arguments, wrap
from . import backend, objects, receives, stood_in
from .objects import EXCHANGE
from .stood_in import NAMED, StandIn
from .values import callers, issuer

CAP_FLOAT = 64 << 10
"""Bytes of floating-point payload a call's record holds at most (module doc: why a cap)."""
CAP_COUNTS = 1 << 20
"""Bytes of integer or boolean payload a call's record holds at most: TorchRec's KJT lengths at a batch of
8,192 over 26 features are 832 KiB of int32."""
SIZES = ("bytes_in", "bytes_out")
KIND = "tensor"
"""The kind of an `objects.Exchange` record this module writes (an object collective's are theirs)."""
UNKNOWN = (stood_in.UNTRACED, stood_in.UNSENT)
"""Why a sender's part is not known where it has no record to read: a receive takes a mirror for it (`Call.mirror`)."""
MIRRORS = 1024
"""P2P messages of integers a rank keeps what it sent in, the latest, for `Call.mirror`."""


class _Windows:
    """Calls by the group they were issued on and the perf_counter interval of their c10d function (the
    recorder stamps a call inside it: `RankTrace.sink`)."""

    def __init__(self):
        self.by_group: dict[str, tuple[list[float], list[float]]] = {}

    def add(self, group: str, t0: float, t1: float) -> None:
        starts, ends = self.by_group.setdefault(group, ([], []))
        starts.append(t0)
        ends.append(t1)

    def holds(self, group: str, t: float) -> bool:
        starts, ends = self.by_group.get(group, ((), ()))
        i = bisect_right(starts, t) - 1
        return i >= 0 and t <= ends[i]


class Replay:
    """This rank's side of the tensor calls: what it kept its own values in, and what those may have sized."""

    def __init__(self):
        self.on = False
        """A fake world's rank with data (not ``--fake-tensors``), once `begin` ran."""
        self.run_dir: RunDir | None = None
        self.rank = -1
        self.context = None
        self.sizing: list = []
        """The frames of the functions that kept their own integers for a peer's and may still be running."""
        self.derived = _Windows()
        """Calls one of those issued directly after: their sizes are assumed."""
        self.exchanged = _Windows()
        """All-to-alls that went through `receives.HANDLERS` (a functional one does not)."""
        self.split = _Windows()
        """Those of them the script passed input splits to (`assumed`)."""
        self.tainted = math.inf
        """When this rank first kept its own integers for a peer's (perf_counter)."""
        self.unreplayed = math.inf
        """When an all-to-all not replayed was issued (`assumed` finds it in the ledger)."""
        self.named: list[StandIn] = []
        """The first calls it kept its own integers in (`stood_in.NAMED`)."""
        self.stood_in_count = 0
        self.unfilled: StandIn | None = None
        """The first P2P receive of integers it could fill with nothing (`stood_in.UNFILLED`: a rank that then
        fails is named with it)."""
        self.p2p_sent: dict[str, list] = {}
        """Key -> what this rank sent in a P2P message of integers, until the message the other way in the
        same place stands in for it (`Call.mirror`)."""

    def begin(self, run_dir: RunDir, rank: int, context, on: bool) -> None:
        self.run_dir, self.rank, self.context, self.on = run_dir, rank, context, on
        stood_in.clear(run_dir, rank)  # a rank traced again says what it kept this time

    def run(self, op: str, handle, issue, given: dict, group, caller):
        t0 = time.perf_counter()
        derived = self._derived(caller)
        call = Call(op, group, derived)
        if op not in ("send", "recv"):
            call.collective()
        # what the handler records, stands in and writes is this fake world's doing, not the rank's work: under
        # --work none of its ops is counted or held, and a measured segment ends at the first (an all-gather at
        # world 1,024 writes 1,023 slots; their copies had taken 7.2 s of an 8B model's measured step on an
        # H100); the call it issues stays the rank's (`capture.work.CountingMode` records a c10d op inside
        # `outside_the_job` too)
        with outside_the_job():
            out = handle(call, issue, given)
        t1 = time.perf_counter()
        if derived:
            self.derived.add(group.group_name, t0, t1)
        if op == "all_to_all":
            self.exchanged.add(group.group_name, t0, t1)
            if given.get("input_split_sizes"):
                self.split.add(group.group_name, t0, t1)
        if call.missing:
            self._stood(call, t0, caller)
        return out

    def _derived(self, caller) -> bool:
        """Whether a function that kept its own integers for a peer's issued this call directly (`values.callers`)."""
        if not self.sizing:
            return False
        on_stack, direct = callers(caller)
        self.sizing = [f for f in self.sizing if id(f) in on_stack]  # those still running
        return any(id(f) in direct for f in self.sizing)

    def _stood(self, call: Call, t0: float, caller) -> None:
        self.tainted = min(self.tainted, t0)
        frame = issuer(caller)
        if frame is not None and all(f is not frame for f in self.sizing):
            self.sizing.append(frame)
        self.stood_in_count += 1
        if len(self.named) < NAMED or call.unfilled and self.unfilled is None:
            group = call.group
            desc = getattr(group, "group_desc", "") or group.group_name
            members = tuple(sorted(int(r) for r in dist.get_process_group_ranks(group)))  # numpy ranks: nanotron's
            step = self.context.step if self.context is not None else 0
            stand_in = StandIn(call.op, desc, members, step, tuple(sorted(call.missing.items())))
            if call.unfilled and self.unfilled is None:
                self.unfilled = stand_in
                stood_in.write_unfilled(self.run_dir, self.rank, stand_in)
            if len(self.named) < NAMED:
                self.named.append(stand_in)
                self.write()  # as it happens: a rank that then crashes (fbgemm on counts it made up) leaves it

    def assumed(self, group: str, op: str, input_splits, output_splits, t: float) -> tuple[str, ...]:
        """The fields of the call issued at `t` on `group` that a stand-in may have sized (module doc): an
        all-to-all's by `backend.assumed` unless it was replayed before this rank kept its own integers for
        a peer's (or an all-to-all went by unreplayed), and its input splits where the script passed them,
        even ones; the sizes of a call a function issued after it kept its own. Asked in issue order
        (`RankTrace.ledger`)."""
        fields: tuple[str, ...] = ()
        if op == "all_to_all":
            through = self.on and self.exchanged.holds(group, t)
            if self.on and not through:
                self.unreplayed = min(self.unreplayed, t)
            if not through or t >= min(self.tainted, self.unreplayed):
                # even input splits the script passed may be what it received as its own for every peer's: a
                # MoE combine sends back what its dispatch received ([14, 14] on tests/jobs/moe_a2a.py's rank 0)
                fields = backend.assumed(op, input_splits, output_splits, through and self.split.holds(group, t))
        if self.derived.holds(group, t):
            fields = tuple(dict.fromkeys(fields + SIZES))
        return fields

    def made_up(self, axes) -> str:
        """The first receive of integers this rank took a stand-in for, the first that held zeros where one
        did (`RankEnd.made_up`), a group the job named not by the axis ``axes()`` infers for its members (as the
        result's note names it; asked only where there is one: it reads the rank's group log); empty where none."""
        if self.unfilled is not None:
            return f"{self.unfilled.text(axes())}: it held zeros"
        return f"{self.named[0].text(axes())}: it held the rank's own" if self.named else ""

    def write(self) -> None:
        """This rank's stand-ins, for `world`'s note and its tracing again (nothing when it kept none)."""
        if self.stood_in_count and self.run_dir is not None:
            stood_in.write(self.run_dir, self.rank, self.stood_in_count, self.named)


REPLAY = Replay()


def _counts(t: torch.Tensor) -> bool:
    """Integers or booleans: what can size a later call."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex)


def cap(tensors) -> int:
    """The bytes a payload of `tensors` may have to be recorded (`CAP_COUNTS` for integers only)."""
    return CAP_COUNTS if all(_counts(t) for t in tensors) else CAP_FLOAT


def _pack(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    t = t.detach().cpu().contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), data


def _unpack(packed) -> torch.Tensor:
    dtype, shape, data = packed
    dtype = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _shaped(value: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """`value` in `like`'s shape, where it is of `like`'s dtype and size; else None."""
    if value is None or value.numel() != like.numel() or value.dtype != like.dtype:
        return None
    return value if value is like else value.reshape(like.shape)


class Call:
    """One wrapped call: its name on the run directory, what it sends, and the senders it did not hear."""

    def __init__(self, op: str, group, derived: bool):
        self.op, self.group, self.derived = op, group, derived
        """`derived`: issued by a function after it kept its own integers for a peer's: its record says so."""
        self.me, self.n = dist.get_rank(group), dist.get_world_size(group)
        self.key = ""
        self.reply: str | None = None
        """A P2P message's: the key of the message in the same place the other way (`mirror`)."""
        self.unfilled = False
        """A receive of integers from an unknown sender that nothing stood in for: it holds zeros (`put`)."""
        self._heard: dict[int, tuple[list | None, str | None]] = {}
        self.missing: dict[int, str] = {}
        """Global rank -> why this rank kept its own integers for what it sent."""

    def collective(self) -> Call:
        self.key = EXCHANGE.named(f"t{self.group.group_name}")
        return self

    def p2p(self, src: int, dst: int) -> Call:
        """A message from global rank `src` to `dst`: the k-th of the pair on the group, on both sides."""
        group = self.group.group_name
        self.key = EXCHANGE.named(f"t{group}-p2p-{src}-{dst}")
        self.reply = f"t{group}-p2p-{dst}-{src}-{self.key.rsplit('-', 1)[1]}"
        return self

    def root(self, given: dict, name: str) -> int:
        """The group rank a rooted call names (``src`` / ``dst`` global, or ``group_src`` / ``group_dst``)."""
        if given.get(f"group_{name}") is not None:
            return given[f"group_{name}"]
        return dist.get_group_rank(self.group, given.get(name) or 0)

    @staticmethod
    def small(tensors) -> bool:
        """Whether `tensors` are within the cap (`cap`): recorded, and worth replaying."""
        return sum(t.numel() * t.element_size() for t in tensors) <= cap(tensors)

    counts = staticmethod(_counts)

    def send(self, tensors: list | None) -> None:
        """Record what this rank sends (None, or above the cap: a marker, so no receiver waits for it)."""
        packed = [_pack(t) for t in tensors] if tensors is not None and self.small(tensors) else None
        EXCHANGE.record(self.key, KIND, (self.derived, packed))
        if self.reply is not None and packed is not None and all(map(_counts, tensors)):
            sent = REPLAY.p2p_sent
            sent[self.key] = packed
            if len(sent) > MIRRORS:  # messages no receive came back for (a stage that only sends)
                del sent[next(iter(sent))]

    def sent(self, j: int) -> tuple[list | None, str | None]:
        """(what group rank `j` sent, why it cannot stand as known or None); (None, None): above the cap."""
        if j not in self._heard:
            g = dist.get_global_rank(self.group, j)
            record = EXCHANGE.read(g, self.key, KIND)
            if record is None:
                self._heard[j] = (None, stood_in.UNSENT if EXCHANGE.before(g) else stood_in.UNTRACED)
            else:
                derived, packed = record
                self._heard[j] = (None if packed is None else [_unpack(p) for p in packed],
                                  stood_in.DERIVED if derived else None)
        return self._heard[j]

    def _value(self, j: int, pick, like: torch.Tensor):
        """What `j` sent for `like` (``pick`` of its tensors) and why it is not known, or (None, why)."""
        data, why = self.sent(j)
        if data is None:
            return None, why
        try:
            value = _shaped(pick(data), like)
        except (IndexError, RuntimeError):
            value = None
        if value is None:
            return None, "sent a tensor of another size"
        return value, why

    def put(self, dst: torch.Tensor, j: int, pick=lambda data: data[0], own: torch.Tensor | None = None) -> None:
        """`dst` (a view of the output) is what group rank `j` sent, where known; else a stand-in (module doc):
        for a P2P receive of integers what this rank sent `j` the other way (`mirror`), for a collective's part
        `own`, this rank's own part in its place (an all-to-all's chunk to itself, an all-gather's input; a
        broadcast's receiver passes `dst`, and keeps it), where it is of `dst`'s dtype and size; else zeros."""
        value, why = self._value(j, pick, dst)
        if self.reply is not None:
            mirror = self.mirror(dst)
            if value is None and why in UNKNOWN and _counts(dst):
                value = mirror
        elif value is None:
            value = _shaped(own, dst)
        self.unfilled = self.unfilled or value is None and why in UNKNOWN and _counts(dst)
        with torch.no_grad():  # an output may be a leaf that requires grad
            if value is None:  # not what the fake backend left: torch.empty's bytes, or a pattern of its own
                dst.zero_()
            elif value is not dst:
                dst.copy_(value)
        self.miss(j, dst, why)

    def mirror(self, like: torch.Tensor) -> torch.Tensor | None:
        """What this rank sent its peer in the message in this one's place the other way (the k-th message
        to it for the k-th from it), where that was integers of `like`'s dtype and size (module doc); asked
        once per receive, which drops it."""
        packed = REPLAY.p2p_sent.pop(self.reply, None)
        return _shaped(_unpack(packed[0]) if packed is not None and len(packed) == 1 else None, like)

    def miss(self, j: int, like: torch.Tensor, why: str | None) -> None:
        if why is not None and _counts(like):
            rank = int(dist.get_global_rank(self.group, j))  # numpy ranks: nanotron's new_group
            self.missing[rank] = why
            if self.reply is not None and why in UNKNOWN:  # a rank that fails on it is traced again once it exists
                EXCHANGE.heard_nothing(rank, self.key)

    def reduce_into(self, dst: torch.Tensor, own: torch.Tensor, op, pick=lambda data: data[0]) -> None:
        """`dst` is the reduction of every member's part (`own`: this rank's, taken before the backend ran)."""
        parts = []
        for j in range(self.n):
            if j == self.me:
                parts.append(own)
                continue
            value, why = self._value(j, pick, own)
            self.miss(j, dst, why)
            if value is None:
                if why is None or not _counts(dst):  # above the cap, or floats: the fake backend's stands
                    return
                value = own  # an integer member not known is taken to send what this rank sends
            parts.append(value)
        value = receives.reduce(op, parts)
        if value is None:
            for j in range(self.n):
                if j != self.me:
                    self.miss(j, dst, f"reduced by {op}, which is not replayed")
            return
        with torch.no_grad():
            dst.copy_(value.reshape(dst.shape))


class _Depth(threading.local):
    depth = 0


_depth = _Depth()


def _plain(value) -> bool:
    """Whether every tensor among the call's arguments holds data of its own (not a DTensor, a FakeTensor,
    a meta tensor)."""
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    return not isinstance(value, torch.Tensor) or (type(value) in (torch.Tensor, torch.nn.Parameter)
                                                    and value.device.type != "meta")


def _replaying(op: str, handle):
    def make(original):
        bind = arguments(original)

        @functools.wraps(original)
        def replayed(*args, **kwargs):
            if not REPLAY.on or _depth.depth or objects.inside():
                return original(*args, **kwargs)
            given = bind(args, kwargs)
            group = given.get("group") or dist.group.WORLD
            if (not isinstance(group, dist.ProcessGroup) or dist.get_rank(group) < 0
                    or not all(_plain(v) for v in given.values())):
                return original(*args, **kwargs)
            _depth.depth += 1
            try:
                return REPLAY.run(op, handle, lambda: original(*args, **kwargs), given, group, sys._getframe(1))
            finally:
                _depth.depth -= 1
        return replayed
    return make


@functools.cache
def replay_tensors() -> None:
    """Tensor collectives and P2P messages deliver what their traced senders sent (the module docstring)."""
    for name, (op, handle) in receives.HANDLERS.items():
        wrap(name, _replaying(op, handle))
