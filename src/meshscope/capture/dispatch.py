"""See every collective a process issues, whoever issues it: a kernel on torch's dispatcher.

Python entry points are not enough: DDP's Reducer issues its bucket all-reduces from C++ and never
passes through ``torch.distributed.all_reduce``. Every caller, though, ends in a ``c10d::`` operator
of the dispatcher: the c10d Python API, ``ProcessGroup`` methods called from C++ (DDP, FSDP2's
all-gather and reduce-scatter), the functional collectives of DTensor and of compiled graphs (their
kernels call ``ProcessGroup::allreduce`` & co., which dispatch ``c10d::allreduce_``), autograd's
backward functions and ``batch_isend_irecv``. So one Python kernel per ``c10d`` op, registered at
the ``BackendSelect`` key (part of every thread's default dispatch set, so reached for CPU and CUDA
tensors, under ``no_grad`` and ``inference_mode``, from autograd's device threads too), decodes the
call and then re-dispatches it below itself (``op.redispatch(keyset & after BackendSelect)``).
It sits below Autograd, the Python modes and FakeTensor, so it sees only real executions (a meta
tensor, as in compile tracing, is skipped), and it never replaces another kernel. A job whose
tensors are all fake (`ModeRecorder`, ``--fake-tensors``) never reaches it: FakeTensorMode answers
every op above it, so there a dispatch mode on top of FakeTensorMode records the same calls.

`install` registers the kernels once per process (registering per use slowed every later call), one
for every op of the installed torch's ``c10d`` namespace that moves data: an op without a decoder (a
newer torch's) passes through, its calls counted (`undecoded`) with one warning per op on the
rank's stderr, so that a trace says what it could not read instead of missing it silently.
`Recorder` switches recording on for one sink. A call nested in a recorded one (a coalesced op
calling the plain one) is not recorded twice. A decoding error is counted, never raised: the job
must not fail because of its tracer.

A sink receives, per call: ``(op, group, dtype, bytes_in, bytes_out, peer, input_splits,
output_splits)``: op as in `core.events.OPS`; group a `GroupInfo` (name, desc, global ranks; one
object per process group); dtype a string; logical bytes on this rank; peer the global rank of a
send's destination, a recv's source (-1: any source) or a rooted op's root, else None; splits the
rows sent to / received from each member, for all_to_all.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C import DispatchKey
from torch._C._distributed_c10d import Work
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class GroupInfo:
    """A process group as the ledger names it."""

    name: str
    """``ProcessGroup.group_name`` (unique per group in a process, e.g. ``"0"``)."""
    desc: str
    """``ProcessGroup.group_desc``: ``default_pg``, DeviceMesh's ``mesh_tp``, Megatron's descriptions."""
    ranks: tuple[int, ...]
    """Global ranks of its members, in group order."""


_groups: dict = {}
_by_name: dict[str, GroupInfo] = {}


def group_info(pg) -> GroupInfo:
    """The `GroupInfo` of a ProcessGroup (or its ScriptObject, or its group name), cached; by name too,
    so that the C++ recorder's calls (which carry the name) resolve after their group is destroyed."""
    if isinstance(pg, str):
        if pg in _by_name:
            return _by_name[pg]
        pg = torch._C._distributed_c10d._resolve_process_group(pg)
    elif isinstance(pg, torch.ScriptObject):  # a fresh box per call: key by the group itself
        pg = dist.ProcessGroup.unbox(pg)
    info = _groups.get(pg)
    if info is not None:
        return info
    try:
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))  # torch keeps numpy ranks as given
    except (ValueError, RuntimeError):  # not in torch's bookkeeping (made in C++): the world, or unknown
        ranks = tuple(range(pg.size())) if pg.size() == dist.get_world_size() else ()
    info = GroupInfo(pg.group_name, getattr(pg, "group_desc", "") or "", ranks)
    _groups[pg] = _by_name[info.name] = info
    return info


def process_group(pg) -> dist.ProcessGroup:
    """The ProcessGroup a c10d op names: the object, its ScriptObject (a c10d op's argument) or its name (a
    functional collective's)."""
    if isinstance(pg, str):
        return torch._C._distributed_c10d._resolve_process_group(pg)
    return dist.ProcessGroup.unbox(pg) if isinstance(pg, torch.ScriptObject) else pg


def _size(pg) -> int:
    """Members of a group whose global ranks torch does not know."""
    return process_group(pg).size()


def _nbytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)


def _nbytes2(lists) -> int:
    return sum(t.nbytes for ts in lists for t in ts)


def _rows(t) -> int:
    return t.shape[0] if t.dim() else 1


def _alltoall_base(a):
    """output, input, pg, output_split_sizes, input_split_sizes: splits in rows of dim 0."""
    out, inp, pg = a[0], a[1], a[2]
    n = len(group_info(pg).ranks) or _size(pg)
    ins = tuple(int(s) for s in a[4]) if a[4] else (_rows(inp) // n,) * n
    outs = tuple(int(s) for s in a[3]) if a[3] else (_rows(out) // n,) * n
    return "all_to_all", pg, inp.dtype, inp.nbytes, out.nbytes, None, ins, outs


def _first_dtype(tensors):
    return tensors[0].dtype if tensors else None


DECODERS = {
    # Positional arguments as in the c10d schemas of torch 2.4-2.13; trailing defaults may be absent.
    # -> (op, pg, dtype, bytes_in, bytes_out, group-local peer or None, input_splits, output_splits)
    "allreduce_": lambda a: ("all_reduce", a[1], a[0][0].dtype, _nbytes(a[0]), _nbytes(a[0]), None, None, None),
    "allreduce_coalesced_": lambda a: ("all_reduce", a[1], a[0][0].dtype, _nbytes(a[0]), _nbytes(a[0]), None, None, None),
    "allgather_": lambda a: ("all_gather", a[2], a[1][0].dtype, _nbytes(a[1]), _nbytes2(a[0]), None, None, None),
    "allgather_coalesced_": lambda a: ("all_gather", a[2], a[1][0].dtype, _nbytes(a[1]), _nbytes2(a[0]), None, None, None),
    "_allgather_base_": lambda a: ("all_gather", a[2], a[1].dtype, a[1].nbytes, a[0].nbytes, None, None, None),
    "allgather_into_tensor_coalesced_": lambda a: ("all_gather", a[2], a[1][0].dtype, _nbytes(a[1]), _nbytes(a[0]),
                                                   None, None, None),
    "reduce_scatter_": lambda a: ("reduce_scatter", a[2], a[0][0].dtype, _nbytes2(a[1]), _nbytes(a[0]), None, None, None),
    "_reduce_scatter_base_": lambda a: ("reduce_scatter", a[2], a[1].dtype, a[1].nbytes, a[0].nbytes, None, None, None),
    "reduce_scatter_tensor_coalesced_": lambda a: ("reduce_scatter", a[2], a[1][0].dtype, _nbytes(a[1]), _nbytes(a[0]),
                                                   None, None, None),
    "alltoall_": lambda a: ("all_to_all", a[2], a[1][0].dtype, _nbytes(a[1]), _nbytes(a[0]), None,
                            tuple(_rows(t) for t in a[1]), tuple(_rows(t) for t in a[0])),
    "alltoall_base_": _alltoall_base,
    "broadcast_": lambda a: ("broadcast", a[1], a[0][0].dtype, _nbytes(a[0]), _nbytes(a[0]), a[2], None, None),
    "reduce_": lambda a: ("reduce", a[1], a[0][0].dtype, _nbytes(a[0]), _nbytes(a[0]), a[3], None, None),
    "gather_": lambda a: ("gather", a[2], a[1][0].dtype, _nbytes(a[1]), _nbytes2(a[0]), a[3], None, None),
    # torch 2.15 (torch/csrc/distributed/c10d/Ops.cpp): gather_into_tensor_(Tensor output_tensor, Tensor
    # input_tensor, ProcessGroup process_group, int root_rank, bool async_op=True, int timeout=-1); the root's
    # output holds every member's input, a non-root passes an empty one (distributed_c10d.py's gather_single)
    "gather_into_tensor_": lambda a: ("gather", a[2], a[1].dtype, a[1].nbytes, a[0].nbytes, a[3], None, None),
    "scatter_": lambda a: ("scatter", a[2], a[0][0].dtype, _nbytes2(a[1]), _nbytes(a[0]), a[3], None, None),
    "send": lambda a: ("send", a[1], a[0][0].dtype, _nbytes(a[0]), 0, a[2], None, None),
    "recv_": lambda a: ("recv", a[1], a[0][0].dtype, 0, _nbytes(a[0]), a[2], None, None),
    "recv_any_source_": lambda a: ("recv", a[1], a[0][0].dtype, 0, _nbytes(a[0]), -1, None, None),
    "barrier": lambda a: ("barrier", a[1], None, 0, 0, None, None, None),
    "monitored_barrier_": lambda a: ("barrier", a[1], None, 0, 0, None, None, None),
}
"""c10d op name -> argument decoder. Every communication op of the ``c10d`` namespace (torch 2.13's, and
``gather_into_tensor_``, which torch 2.15 adds); `uncovered` lists any a newer torch adds."""

MOVES_NOTHING = frozenset({"check_for_nan"})
"""c10d ops that are no communication (NCCL's NaN check of a tensor): neither recorded nor counted."""


def _functional_all_to_all(a):
    """input, output_split_sizes, input_split_sizes, group: the output is the rows the splits name."""
    inp, pg = a[0], a[3]
    n = len(group_info(pg).ranks) or _size(pg)
    ins = tuple(int(s) for s in a[2]) if a[2] else (_rows(inp) // n,) * n
    outs = tuple(int(s) for s in a[1]) if a[1] else (_rows(inp) // n,) * n
    row = inp.element_size() * math.prod(inp.shape[1:])  # a row's bytes, also when this rank sends none
    return "all_to_all", pg, inp.dtype, inp.nbytes, sum(outs) * row, None, ins, outs


FUNCTIONAL_DECODERS = {
    # torch's functional collectives (``_c10d_functional``, DTensor's redistributions), by the schemas of
    # torch 2.4-2.13. On real tensors their kernels issue the c10d op that DECODERS reads; under
    # FakeTensorMode they are answered without it, so `ModeRecorder` reads them as the same call. An
    # in-place (``_``) or ``_out`` variant has its plain twin's arguments and decoder.
    **dict.fromkeys(("all_reduce", "all_reduce_"),
                    lambda a: ("all_reduce", a[2], a[0].dtype, a[0].nbytes, a[0].nbytes, None, None, None)),
    **dict.fromkeys(("all_reduce_coalesced", "all_reduce_coalesced_"),
                    lambda a: ("all_reduce", a[2], a[0][0].dtype, _nbytes(a[0]), _nbytes(a[0]), None, None, None)),
    **dict.fromkeys(("all_gather_into_tensor", "all_gather_into_tensor_out"),
                    lambda a: ("all_gather", a[2], a[0].dtype, a[0].nbytes, a[0].nbytes * a[1], None, None, None)),
    "all_gather_into_tensor_coalesced": lambda a: ("all_gather", a[2], a[0][0].dtype, _nbytes(a[0]), _nbytes(a[0]) * a[1],
                                                   None, None, None),
    **dict.fromkeys(("reduce_scatter_tensor", "reduce_scatter_tensor_out"),
                    lambda a: ("reduce_scatter", a[3], a[0].dtype, a[0].nbytes, a[0].nbytes // a[2], None, None, None)),
    "reduce_scatter_tensor_coalesced": lambda a: ("reduce_scatter", a[3], a[0][0].dtype, _nbytes(a[0]),
                                                  _nbytes(a[0]) // a[2], None, None, None),
    "all_to_all_single": _functional_all_to_all,
    **dict.fromkeys(("broadcast", "broadcast_"),
                    lambda a: ("broadcast", a[2], a[0].dtype, a[0].nbytes, a[0].nbytes, a[1], None, None)),
}
"""``_c10d_functional`` (and ``_c10d_functional_autograd``) op name -> argument decoder, as DECODERS.
Not read: ``wait_tensor`` (moves nothing) and the functional P2P ops (``isend``, ``irecv``,
``batch_p2p_ops``), which torch's parallel APIs do not issue."""


class _State(threading.local):
    busy = False


_tls = _State()
_sink = None
_done = None
_gpu = None  # gpu_arrivals.GpuArrivals of the Recorder that is active, where it times calls on a GPU
_libs: list = []
errors: list[tuple[str, str]] = []
"""(op, error) of calls that could not be decoded (the call itself still ran)."""
undecoded: Counter = Counter()
"""c10d op -> calls of it that no decoder reads (they ran, and are not in the ledger)."""
_warned: set[str] = set()


def count_undecoded(name: str) -> None:
    """One call of c10d op `name`, which no decoder reads: counted, and said once per op on stderr."""
    undecoded[name] += 1
    if name not in _warned:
        _warned.add(name)
        print(f"meshscope trace: c10d::{name} is an op this meshscope cannot decode (this torch is newer than it "
              f"knows): its calls run, are counted (`undecoded` in the rank's record) and are not in the ledger",
              file=sys.stderr, flush=True)


def decode(name: str, args, decoders=DECODERS) -> tuple | None:
    """One call of c10d op `name` as ``(op, GroupInfo, dtype, bytes_in, bytes_out, global peer,
    input_splits, output_splits)``; None (and the error counted in `errors`) if it cannot be decoded.
    Both kernels use it: this module's with the real arguments, `native`'s with their summaries;
    `ModeRecorder` also with FUNCTIONAL_DECODERS."""
    try:
        kind, pg, dtype, b_in, b_out, peer, ins, outs = decoders[name](args)
        info = group_info(pg)
        if peer is not None and peer >= 0 and info.ranks:
            peer = info.ranks[peer]
        return (kind, info, str(dtype).removeprefix("torch.") if dtype is not None else "none", b_in, b_out,
                peer, ins, outs)
    except Exception as exc:  # noqa: BLE001 - never break the job because of its tracer
        errors.append((name, f"{type(exc).__name__}: {exc}"))
        return None


def _kernel(op, name):
    after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
    redispatch, meta = op.redispatch, DispatchKey.Meta

    def kernel(keyset, *args, **kwargs):
        sink = _sink
        if sink is None or _tls.busy or keyset.has(meta):
            return redispatch(keyset & after, *args, **kwargs)
        call_id = None
        if name in DECODERS:
            call = decode(name, args)
            if call is not None:
                call_id = sink(*call)
                if _gpu is not None:
                    _gpu.arrive(call_id, args)
        else:
            count_undecoded(name)
        _tls.busy = True
        try:
            out = redispatch(keyset & after, *args, **kwargs)
        finally:
            _tls.busy = False
        if call_id is not None and _done is not None:
            watch(out, call_id, _done)
        return out

    return kernel


def work_of(out) -> Work | None:
    """The Work among a c10d op's outputs `out` (boxed, as the dispatcher returns it), or None. The object is the
    one the job's Python gets back from the op while this one is alive (pybind11 keeps one wrapper per Work)."""
    for value in out if isinstance(out, tuple) else (out,):
        if isinstance(value, torch.ScriptObject):
            return Work.unbox(value)
    return None


def watch(out, call_id: int, done) -> None:
    """``done(call_id, time.perf_counter())`` once the Work among an op's outputs `out` completed (its
    future: gloo's worker thread finished it; NCCL enqueued it, native_recorder.cpp says more)."""
    work = work_of(out)
    if work is None:
        return
    try:
        future = work.get_future()
    except RuntimeError:  # a backend whose Work has no future: its completion stays unknown
        return
    if future is None:  # NCCL sets none inside a coalescing block
        return
    # NCCL's is complete at enqueue: noted now rather than by a callback, which Python's binding (it
    # has no `uses_future`) runs after a CUDA synchronisation and a record_stream of every output
    # (native_recorder.cpp)
    if future.done():
        done(call_id, time.perf_counter())
    else:
        future.add_done_callback(lambda _: done(call_id, time.perf_counter()))


def comm_ops() -> list[str]:
    """Every op of this torch's ``c10d`` namespace that moves data (what the kernels are registered for)."""
    return sorted(name for name in (n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
                                    if n.startswith("c10d::")) if name not in MOVES_NOTHING)


def uncovered() -> list[str]:
    """c10d ops of this torch that no decoder handles (none on torch 2.13): their calls are counted, not read."""
    return [n for n in comm_ops() if n not in DECODERS]


def install() -> None:
    """Register the kernels, once per process: one for every c10d op that moves data."""
    if _libs:
        return
    lib = torch.library.Library("c10d", "IMPL")
    for name in comm_ops():
        lib.impl(name, _kernel(getattr(torch.ops.c10d, name).default, name), "BackendSelect", with_keyset=True)
    _libs.append(lib)


def uninstall() -> None:
    """Remove the kernels (0.02 ms; a later `install` takes about 2.5 ms): with none registered, the
    dispatcher runs exactly as without meshscope, which a "no trace" benchmark sample needs."""
    while _libs:
        _libs.pop()._destroy()


class Recorder:
    """Calls `sink` for every collective this process issues while active (a context manager); where
    `sink` returns a call id and `done` is given, ``done(id, t)`` once the call's work completed; where
    `gpu` (a `gpu_arrivals.GpuArrivals`) is given, it times each call's arrival on the GPU."""

    def __init__(self, sink, done=None, gpu=None):
        self.sink, self.done, self.gpu = sink, done, gpu

    def __enter__(self) -> Recorder:
        global _sink, _done, _gpu
        install()
        _sink, _done, _gpu = self.sink, self.done, self.gpu
        return self

    def __exit__(self, *exc) -> None:
        global _sink, _done, _gpu
        _sink = _done = _gpu = None


class ModeRecorder(TorchDispatchMode):
    """`Recorder` for a job run under FakeTensorMode: a dispatch mode entered after it (so above it
    on the mode stack) that hands every c10d call to `sink`, decoded by the same `decode`, before
    FakeTensorMode answers it. Every other op passes straight through. Functional collectives are read
    here too: FakeTensorMode answers them without the c10d call their kernels would issue.

    `answers` (``trace.fake.values.Answers``), where given, answers the value reads FakeTensorMode
    cannot (its ``DataDependentOutputException``: ``answer(func, args, exc)``), gives an op whose output's
    shape depends on values its output where it can (``DynamicOutputShapeException``: ``shaped(func, args,
    kwargs, exc)``) and sees every op's and call's outputs (``after(func, args, kwargs, out)``). It is called from this
    mode's own handler: torch wraps every dispatch mode's handler (torch/utils/_python_dispatch.py,
    ``__init_subclass__``), so a second mode or a subclass calling this one would pay that wrapper on
    every op of the job (a rank of bench_fake_world.py: 0.6 M more Python calls)."""

    BY_NAMESPACE = {"c10d": DECODERS, "_c10d_functional": FUNCTIONAL_DECODERS,
                    "_c10d_functional_autograd": FUNCTIONAL_DECODERS}
    supports_higher_order_operators = True
    """A higher-order op (``flex_attention``: torchtitan 0.3.0's llama3) reaches a dispatch mode only if the mode
    says so, else it fails (torch 2.13 and 2.15 torch/_ops.py ``HigherOrderOperator.dispatch``); here it passes
    straight through, with no tensor types, to FakeTensorMode's rule for it."""

    def __init__(self, sink, answers=None, work=None):
        super().__init__()
        self.sink = sink
        self.work = work
        """A `capture.work.WorkCounter` that sees every op and call (``meshscope forecast``), or None."""
        from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                                   FakeTensor)

        self.fake, self.data_dependent, self.dynamic_shape = (FakeTensor, DataDependentOutputException,
                                                              DynamicOutputShapeException)
        self.answers = answers

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t not in (torch.Tensor, torch.nn.Parameter) and not issubclass(t, self.fake) for t in types):
            # A tensor subclass (DTensor) first desugars itself, as FakeTensorMode lets it: the
            # collectives it issues for an op (a Partial gradient reduced inside the optimizer's add_)
            # then come back through this mode; answered here, they would run with this mode off.
            return NotImplemented
        decoders = self.BY_NAMESPACE.get(func.namespace)
        if decoders is not None and not _tls.busy:
            name = func._schema.name.split("::", 1)[1]
            issued = None
            if name in decoders:
                call = decode(name, args, decoders)
                if call is not None:
                    issued = self.sink(*call)
            elif func.namespace == "c10d" and name not in MOVES_NOTHING:
                count_undecoded(name)
            _tls.busy = True
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                _tls.busy = False
            if self.work is not None:
                if issued is not None:
                    self.work.issued(issued, func, args, out)
                else:  # wait_tensor: where the job needs a functional collective's result
                    self.work.op(func, args, kwargs, out)
            if self.answers is not None:
                self.answers.after(func, args, kwargs, out)
            return out
        try:
            out = func(*args, **(kwargs or {}))
        except self.data_dependent as exc:
            if self.answers is None:
                raise
            return self.answers.answer(func, args, exc)
        except self.dynamic_shape as exc:
            if self.answers is None:
                raise
            out = self.answers.shaped(func, args, kwargs, exc)
        if self.answers is not None:
            self.answers.after(func, args, kwargs, out)
        if self.work is not None:
            self.work.op(func, args, kwargs, out)
        return out
