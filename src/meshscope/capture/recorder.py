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

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401  (must be imported before any patching)
import torch.distributed.distributed_c10d as c10d

from ..core.events import CommEvent
from ..core.groups import describe
from .collective_calls import AUTOGRAD, C10D, FUNCTIONAL, Call, dual


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
class _Nesting(threading.local):
    depth = 0
    """Recorded entry points running on this thread (an entry point inside one is not recorded again)."""


_NESTING = _Nesting()
_graph_task_id = torch._C._current_graph_task_id  # != -1 while the autograd engine runs a backward


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
    """Context manager recording this rank's collectives; `events` lists them as CommEvents.

    Several captures may be active at once (the run-long flight log and a one-step ledger): the
    entry points are patched while at least one is active, and each capture numbers its own ``seq``.
    `on_issue(event)` / `on_complete(event)`, if given, are called around each call (the flight
    log writes both, so that a hung call shows as issued but never completed).

    A recorded call only notes what it moved and under which labels; the CommEvents are built when
    `events` is read (or at once, for a capture with callbacks). On the H200 host a recorded call
    cost about 40 us inside a real step while building its event in place (a cold path, and twice
    that on autograd's device thread), most of it the event itself (docs/results/h200x2.md).
    """

    def __init__(self, on_issue=None, on_complete=None):
        self._pending: list[tuple] = []
        self._events: list[CommEvent] = []
        self._seq: dict[tuple, int] = {}
        self._rank = 0
        self._on_issue, self._on_complete = on_issue, on_complete
        self._immediate = on_issue is not None or on_complete is not None
        """Build and announce each call's events at the call (the flight log), not when read."""

    def __enter__(self) -> "Capture":
        self._rank = dist.get_rank() if dist.is_initialized() else 0
        if not _ACTIVE:
            _install()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
            if not _ACTIVE:
                _uninstall()
        else:  # exited while `suspended`: it must not resume
            for paused in _PAUSED:
                if self in paused:
                    paused.remove(self)

    @property
    def events(self) -> list[CommEvent]:
        """Every recorded call of this capture, in issue order."""
        if self._pending:
            self._build()
        return self._events

    def _note(self, entry: tuple) -> list[CommEvent] | None:
        """Record one entry point's calls (see `_issue`); with callbacks, build and announce them now."""
        self._pending.append(entry)
        if not self._immediate:
            return None
        new = self._build()
        if self._on_issue:
            for e in new:
                self._on_issue(e)
        return new

    def _build(self) -> list[CommEvent]:
        # Into locals first: a group that cannot be described raises here, and a second read must not
        # find half of the pending calls numbered.
        new, seqs = [], dict(self._seq)
        for calls, phase_name, region_name, microbatch in self._pending:
            for c in calls:
                axis, ranks = describe(c.group)
                key = (axis, ranks)
                seq = seqs.get(key, 0)
                seqs[key] = seq + 1
                new.append(CommEvent(
                    rank=self._rank, seq=seq, op=c.op, axis=axis, group=ranks, phase=phase_name, dtype=c.dtype,
                    bytes_in=c.bytes_in, bytes_out=c.bytes_out, region=region_name, microbatch=microbatch,
                    input_splits=c.input_splits, output_splits=c.output_splits, peer=c.peer))
        self._seq = seqs
        self._pending.clear()
        self._events.extend(new)
        return new

    def _complete(self, events) -> None:
        if self._on_complete:
            for e in events:
                self._on_complete(e)


_ACTIVE: list[Capture] = []
_PAUSED: list[list[Capture]] = []
"""The captures each enclosing `suspended` block will resume, innermost last."""
_SAVED: list[tuple[object, str, object]] = []


def active() -> bool:
    """True while any capture listens (the patched entry points are in place)."""
    return bool(_ACTIVE)


@contextlib.contextmanager
def suspended():
    """Inside, no capture listens: torch's own entry points are back, so a call costs what it costs
    without meshscope. Timing uses it: the flight log adds about 150 us to the chapter's TP step on the
    H200 host (two calls; docs/results/h200x2.md), which would otherwise be part of every timed figure. Captures entered inside work as usual; the suspended ones resume on exit."""
    paused = list(_ACTIVE)
    if paused:
        _ACTIVE.clear()
        _uninstall()
    _PAUSED.append(paused)
    try:
        yield
    finally:
        _PAUSED.pop()
        if paused:  # those that exited inside have left `paused` (`Capture.__exit__`)
            if not _ACTIVE:
                _install()
            _ACTIVE.extend(paused)


def _install() -> None:
    for name, describe_call in C10D.items():
        original = getattr(c10d, name, None)
        if original is None:
            continue  # not in this torch version
        wrapper = _wrap_c10d(original, describe_call)
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                _swap(module, name, wrapper)
    for namespace, autograd in ((torch.ops._c10d_functional, False), (torch.ops._c10d_functional_autograd, True)):
        for name, describe_call in FUNCTIONAL.items():
            if autograd and name not in AUTOGRAD:
                continue
            try:
                original = getattr(namespace, name)
            except (AttributeError, RuntimeError):
                continue  # op not in this torch version
            _swap(namespace, name, _wrap_functional(original, describe_call, autograd))


def _uninstall() -> None:
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
        if _NESTING.depth:
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
        if _NESTING.depth:
            return original(*args, **kwargs)
        call = describe_call(*args, **kwargs)
        out = _issue([call], original, args, kwargs)
        if autograd and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: _record(dual(call)))
        return out

    return recorder


def _issue(calls, original, args, kwargs):
    """Note `calls` in every active capture, run the original, then mark them completed.

    The hot path of every recorded call, so it stays flat: a capture without callbacks only appends
    one tuple (calls, phase, region, microbatch); `Capture._build` makes the events later."""
    entry = (calls, "backward" if _graph_task_id() != -1 else _LABELS.phase, _LABELS.region, _LABELS.microbatch)
    announced = None
    for cap in _ACTIVE:
        if not cap._immediate:
            cap._pending.append(entry)
        else:
            announced = announced or []
            announced.append((cap, cap._note(entry)))
    _NESTING.depth += 1
    try:
        out = original(*args, **kwargs)
    finally:
        _NESTING.depth -= 1
    if announced:
        for cap, events in announced:
            cap._complete(events)
    return out


def _record(call: Call) -> None:
    """Record a call issued out of Python's sight (C++ autograd backward), as issued and completed."""
    entry = ([call], "backward" if _graph_task_id() != -1 else _LABELS.phase, _LABELS.region, _LABELS.microbatch)
    for cap in list(_ACTIVE):
        events = cap._note(entry)
        if events is not None:
            cap._complete(events)
