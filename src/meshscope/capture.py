"""Collective capture: record every collective a rank issues as CommEvents.

How: while a `Capture` is active, the Python entry points of torch.distributed (c10d: ``all_reduce``,
``all_gather``, ``all_to_all_single``, ``send``/``isend``, ``batch_isend_irecv``...) and of the functional
collectives (the ``torch.ops._c10d_functional`` ops that ``_functional_collectives`` and their autograd
backward rules call) are swapped for thin recorders; on exit the originals are put back. Nothing else
is touched: no TorchDispatchMode (which sees every aten op and was measured to slow a TP step by about
55 %), and nothing at all when no capture is active, so capture costs nothing when off.

Phase is detected, not guessed: a call made while the autograd engine runs a backward graph task
(``torch._C._current_graph_task_id() != -1``) is ``backward``; otherwise the phase is what the step
code declared with `phase` (``forward`` unless it said ``optimizer``). `region` labels calls with the
layer and microbatch that issued them.

Several captures can listen at once (the run-long flight log, a one-step ledger); each numbers its
own ``seq``. Calls nested inside a recorded call (``all_gather_object`` calling ``all_gather``, ``batch_isend_irecv``
calling ``isend``) are recorded once, at the outermost entry point.

Ops of ``torch.ops._c10d_functional_autograd`` (torch versions whose autograd collectives run their
backward in C++, out of Python's sight) record their backward through a gradient hook on the output,
which fires just before the engine issues the backward collective.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401  (must be imported before any patching)
import torch.distributed.distributed_c10d as c10d

from .events import CommEvent
from .groups import describe


@dataclass
class _Call:
    """A collective call reduced to what a CommEvent needs."""

    op: str
    group: object
    dtype: str
    bytes_in: int
    bytes_out: int
    input_splits: tuple[int, ...] | None = None
    output_splits: tuple[int, ...] | None = None
    peer: int | None = None


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _group_size(group) -> int:
    return len(describe(group)[1])


def _even_splits(rows: int, group) -> tuple[int, ...]:
    n = _group_size(group)
    return (rows // n,) * n


def _global_peer(group, peer, group_peer):
    if peer is not None:
        return peer
    if group_peer is not None:
        return dist.get_global_rank(group if group is not None else dist.group.WORLD, group_peer)
    return None


# -- c10d entry points: bound arguments -> calls --------------------------------------------------
def _c10d_all_reduce(a):
    t = a["tensor"]
    return [_Call("all_reduce", a["group"], _dtype(t), _nbytes(t), _nbytes(t))]


def _c10d_all_gather(a):
    t = a["tensor"]
    return [_Call("all_gather", a["group"], _dtype(t), _nbytes(t), sum(map(_nbytes, a["tensor_list"])))]


def _c10d_all_gather_into_tensor(a):
    i, o = a["input_tensor"], a["output_tensor"]
    return [_Call("all_gather", a["group"], _dtype(i), _nbytes(i), _nbytes(o))]


def _c10d_reduce_scatter(a):
    o = a["output"]
    return [_Call("reduce_scatter", a["group"], _dtype(o), sum(map(_nbytes, a["input_list"])), _nbytes(o))]


def _c10d_reduce_scatter_tensor(a):
    i, o = a["input"], a["output"]
    return [_Call("reduce_scatter", a["group"], _dtype(i), _nbytes(i), _nbytes(o))]


def _c10d_all_to_all(a):
    ins, outs = a["input_tensor_list"], a["output_tensor_list"]
    return [_Call("all_to_all", a["group"], _dtype(ins[0]), sum(map(_nbytes, ins)), sum(map(_nbytes, outs)),
                  tuple(t.shape[0] for t in ins), tuple(t.shape[0] for t in outs))]


def _c10d_all_to_all_single(a):
    i, o, g = a["input"], a["output"], a["group"]
    ins = tuple(a["input_split_sizes"]) if a["input_split_sizes"] else _even_splits(i.shape[0], g)
    outs = tuple(a["output_split_sizes"]) if a["output_split_sizes"] else _even_splits(o.shape[0], g)
    return [_Call("all_to_all", g, _dtype(i), _nbytes(i), _nbytes(o), ins, outs)]


def _c10d_broadcast(a):
    t = a["tensor"]
    return [_Call("broadcast", a["group"], _dtype(t), _nbytes(t), _nbytes(t))]


def _c10d_barrier(a):
    return [_Call("barrier", a["group"], "", 0, 0)]


def _c10d_send(a):
    t = a["tensor"]
    return [_Call("send", a["group"], _dtype(t), _nbytes(t), 0, peer=_global_peer(a["group"], a["dst"], a.get("group_dst")))]


def _c10d_recv(a):
    t = a["tensor"]
    return [_Call("recv", a["group"], _dtype(t), 0, _nbytes(t), peer=_global_peer(a["group"], a["src"], a.get("group_src")))]


def _c10d_batch_isend_irecv(a):
    calls = []
    for p2p in a["p2p_op_list"]:
        name = getattr(p2p.op, "__name__", "")
        peer = _global_peer(p2p.group, getattr(p2p, "peer", None), getattr(p2p, "group_peer", None))
        t = p2p.tensor
        if "send" in name:
            calls.append(_Call("send", p2p.group, _dtype(t), _nbytes(t), 0, peer=peer))
        else:
            calls.append(_Call("recv", p2p.group, _dtype(t), 0, _nbytes(t), peer=peer))
    return calls


_C10D = {
    "all_reduce": _c10d_all_reduce,
    "all_gather": _c10d_all_gather,
    "all_gather_into_tensor": _c10d_all_gather_into_tensor,
    "all_gather_single": _c10d_all_gather_into_tensor,  # torch >= 2.13 name
    "reduce_scatter": _c10d_reduce_scatter,
    "reduce_scatter_tensor": _c10d_reduce_scatter_tensor,
    "reduce_scatter_single": _c10d_reduce_scatter_tensor,  # torch >= 2.13 name
    "all_to_all": _c10d_all_to_all,
    "all_to_all_single": _c10d_all_to_all_single,
    "broadcast": _c10d_broadcast,
    "barrier": _c10d_barrier,
    "send": _c10d_send,
    "isend": _c10d_send,
    "recv": _c10d_recv,
    "irecv": _c10d_recv,
    "batch_isend_irecv": _c10d_batch_isend_irecv,
}


# -- functional collectives: torch.ops._c10d_functional(_autograd).<op>(positional args) ----------
def _f_all_reduce(x, op, group_name):
    return _Call("all_reduce", group_name, _dtype(x), _nbytes(x), _nbytes(x))


def _f_all_gather(x, group_size, group_name):
    return _Call("all_gather", group_name, _dtype(x), _nbytes(x), _nbytes(x) * group_size)


def _f_reduce_scatter(x, op, group_size, group_name):
    return _Call("reduce_scatter", group_name, _dtype(x), _nbytes(x), _nbytes(x) // group_size)


def _f_all_to_all_single(x, output_split_sizes, input_split_sizes, group_name):
    row = _nbytes(x) // max(x.shape[0], 1)
    ins = tuple(int(s) for s in input_split_sizes) if input_split_sizes else _even_splits(x.shape[0], group_name)
    outs = tuple(int(s) for s in output_split_sizes) if output_split_sizes else _even_splits(x.shape[0], group_name)
    return _Call("all_to_all", group_name, _dtype(x), _nbytes(x), row * sum(outs), ins, outs)


def _f_broadcast(x, src, group_name):
    return _Call("broadcast", group_name, _dtype(x), _nbytes(x), _nbytes(x))


_FUNCTIONAL = {
    "all_reduce": _f_all_reduce,
    "all_reduce_": _f_all_reduce,
    "all_gather_into_tensor": _f_all_gather,
    "reduce_scatter_tensor": _f_reduce_scatter,
    "all_to_all_single": _f_all_to_all_single,
    "broadcast": _f_broadcast,
    "broadcast_": _f_broadcast,
}
_AUTOGRAD = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


def _dual(call: _Call) -> _Call:
    """The backward collective of an autograd collective (seed: AG<->RS, A2A<->A2A with splits swapped)."""
    op = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}.get(call.op, call.op)
    return _Call(op, call.group, call.dtype, call.bytes_out, call.bytes_in, call.output_splits, call.input_splits)


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


# -- the capture -----------------------------------------------------------------------------------
class _Labels:
    """Process-wide labels (not thread-local: CUDA backward runs on an autograd device thread)."""

    phase = "forward"
    region = ""
    microbatch: int | None = None


_LABELS = _Labels()
_NESTING = threading.local()


@contextlib.contextmanager
def region(name: str, microbatch: int | None = None):
    """Label the collectives issued inside with a layer/region name and a microbatch index.

    Without a microbatch the enclosing region's is kept, so a layer's own label (``fc2.out``,
    ``moe.dispatch``) nested in a pipeline microbatch still says which microbatch issued it.
    """
    old = (_LABELS.region, _LABELS.microbatch)
    _LABELS.region, _LABELS.microbatch = name, old[1] if microbatch is None else microbatch
    try:
        yield
    finally:
        _LABELS.region, _LABELS.microbatch = old


@contextlib.contextmanager
def phase(name: str):
    """Declare the phase of code outside autograd (``forward`` by default, ``optimizer`` for grad sync)."""
    old, _LABELS.phase = _LABELS.phase, name
    try:
        yield
    finally:
        _LABELS.phase = old


def current_labels() -> tuple[str, int | None]:
    """(region, microbatch) now; autograd Functions save it in forward and restore it in backward."""
    return _LABELS.region, _LABELS.microbatch


class Capture:
    """Context manager recording this rank's collectives into ``events`` (a list of CommEvent).

    Several captures may be active at once (the run-long flight log and a one-step ledger): the
    entry points are patched while at least one is active, and each capture numbers its own ``seq``.
    `on_issue(event)` / `on_complete(event)`, if given, are called around each call (the flight
    log writes both, so that a hung call shows as issued but never completed).
    """

    def __init__(self, on_issue=None, on_complete=None):
        self.events: list[CommEvent] = []
        self._seq: dict[tuple, int] = {}
        self._on_issue, self._on_complete = on_issue, on_complete

    def __enter__(self) -> "Capture":
        if not _ACTIVE:
            _install()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)
        if not _ACTIVE:
            _uninstall()

    def _add(self, proto: dict) -> CommEvent:
        key = (proto["axis"], proto["group"])
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        event = CommEvent(seq=seq, **proto)
        self.events.append(event)
        if self._on_issue:
            self._on_issue(event)
        return event

    def _complete(self, events) -> None:
        if self._on_complete:
            for e in events:
                self._on_complete(e)


_ACTIVE: list[Capture] = []
_SAVED: list[tuple[object, str, object]] = []
_RANK: int | None = None
"""This process's global rank, read on the first recorded call of an install."""


def active() -> bool:
    """True while any capture listens (the patched entry points are in place)."""
    return bool(_ACTIVE)


def _install() -> None:
    for name, describe_call in _C10D.items():
        original = getattr(c10d, name, None)
        if original is None:
            continue  # not in this torch version
        wrapper = _wrap_c10d(original, describe_call)
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                _swap(module, name, wrapper)
    for namespace, autograd in ((torch.ops._c10d_functional, False), (torch.ops._c10d_functional_autograd, True)):
        for name, describe_call in _FUNCTIONAL.items():
            if autograd and name not in _AUTOGRAD:
                continue
            try:
                original = getattr(namespace, name)
            except (AttributeError, RuntimeError):
                continue  # op not in this torch version
            _swap(namespace, name, _wrap_functional(original, describe_call, autograd))


def _uninstall() -> None:
    global _RANK
    _RANK = None
    for obj, name, original in reversed(_SAVED):
        setattr(obj, name, original)
    _SAVED.clear()


def _swap(obj, name, new) -> None:
    _SAVED.append((obj, name, getattr(obj, name)))
    setattr(obj, name, new)


@functools.lru_cache(maxsize=None)  # built once per entry point: entering a capture only swaps attributes
def _wrap_c10d(original, describe_call):
    # Arguments by name without inspect's bind (which costs more than the rest of the recording).
    params = list(_signature(original).parameters.values())
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def recorder(*args, **kwargs):
        if getattr(_NESTING, "depth", 0):
            return original(*args, **kwargs)
        arguments = dict(defaults)
        arguments.update(zip(names, args))
        arguments.update(kwargs)
        return _issue(describe_call(arguments), original, args, kwargs)

    recorder.__name__ = original.__name__
    recorder.__wrapped__ = original
    return recorder


@functools.lru_cache(maxsize=None)
def _wrap_functional(original, describe_call, autograd: bool):
    def recorder(*args, **kwargs):
        if getattr(_NESTING, "depth", 0):
            return original(*args, **kwargs)
        call = describe_call(*args, **kwargs)
        out = _issue([call], original, args, kwargs)
        if autograd and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: _record(_dual(call)))
        return out

    return recorder


def _issue(calls, original, args, kwargs):
    """Record `calls` in every active capture, run the original, then mark them completed."""
    protos = [_proto(c) for c in calls]
    issued = [(cap, [cap._add(p) for p in protos]) for cap in list(_ACTIVE)]
    _NESTING.depth = getattr(_NESTING, "depth", 0) + 1
    try:
        out = original(*args, **kwargs)
    finally:
        _NESTING.depth -= 1
    for cap, events in issued:
        cap._complete(events)
    return out


def _record(call: _Call) -> None:
    """Record a call issued out of Python's sight (C++ autograd backward), as issued and completed."""
    proto = _proto(call)
    for cap in list(_ACTIVE):
        cap._complete([cap._add(proto)])


def _proto(call: _Call) -> dict:
    """The fields of a call's event but its seq (each capture numbers its own)."""
    global _RANK
    if _RANK is None:  # dist.get_rank() costs more than the rest of the recording: ask once per install
        _RANK = dist.get_rank()
    axis, ranks = describe(call.group)
    in_backward = torch._C._current_graph_task_id() != -1
    return dict(
        rank=_RANK, op=call.op, axis=axis, group=ranks,
        phase="backward" if in_backward else _LABELS.phase,
        dtype=call.dtype, bytes_in=call.bytes_in, bytes_out=call.bytes_out,
        region=_LABELS.region, microbatch=_LABELS.microbatch,
        input_splits=call.input_splits, output_splits=call.output_splits, peer=call.peer,
    )
