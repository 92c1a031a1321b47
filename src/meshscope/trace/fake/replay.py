"""What a fake world's rank receives from a tensor collective or a P2P message: what the traced rank that
sent it sent, where that rank ran before it.

The fake backend hands a rank back what it holds (torch 2.13's fake process group: a broadcast's receiver
keeps its own tensor, an all-gather's slots and an all-to-all's chunks hold the rank's own input, a scatter's
receiver and a receive get nothing). A value received that decides what comes next was then made up without
a word: DeepSpeed 0.19.8's ZeRO-3 broadcasts rank 0's module-trace length at its first forward and every
other rank compares its own, -1 (runtime/zero/utils.py, ``assert_lst_len_same_as_other_ranks``), so every
rank but 0 failed as if the script were wrong; TorchRec 1.8.0's uneven KJT all-to-alls delivered counts
that disagree with the indices, and fbgemm corrupted the heap.

So, as `objects` does for object collectives, what a traced rank sends is put into what a later rank
receives:

- each c10d function of `HANDLERS` called on a member of its group (not inside an object collective, whose
  calls `objects` delivers; not on a tensor subclass: DTensor, and ``--fake-tensors``' FakeTensors, which
  hold no data) records what it sends in the run directory (`objects.Exchange`, ``objects/rank<R>/``): a
  collective is named by its group and how many of these calls this rank issued on it before (every member
  issues them in the same order), a P2P message by its pair and how many messages the sender sent the
  receiver on the group before;
- once the fake backend returned, the rank reads each sender's record (waiting only for a rank forked
  before it that still runs, as `objects` does) and writes what that sender sent into the part of its
  output that comes from it; a reduction reduces the members' inputs where every member's is known;
- a payload above the cap (`cap`: 64 KiB of floating point, 1 MiB of integers or booleans) is not recorded,
  only marked so: a record is a file written by every traced rank per call, and an activation's or a
  gradient's values size nothing a trace holds; the counts, lengths, offsets and flags that do are small.

What is not known stays the rank's own (the fake backend's; a receive's zeros, `objects.ZEROED`; in an
integer reduction a member not known is taken to send what this rank sends): the sender was not traced
before this rank (rank 0 runs first, so its sends reach every later rank; what later ranks send does not
reach rank 0), or its record was itself sent after it kept its own integers (`Call.derived`). Where that
payload is integers or booleans, which can size a later call, the call is noted (`stood_in.StandIn`, read by
`world` into the result's note), and what it may have sized is marked assumed (`Replay.assumed`): the
sizes of the calls the function that received it issues after it while it runs (the rule of
`values.Reads` for a value read without data), and every later all-to-all's splits (they are passed down
from far above). A floating-point payload's stand-in is not noted: it sizes nothing.

Not replayed: torch's functional collectives (DTensor's, compiled graphs', ``_functional_collectives``) and
the calls C++ issues itself (DDP's buckets, FSDP2's gathers: their sizes are the parameters'); an all-to-all
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

from ...core.events import rank_ranges
from ...core.rundir import RunDir
from ..entry_points import arguments, wrap
from . import backend, objects, stood_in
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
        self.context = None
        self.sizing: list = []
        """The frames of the functions that kept their own integers for a peer's and may still be running."""
        self.derived = _Windows()
        """Calls one of those issued directly after: their sizes are assumed."""
        self.exchanged = _Windows()
        """All-to-alls that went through `HANDLERS` (a functional one does not)."""
        self.tainted = math.inf
        """When this rank first kept its own integers for a peer's (perf_counter)."""
        self.unreplayed = math.inf
        """When an all-to-all not replayed was issued (`assumed` finds it in the ledger)."""
        self.named: list[StandIn] = []
        """The first calls it kept its own integers in (`stood_in.NAMED`)."""
        self.stood_in_count = 0

    def begin(self, context, on: bool) -> None:
        self.context, self.on = context, on

    def run(self, op: str, handle, issue, given: dict, group, caller):
        t0 = time.perf_counter()
        derived = self._derived(caller)
        call = Call(op, group, derived)
        if op not in ("send", "recv"):
            call.collective()
        out = handle(call, issue, given)
        t1 = time.perf_counter()
        if derived:
            self.derived.add(group.group_name, t0, t1)
        if op == "all_to_all":
            self.exchanged.add(group.group_name, t0, t1)
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
        if len(self.named) < NAMED:
            group = call.group
            desc = getattr(group, "group_desc", "") or group.group_name
            self.named.append(StandIn(call.op, f"{desc} [{rank_ranges(dist.get_process_group_ranks(group))}]",
                                         self.context.step if self.context is not None else 0,
                                         tuple(sorted(call.missing.items()))))

    def assumed(self, group: str, op: str, input_splits, output_splits, t: float) -> tuple[str, ...]:
        """The fields of the call issued at `t` on `group` that a stand-in may have sized (module doc): an
        all-to-all's by `backend.assumed` unless it was replayed before this rank kept its own integers for
        a peer's (or an all-to-all went by unreplayed); the sizes of a call a function issued after it kept
        its own. Asked in issue order (`RankTrace.ledger`)."""
        fields: tuple[str, ...] = ()
        if op == "all_to_all":
            through = self.on and self.exchanged.holds(group, t)
            if self.on and not through:
                self.unreplayed = min(self.unreplayed, t)
            if not through or t >= min(self.tainted, self.unreplayed):
                fields = backend.assumed(op, input_splits, output_splits)
        if self.derived.holds(group, t):
            fields = tuple(dict.fromkeys(fields + SIZES))
        return fields

    def write(self, run_dir: RunDir, rank: int) -> None:
        """This rank's stand-ins, for `world`'s note (nothing when it kept none)."""
        if self.stood_in_count:
            stood_in.write(run_dir, rank, self.stood_in_count, self.named)


REPLAY = Replay()


def _counts(t: torch.Tensor) -> bool:
    """Integers or booleans: what can size a later call."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex)


def cap(tensors) -> int:
    return CAP_COUNTS if all(_counts(t) for t in tensors) else CAP_FLOAT


def _small(tensors) -> bool:
    return sum(t.numel() * t.element_size() for t in tensors) <= cap(tensors)


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


class Call:
    """One wrapped call: its name on the run directory, what it sends, and the senders it did not hear."""

    def __init__(self, op: str, group, derived: bool):
        self.op, self.group, self.derived = op, group, derived
        """`derived`: issued by a function after it kept its own integers for a peer's: its record says so."""
        self.me, self.n = dist.get_rank(group), dist.get_world_size(group)
        self.key = ""
        self._heard: dict[int, tuple[list | None, str | None]] = {}
        self.missing: dict[int, str] = {}
        """Global rank -> why this rank kept its own integers for what it sent."""

    def collective(self) -> Call:
        self.key = EXCHANGE.named(f"t{self.group.group_name}")
        return self

    def p2p(self, src: int, dst: int) -> Call:
        """A message from global rank `src` to `dst`: the k-th of the pair on the group, on both sides."""
        self.key = EXCHANGE.named(f"t{self.group.group_name}-p2p-{src}-{dst}")
        return self

    def root(self, given: dict, name: str) -> int:
        """The group rank a rooted call names (``src`` / ``dst`` global, or ``group_src`` / ``group_dst``)."""
        if given.get(f"group_{name}") is not None:
            return given[f"group_{name}"]
        return dist.get_group_rank(self.group, given.get(name) or 0)

    def send(self, tensors: list | None) -> None:
        """Record what this rank sends (None, or above the cap: a marker, so no receiver waits for it)."""
        packed = [_pack(t) for t in tensors] if tensors is not None and _small(tensors) else None
        EXCHANGE.record(self.key, KIND, (self.derived, packed))

    def sent(self, j: int) -> tuple[list | None, str | None]:
        """(what group rank `j` sent, why it cannot stand as known or None); (None, None): above the cap."""
        if j not in self._heard:
            record = EXCHANGE.read(dist.get_global_rank(self.group, j), self.key, KIND)
            if record is None:
                self._heard[j] = (None, "not traced before it")
            else:
                derived, packed = record
                self._heard[j] = (None if packed is None else [_unpack(p) for p in packed],
                                  "kept its own integers for a peer's before it sent" if derived else None)
        return self._heard[j]

    def _value(self, j: int, pick, like: torch.Tensor):
        """What `j` sent for `like` (``pick`` of its tensors) and why it is not known, or (None, why)."""
        data, why = self.sent(j)
        if data is None:
            return None, why
        try:
            value = pick(data)
        except (IndexError, RuntimeError):
            value = None
        if value is None or value.numel() != like.numel() or value.dtype != like.dtype:
            return None, "sent a tensor of another size"
        return value.reshape(like.shape), why

    def put(self, dst: torch.Tensor, j: int, pick=lambda data: data[0]) -> None:
        """`dst` (a view of the output) is what group rank `j` sent, where known; else it is the rank's own."""
        value, why = self._value(j, pick, dst)
        if value is not None:
            with torch.no_grad():  # an output may be a leaf that requires grad
                dst.copy_(value)
        self.miss(j, dst, why)

    def miss(self, j: int, like: torch.Tensor, why: str | None) -> None:
        if why is not None and _counts(like):
            self.missing[dist.get_global_rank(self.group, j)] = why

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
        value = _reduce(op, parts)
        if value is None:
            for j in range(self.n):
                if j != self.me:
                    self.miss(j, dst, f"reduced by {op}, which is not replayed")
            return
        with torch.no_grad():
            dst.copy_(value.reshape(dst.shape))


def _reduce(op, parts: list[torch.Tensor]) -> torch.Tensor | None:
    R = dist.ReduceOp
    stack = torch.stack([p.reshape(-1) for p in parts])
    dtype = parts[0].dtype
    if op == R.SUM:
        out = stack.sum(0)
    elif op == R.AVG:
        out = stack.sum(0) / len(parts) if dtype.is_floating_point else stack.sum(0) // len(parts)
    elif op == R.PRODUCT:
        out = stack.prod(0)
    elif op == R.MIN:
        out = stack.amin(0)
    elif op == R.MAX:
        out = stack.amax(0)
    elif op in (R.BAND, R.BOR, R.BXOR):
        bitwise = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}
        out = functools.reduce(next(f for o, f in bitwise.items() if op == o), list(stack))
    else:  # PREMUL_SUM: a factor of its own
        return None
    return out.to(dtype)


def _split(t: torch.Tensor, splits, n: int):
    """`t`'s views along dim 0 by `splits` (even when none), or None where they do not make n parts."""
    parts = torch.split(t, list(splits)) if splits else (torch.split(t, t.shape[0] // n) if t.dim() else ())
    return parts if len(parts) == n else None


def _flat(t: torch.Tensor):
    return t.view(-1) if t.is_contiguous() else None


# -- one handler per c10d function: (call, issue the function, its arguments by name) -> its result ----------

def _broadcast(call, issue, given):
    tensor, root = given["tensor"], call.root(given, "src")
    if call.me == root:
        call.send([tensor])
        return issue()
    out = issue()
    call.put(tensor, root)
    return out


def _all_reduce(call, issue, given):
    tensor = given["tensor"]
    if not _small([tensor]):  # nothing to reduce: keep no copy of a gradient bucket
        call.send(None)
        return issue()
    own = tensor.detach().clone()
    call.send([tensor])
    out = issue()
    if call.op == "all_reduce" or call.me == call.root(given, "dst"):
        call.reduce_into(tensor, own, given.get("op", dist.ReduceOp.SUM))
    return out


def _all_gather(call, issue, given):
    tensor, slots = given["tensor"], given["tensor_list"]
    call.send([tensor])
    out = issue()
    for j, slot in enumerate(slots):
        if j != call.me:
            call.put(slot, j)
    return out


def _all_gather_single(call, issue, given):
    inp, output = given["input_tensor"], given["output_tensor"]
    call.send([inp])
    out = issue()
    flat, k = _flat(output), inp.numel()
    if flat is not None and flat.numel() == k * call.n:
        for j in range(call.n):
            if j != call.me:
                call.put(flat[j * k:(j + 1) * k], j)
    return out


def _gather(call, issue, given):
    tensor = given["tensor"]
    call.send([tensor])
    out = issue()
    if call.me == call.root(given, "dst"):
        for j, slot in enumerate(given.get("gather_list") or ()):
            if j != call.me:
                call.put(slot, j)
            elif slot.shape == tensor.shape:
                with torch.no_grad():
                    slot.copy_(tensor)
    return out


def _scatter(call, issue, given):
    tensor, root = given["tensor"], call.root(given, "src")
    if call.me == root:
        parts = list(given.get("scatter_list") or ())
        call.send(parts)
        out = issue()
        if len(parts) == call.n:  # the fake backend hands the source nothing either
            with torch.no_grad():
                tensor.copy_(parts[root])
        return out
    out = issue()
    call.put(tensor, root, lambda data: data[call.me])
    return out


def _reduce_scatter(call, issue, given):
    output, inputs = given["output"], list(given["input_list"])
    if len(inputs) != call.n or not _small(inputs):
        call.send(None)
        return issue()
    own = inputs[call.me].detach().clone()
    call.send(inputs)
    out = issue()
    call.reduce_into(output, own, given.get("op", dist.ReduceOp.SUM), lambda data: data[call.me])
    return out


def _reduce_scatter_single(call, issue, given):
    output, inp = given["output"], given["input"]
    k = output.numel()
    flat = _flat(inp)
    if flat is None or flat.numel() != k * call.n or not _small([inp]):
        call.send(None)
        return issue()
    call.send([inp])
    own = flat[call.me * k:(call.me + 1) * k].clone()
    out = issue()
    call.reduce_into(output, own, given.get("op", dist.ReduceOp.SUM),
                     lambda data: data[0].reshape(-1)[call.me * k:(call.me + 1) * k])
    return out


def _all_to_all_single(call, issue, given):
    output, inp = given["output"], given["input"]
    chunks = _split(inp, given.get("input_split_sizes"), call.n)
    if chunks is None:
        call.send(None)
        return issue()
    call.send(list(chunks))
    own = chunks[call.me].clone()
    out = issue()
    parts = _split(output, given.get("output_split_sizes"), call.n)
    if parts is not None:
        for j, part in enumerate(parts):
            if j != call.me:
                call.put(part, j, lambda data: data[call.me])
            elif part.shape == own.shape:
                with torch.no_grad():
                    part.copy_(own)
    return out


def _all_to_all(call, issue, given):
    outputs, inputs = given["output_tensor_list"], list(given["input_tensor_list"])
    call.send(inputs)
    own = inputs[call.me].clone() if len(inputs) == call.n else None
    out = issue()
    for j, part in enumerate(outputs):
        if j != call.me:
            call.put(part, j, lambda data: data[call.me])
        elif own is not None and part.shape == own.shape:
            with torch.no_grad():
                part.copy_(own)
    return out


def _send(call, issue, given):
    dst = dist.get_global_rank(call.group, call.root(given, "dst"))
    call.p2p(dist.get_rank(), dst).send([given["tensor"]])
    return issue()


def _recv(call, issue, given):
    if given.get("src") is None and given.get("group_src") is None:  # any source: no pair to name
        return issue()
    src = call.root(given, "src")
    call.p2p(dist.get_global_rank(call.group, src), dist.get_rank())
    out = issue()
    call.put(given["tensor"], src)
    return out


HANDLERS = {
    "broadcast": ("broadcast", _broadcast), "all_reduce": ("all_reduce", _all_reduce), "reduce": ("reduce", _all_reduce),
    "all_gather": ("all_gather", _all_gather), "all_gather_single": ("all_gather", _all_gather_single),
    "all_gather_into_tensor": ("all_gather", _all_gather_single), "gather": ("gather", _gather),
    "scatter": ("scatter", _scatter), "reduce_scatter": ("reduce_scatter", _reduce_scatter),
    "reduce_scatter_single": ("reduce_scatter", _reduce_scatter_single),
    "reduce_scatter_tensor": ("reduce_scatter", _reduce_scatter_single),
    "all_to_all_single": ("all_to_all", _all_to_all_single), "all_to_all": ("all_to_all", _all_to_all),
    "send": ("send", _send), "isend": ("send", _send), "recv": ("recv", _recv), "irecv": ("recv", _recv),
}
"""c10d function -> (its op in the ledger, its handler). torch 2.13's ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` call ``all_gather_single`` and ``reduce_scatter_single`` (which torch 2.11 lacks),
``send`` and ``recv`` call ``isend`` and ``irecv``: the outermost call is handled, the inner ones pass."""

TARGETS = tuple(n for n in HANDLERS if n not in ("all_gather_single", "reduce_scatter_single"))
"""The names every torch read (2.11, 2.13) has: a fake world's table lists them (`patches`)."""


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
    for name, (op, handle) in HANDLERS.items():
        wrap(name, _replaying(op, handle))
