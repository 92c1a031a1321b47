"""What a rank computes between its calls, where it first needs what a call produced, and the memory it
holds: the rank side of ``meshscope forecast`` (docs/forecast.md).

A ``--fake-tensors`` rank runs every aten op of its job through one dispatch mode
(`capture.dispatch.ModeRecorder`), so that mode can count what each op costs without running it:

- **FLOPs** by torch's own per-op formulas (``torch.utils.flop_counter``'s registry, the convention of
  ``FlopCounterMode``: 2 per multiply-add; matmuls, convolutions and attention), kept per dtype, since a
  GPU's tensor cores run bf16 and fp32 at different peaks. The CPU's fused attention
  (``_scaled_dot_product_flash_attention_for_cpu``, what a fake world's SDPA dispatches to on the CPU that
  stands for the GPU) is counted by the formula of the GPU's flash attention, the kernel it stands for.
- **Bytes** an op reads and writes (its tensor operands and results), the memory traffic of a roofline;
  views, which move nothing, count none.
- **Where a call is first needed**: where the job waits for it (``Work.wait``, which c10d calls for every call
  not made with ``async_op=True``: `work_waited`, reported by a fake world's stand-in), else the first op that
  reads a storage it wrote (an all-gather's output, an all-reduced bucket, a received activation,
  ``wait_tensor`` of a functional collective). On a GPU the stream must wait for the call there: NCCL's
  ``Work.wait`` orders the current stream after the call's kernel, read or not.
- **Live bytes**: every storage an op creates counts from its creation until it is freed (seen before the
  rank's next op: a weak reference's callback on the storage's Python object, which torch keeps for as long as
  the storage lives), with the phase it was made in; the
  peak, and where it was (step, phase, module), is the rank's peak memory. A storage resized in place (FSDP2's
  gathered parameters, freed and refilled) holds its new size from then (`resized`). An op on the meta device counts
  nothing: a model built there before it is sharded (torchtitan's ``torch.device("meta")``) holds no memory
  on a GPU, and its full size had been the peak of a 70B model at FSDP 32 x TP 8 (263 GiB, on 96 GiB GPUs).
- **Host storages** count nothing: what the job keeps in the host's memory (FSDP2's CPU offload: its sharded
  parameters, gradients and optimizer state) is not the GPU's (``on_host``: in a fake world, where every tensor
  is a CPU tensor, the storages the script put on the host, `trace.fake.cuda_tensors`). An op that writes only
  such storages runs on the host (the offloaded optimizer step): its bytes are the host's work (`HOST_WORK`), a
  segment of its own in program order, which the rank's CPU thread does before it issues anything more (a copy
  from the GPU into such storages is a copy engine's transfer: not counted).
- **Reserved bytes**: the same storages, made and freed in the same order on the streams they were made on,
  through a model of torch's CUDA caching allocator (`caching_allocator`, expandable segments where the job's
  environment asks for them): the most the allocator would have held, ``max_memory_reserved``, and where.

The log is a flat list of items in program order (`WorkLog.items`); `WorkLog` is what a rank writes to
``work/rank<R>.json`` and ``forecast`` reads.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .caching_allocator import CachingAllocator, expandable_segments
from .dispatch import work_of

VIEWS = frozenset({"view", "_unsafe_view", "reshape", "expand", "as_strided", "t", "transpose", "permute",
                   "squeeze", "unsqueeze", "alias", "detach", "slice", "select", "split", "split_with_sizes",
                   "unbind", "chunk", "narrow", "view_as_real", "view_as_complex", "_reshape_alias", "unflatten",
                   "lift_fresh", "diagonal", "indices", "values", "_indices", "_values"})
"""aten ops that make a view: they move no bytes and create no storage."""

ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
                         "empty_permuted", "resize_"})
"""aten ops that only allocate: they hold memory and move no bytes (zeros and full write theirs, and count)."""
COPIES = frozenset({"copy_", "copy", "_to_copy"})
"""aten ops that copy: from a GPU's storage into the host's, a copy engine's transfer, neither kernel nor host work."""

ATTENTION = "attention"
"""A segment's FLOPs of fused attention kernels are keyed ``"<dtype> attention"`` (timed at their own efficiency:
forecast/compute.py); those of `ATTENTION_OPS`."""
ATTENTION_OPS = ("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")
"""Name prefixes of the aten ops that are one fused attention kernel on a GPU (the CPU's stand-in included)."""

COMPUTE, HOST_WORK, ISSUE, WAIT, STEP = "c", "h", "i", "w", "s"
STREAM_WAITS, RECORDED, EVENT_WAITED = "j", "e", "v"
"""Orders between streams: a stream waits for another's work so far; an event recorded on a stream; a stream
waits for an event."""
"""An `Item`'s kinds: a compute segment, the host's work in it, a call issued, a call first needed, a step's end."""

_outside = threading.local()


@contextlib.contextmanager
def outside_the_job():
    """Ops run in the block are torch's bookkeeping, not the job's work: not counted, their tensors not held.
    DTensor's sharding propagation runs each op once more at its global shape on tensors it makes for that, in
    the fake mode it finds, the job's under fake tensors, else one it makes (torch 2.13
    distributed/tensor/_sharding_prop.py, ``_propagate_tensor_meta_non_cached``): either way this counter sees
    those ops and would count them and hold their tensors as the rank's."""
    _outside.depth = getattr(_outside, "depth", 0) + 1
    try:
        yield
    finally:
        _outside.depth -= 1


@contextlib.contextmanager
def inside_the_job():
    """Ops run in the block are the job's again, inside `outside_the_job`: a fake world's replay copies what a
    list all-to-all received into the job's parts, reads of the call's output that say where the rank needs it
    (`trace.fake.receives._issue_as_one`)."""
    depth = getattr(_outside, "depth", 0)
    _outside.depth = 0
    try:
        yield
    finally:
        _outside.depth = depth


class _Region:
    """What the ops of one compiled function's call read and made, for `run_compiled`."""

    __slots__ = ("counter", "read", "made", "kept")

    def __init__(self):
        self.counter = None  # the rank's counter, once an op of the region reached it
        self.read: dict[tuple, int] = {}  # (storage, offset, bytes) of a tensor made before the region -> bytes
        self.made: dict[int, int] = {}  # storage key -> bytes an op of the region wrote there
        self.kept: set[int] = set()  # storages of `made` that a kernel of its own read

    def keep(self, args) -> None:
        """A kernel of its own in the compiled code (a matmul, attention, an extern op) read `args`: written."""
        self.kept.update(t.untyped_storage()._cdata for a in args for t in _tensors(a))

    def keep_read(self, args) -> None:
        """An op outside the region read `args`: what of them the region made is written."""
        self.kept.update(key for a in args for t in _tensors(a) if (key := t.untyped_storage()._cdata) in self.made)


_compiled = threading.local()
# The sequence number the next autograd node made on this thread will get (torch/csrc/autograd/function.h: each
# node takes the thread's next one where it is made); absent before torch 2.2, where a compiled call's backward is
# counted op by op.
_next_node = getattr(torch._C._autograd, "_get_sequence_nr", None)
_PARAMETER_NODE = 2**64 - 1
"""A parameter's AccumulateGrad node's sequence number (UINT64_MAX: made outside any forward's order)."""


def run_compiled(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, a function ``torch.compile`` returned, run eagerly (a fake world's stance) and
    counted as the kernels its compilation makes of it: its matmuls and attention as they run, every other op
    fused, so that what they move is what the region reads from before it once and what it writes that outlives
    it (`WorkCounter.ran_compiled`), not each op's operands (Megatron's bias-GeLU, jit-fused: nine elementwise
    passes eagerly, one kernel compiled). Inductor's fusion is the model; its choices (a reduction's own kernel,
    a recomputation) are not; an op with no FLOP formula that dominates a step, or one outside aten (a custom
    op), is a kernel of its own. Its backward, which AOTAutograd compiles as one graph too, runs in eager autograd
    as the nodes the call made: their ops are fused the same way (`WorkCounter.backward_region`). A region inside
    another is the outer one's. Writes are kept per storage: two halves of one storage written in one region count
    as one write of the larger."""
    if getattr(_compiled, "region", None) is not None:
        return fn(*args, **kwargs)
    region = _compiled.region = _Region()
    first = _next_node() if _next_node is not None else 0
    try:
        out = fn(*args, **kwargs)
    finally:  # a recomputation stopped early (torch.utils.checkpoint's early stop raises) still ran what it ran
        _compiled.region = None
        if region.counter is not None:
            region.counter.ran_compiled(region)
    # the nodes a forward made, in this thread's numbering; a call made in backward (a recomputation, which may
    # run on autograd's device thread, numbered apart) keeps its backward op by op
    if region.counter is not None and _next_node is not None and torch._C._current_autograd_node() is None:
        region.counter.made_nodes(first, _next_node())
    return out


def _flop_formulas() -> dict:
    """Op overload -> FLOP formula (torch.utils.flop_counter, torch 2.4-2.15), plus the CPU's fused
    attention under the GPU flash attention's formula (same operands: query, key, value first).

    torch's attention formulas count every query against every key; a causal kernel (flash or memory-efficient
    attention with ``is_causal``) skips the blocks above the diagonal, about half of them at long sequences, so
    an op whose ``is_causal`` is set counts half: the work the GPU does, which the time is made of. (MFU
    conventions differ here; the forecast never compares MFU across them.)"""
    from torch.utils.flop_counter import flop_registry

    formulas = dict(flop_registry)
    aten = torch.ops.aten
    for cpu, gpu in (("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward",
                      "_scaled_dot_product_flash_attention_backward")):
        if hasattr(aten, cpu) and getattr(aten, gpu) in formulas:
            formulas[getattr(aten, cpu)] = formulas[getattr(aten, gpu)]
    if hasattr(aten, "_grouped_mm") and aten._grouped_mm not in formulas:
        formulas[aten._grouped_mm] = _grouped_mm_flops
    for packet, formula in list(formulas.items()):
        if isinstance(packet, torch._ops.OpOverloadPacket):
            names = [a.name for a in packet.default._schema.arguments]
            causal = names.index("is_causal") if "is_causal" in names else None
            if causal is not None:
                formula = formulas[packet] = _halved_if_causal(formula, causal)
            query = names.index("query") if "query" in names else -1
            if packet.__name__.startswith("_scaled_dot") and names[query:query + 3] == ["query", "key", "value"]:
                formula = formulas[packet] = _grouped_heads(formula, query)
    by_overload = {}
    for packet, formula in formulas.items():
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            by_overload[packet] = formula
            continue
        default = _positional(packet.default)
        for name in packet.overloads():
            overload = getattr(packet, name)
            same = _positional(overload) == default
            by_overload[overload] = formula if same else _default_operands(formula, overload, default)
    return by_overload


def _positional(overload) -> list[str]:
    return [a.name for a in overload._schema.arguments if not a.kwarg_only]


def _default_operands(formula, overload, default: list[str]):
    """`formula` called with its op's default operands, taken from `overload`'s by name: torch's formulas (and
    the wrappers above, which read ``is_causal`` at its default position) take those, then ``out_shape``. An
    overload with another positional argument would pass it in the wrong place: ``mm.dtype``'s and
    ``addmm.dtype_out``'s ``out_dtype`` (torch 2.8 on: a bf16 GEMM into an fp32 output) as ``out_shape`` (torch
    2.13 flop_counter.py), ``_scaled_dot_product_flash_attention.quantized``'s three descales (fp8 attention)
    ahead of ``is_causal``."""
    names = _positional(overload)

    def flops(*args, out_val=None, **kwargs):
        given = dict(zip(names, args)) | kwargs
        operands = []
        for name in default:
            if name not in given:
                break
            operands.append(given.pop(name))
        rest = {k: v for k, v in given.items() if k in default or k not in names}
        return formula(*operands, out_val=out_val, **rest)
    return flops


def _operand_dtype(args, out) -> str:
    """The precision a matmul or attention kernel runs in: its narrowest floating operand's (a bf16 GEMM that
    adds into an fp32 bias or output runs on bf16 tensor cores; fp8 operands with fp32 scales, on fp8's)."""
    floats = [t.dtype for a in args for t in _tensors(a) if t.is_floating_point()]
    dtype = min(floats, key=lambda d: d.itemsize) if floats else out.dtype
    return str(dtype).removeprefix("torch.")


def _grouped_heads(formula, query: int):
    """An SDPA kernel's formula for grouped-query attention: key and value with fewer heads than the query
    (``enable_gqa``; [batch, heads, sequence, dim]), which the GPU kernels take as they are and torch's formulas
    refuse (torch 2.11 flop_counter.py sdpa_flop_count: "query/key/value shapes are incompatible"; seen on an
    H100 under --measure-on cuda, where the CPU's kernel had received them already repeated). Each query head
    attends over its group's key and value: the FLOPs of key and value repeated to the query's heads."""
    def flops(*args, out_val=None, **kwargs):
        q, k, v = args[query], args[query + 1], args[query + 2]
        if q.dim() == 4 and k.dim() == 4 and k.shape[1] != q.shape[1]:
            heads = q.shape[1]
            k, v = (torch.empty((t.shape[0], heads, *t.shape[2:]), device="meta", dtype=t.dtype) for t in (k, v))
            args = (*args[:query + 1], k, v, *args[query + 3:])
        return formula(*args, out_val=out_val, **kwargs)
    return flops


def _grouped_mm_flops(a, b, *args, out_val=None, **kwargs) -> int:
    """``torch._grouped_mm`` (MoE experts over their tokens, grouped by offsets; torch 2.13 has no formula): 2 per
    multiply-add over every row given, padding included (where the offsets end is a value, which a fake tensor
    has not; torchtitan pads each expert's rows to 8, a few hundred rows of tens of thousands). Two 2-D operands
    are a weight gradient, grouped along the contraction ([m, k] x [k, n] in groups of k): 2 m k n; otherwise
    each output element contracts ``a``'s last dimension ([m, k] x [g, k, n], [g, m, k] x [k, n] or batched)."""
    if a.dim() == 2 and b.dim() == 2:
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    return 2 * out_val.numel() * a.shape[-1]


def _halved_if_causal(formula, position: int):
    def flops(*args, out_val=None, **kwargs):
        full = formula(*args, out_val=out_val, **kwargs)
        causal = args[position] if len(args) > position else kwargs.get("is_causal", False)
        return full // 2 if causal else full
    return flops


def _tensors(value):
    """The strided tensors of an op's argument or result, into lists at any depth (cat, foreach ops, c10d's lists
    of lists). A sparse tensor's own storages are its indices' and values'."""
    if isinstance(value, torch.Tensor):
        if value.layout == torch.strided:
            yield value
        elif value.layout == torch.sparse_coo:
            yield value._indices()
            yield value._values()
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def written_positions(func) -> tuple[int, ...]:
    """Positions of the arguments `func` writes in place: an aten op's ``Tensor(a!)`` (an in-place op's self, a
    foreach op's lists); a c10d op's first argument, its output (``allreduce_coalesced_``, ``gather_``,
    ``recv_``: torch 2.13's c10d schemas mark no aliasing, and several return only a Work), but a send's and
    a barrier's, which it reads."""
    found = _WRITTEN.get(func)
    if found is None:
        if func.namespace == "c10d":
            found = () if func._schema.name.split("::")[1] in C10D_READS_ONLY else (0,)
        else:
            found = tuple(i for i, a in enumerate(func._schema.arguments)
                          if a.alias_info is not None and a.alias_info.is_write)
        _WRITTEN[func] = found
    return found


_WRITTEN: dict = {}
C10D_READS_ONLY = frozenset({"send", "barrier", "monitored_barrier_", "check_for_nan"})
"""c10d ops whose first argument is not written (torch 2.13's c10d namespace, read off its schemas)."""

@dataclass
class WorkLog:
    """One rank's work, as written to ``work/rank<R>.json``."""

    rank: int
    items: list = field(default_factory=list)
    """In program order: ``["c", phase, {dtype: matmul FLOPs}, matmul bytes, other ops' bytes, stream]`` (a
    compute segment: the matmuls are timed by their FLOPs (fused attention's keyed ``"<dtype> attention"``), the
    other ops by the bytes they move; with
    ``--measure-on``, a seventh field: the seconds it took on `measured_on`), ``["h", phase, bytes]`` after it
    where ops of the segment ran on the host (their results in the host's memory: the bytes they moved),
    ``["j", stream, other]`` (`stream` waits for the work on `other` so far), ``["e", event, stream]``,
    ``["v", event, stream]`` (an event recorded on a stream, waited for on another), where a stream is 0 for
    the default one and 1, 2, ... for the others in the order they were first used; ``["i", call, stream]``,
    ``["w", call, stream]`` (the call's index in the rank's ledger; the stream it was issued on, first read
    on), ``["s", step]`` (step `step` ended)."""
    peak_bytes: int = 0
    """Most bytes of storage the rank held at once."""
    peak_at: dict = field(default_factory=dict)
    """Where the peak was: ``step``, ``phase``, ``module``, and ``by_phase`` (the live bytes at the peak by
    the phase that made them: ``other`` before the first step holds the model)."""
    uncounted: dict = field(default_factory=dict)
    """Ops that may compute much but have no FLOP formula (their bytes are counted): name -> calls."""
    measured_on: str = ""
    """The device whose clock timed each compute segment (``--measure-on``); empty: none did."""
    reserved_bytes: int = 0
    """Most bytes the CUDA caching allocator would have reserved for those storages (`caching_allocator`)."""
    reserved_at: dict = field(default_factory=dict)
    """Where the reserved bytes peaked (``step``, ``phase``, ``module``) and with which allocator settings
    (``expandable_segments``)."""

    def to_json(self) -> dict:
        return {"rank": self.rank, "items": self.items, "peak_bytes": self.peak_bytes, "peak_at": self.peak_at,
                "uncounted": self.uncounted, "measured_on": self.measured_on, "reserved_bytes": self.reserved_bytes,
                "reserved_at": self.reserved_at}

    @classmethod
    def from_json(cls, doc: dict) -> "WorkLog":
        return cls(doc["rank"], doc["items"], doc["peak_bytes"], doc["peak_at"], doc["uncounted"],
                   doc.get("measured_on", ""), doc.get("reserved_bytes", 0), doc.get("reserved_at", {}))

    @classmethod
    def read(cls, path) -> "WorkLog":
        return cls.from_json(json.loads(path.read_text()))


HEAVY_WITHOUT_FORMULA = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                         "linalg_", "cholesky", "fft_", "_fft", "_fused_moe", "_grouped_mm")
"""Name prefixes of ops torch's registry has no formula for that can still dominate a step: named in the
log's `uncounted` so the forecast can say what its compute misses."""


class WorkCounter:
    """Counts a rank's work as its ops pass the dispatch mode (module doc). `context` is the rank's
    `capture.job_context.JobContext` (phase, module, step); `current_stream()` the stream selected now (None: the
    default one), where the job's streams are known (a fake world's stand-ins, which also call `stream_waits`,
    `event_recorded` and `event_waited`)."""

    def __init__(self, rank: int, context, current_stream=lambda: None, clock=None, on_host=lambda storage: False):
        self.log = WorkLog(rank, measured_on=clock.name() if clock is not None else "")
        self.context = context
        self.current_stream = current_stream
        self.on_host = on_host
        """Whether a storage is in the host's memory, not the GPU's (module doc)."""
        self.clock = clock
        """``--measure-on``'s `capture.segment_clock` clock, or None: each segment's start is marked before its
        first op runs (`enter`), its end where it closes; read at the step's end (`_read_clock`)."""
        self._opened = None  # the open segment's (start mark, stream)
        self._marked: list = []  # (segment item, start, end) not read yet
        self._streams: dict[int, int] = {}  # id(stream) -> its number (0: the default one)
        self._keep: list = []  # the streams and events numbered
        self._events: dict[int, int] = {}
        self._stream = 0  # of the open segment
        self.formulas = _flop_formulas()
        self._phase = None
        self._step = context.step
        self._mm: dict[str, int] = {}  # matmul FLOPs by dtype
        self._mm_bytes = 0  # bytes the matmuls read and wrote
        self._bytes = 0  # bytes the other ops read and wrote
        self._host_bytes = 0  # bytes the host's ops read and wrote
        self._pending: dict[int, list[int]] = {}  # storage key -> calls that wrote it, not yet needed
        self._in_backward: set[int] = set()  # calls issued in backward, not yet needed
        self._unneeded: set[int] = set()  # calls issued this step that nothing has waited for yet
        self._works: dict[int, tuple[object, list[int]]] = {}  # id(Work) -> (it, kept so that no id is reused;
        # the calls it covers) for this step's calls not waited for yet (`work_waited`)
        # storage key -> (torch's weak reference, which keeps the key from being reused while the entry is here;
        # a Python weak reference, whose callback says it died; bytes; phase made in)
        self._live: dict[int, tuple] = {}
        self._died: deque[int] = deque()  # keys of live storages that died since the last `_freed`
        self._live_bytes = 0
        self._by_phase: dict[str, int] = {}  # live bytes by the phase that made them
        # the autograd nodes compiled calls made this step, as [first, end) sequence numbers (`made_nodes`), and
        # the one whose backward is being counted: (its index, its region)
        self._graph_firsts: list[int] = []
        self._graph_ends: list[int] = []
        self._backward: tuple[int, _Region] | None = None
        self.allocator = CachingAllocator(expandable_segments())
        self.log.reserved_at = {"expandable_segments": self.allocator.expandable}

    # -- the hot path: one call per aten op ------------------------------------------------------------
    def op(self, func, args, kwargs, out) -> None:
        """An op that ran (under fake tensors: that ran nothing)."""
        nbytes = self.enter(args)
        if nbytes is not None:
            self.count(func, args, kwargs, out, nbytes)

    def enter(self, args) -> int | None:
        """Before an op runs: end the segment where the step, stream or phase changed or the op reads what a call
        wrote (it must wait for the call), and mark a segment's start; the bytes the op reads, None for an op
        outside the job."""
        if getattr(_outside, "depth", 0):
            if self.clock is not None:
                # a clock's segment ends before work that is not the job's: a fake world's replay (`trace.fake.
                # replay`), whose clones, copies and records would else be timed as the rank's compute. DTensor's
                # propagation, which the job pays for on a GPU too, runs on FakeTensors that `CountingMode` hands
                # on without asking here
                self._close()
            return None
        if self.context.step != self._step:
            self._stepped()
        phase = self.context.phase()
        selected = self.current_stream()
        stream = self._number(selected)
        if stream != self._stream:
            self._close()
            self._stream = stream
        if phase != self._phase:
            self._close()
            if self._phase == "backward" and self._in_backward:
                self._backward_done()
            self._freed()  # what the phase before made and dropped (an optimizer's temporaries) is gone
            self._phase = phase
        pending = self._pending
        nbytes = 0
        for a in args:
            for t in _tensors(a):
                if pending:
                    key = t.untyped_storage()._cdata
                    if key in pending:
                        self._close()
                        calls = pending.pop(key)
                        self.log.items.extend([WAIT, c, stream] for c in calls)
                        self._in_backward.difference_update(calls)
                        self._unneeded.difference_update(calls)
                nbytes += t.nbytes
        if self.clock is not None and self._opened is None:
            self._opened = (self.clock.mark(selected), selected)
        return nbytes

    def count(self, func, args, kwargs, out, nbytes: int) -> None:
        """What the op `enter` saw computed and made (`nbytes`: what it read)."""
        log = self.log
        phase = self._phase
        name = func._overloadpacket.__name__
        results = list(_tensors(out))
        if name in VIEWS or not (func._schema.is_mutable or results):
            return  # a view, or a query (prim::device, is_same_size): nothing moved, nothing made
        if results and all(t.device.type == "meta" for t in results):
            return  # a model built on the meta device (torchtitan's, before it is sharded) holds and moves nothing
        formula = self.formulas.get(func)
        if self._died:  # before its results count: what died since the op before is gone by now
            self._freed()
        on_host = [self._made(t, phase) for t in results]
        nbytes += sum(t.nbytes for t in results)
        if not results:  # an in-place op that returns nothing (foreach, fused optimizers)
            written = [t for i in written_positions(func) if i < len(args) for t in _tensors(args[i])]
            nbytes += sum(t.nbytes for t in written)
            on_host = [self._hosts(t) for t in written]
        if name in ALLOCATIONS:
            nbytes = 0
        if on_host and all(on_host):
            if name in COPIES and any(t.dim() and not self._hosts(t) for a in args for t in _tensors(a)):
                return
            if self._mm or self._bytes:
                self._close()  # the GPU's segment so far ends where the host's work begins
            self._host_bytes += nbytes
            self._opened = None  # no clock over the host's work: the next GPU op's `enter` starts one afresh
            return
        if self._host_bytes:
            self._close_host()
        flops = 0
        if formula is not None:
            flops = formula(*args, **(kwargs or {}), out_val=out)
            dtype = _operand_dtype(args, out)
            if name.startswith(ATTENTION_OPS):
                dtype = f"{dtype} {ATTENTION}"
            self._mm[dtype] = self._mm.get(dtype, 0) + flops
            self._mm_bytes += nbytes
            region = self.region(args)
            if region is not None:
                region.counter = self
                region.keep(args)
        else:
            heavy = name.startswith(HEAVY_WITHOUT_FORMULA)
            if heavy:
                log.uncounted[name] = log.uncounted.get(name, 0) + 1
            region = self.region(args)
            if region is None or heavy or func.namespace != "aten":
                self._bytes += nbytes
                if region is not None:  # an extern kernel of compiled code (sort, a custom op)
                    region.keep(args)
                return
            region.counter = self
            if name in ALLOCATIONS:  # a buffer, moved by nothing yet: written only by what fills it
                for t in results:
                    region.made.setdefault(t.untyped_storage()._cdata, 0)
                return
            for a in args:
                for t in _tensors(a):
                    key = t.untyped_storage()._cdata
                    if key not in region.made:
                        region.read.setdefault((key, t.storage_offset(), t.nbytes), t.nbytes)
            for t in results or [t for i in written_positions(func) if i < len(args) for t in _tensors(args[i])]:
                key = t.untyped_storage()._cdata
                region.made[key] = max(region.made.get(key, 0), t.nbytes)

    def ran_compiled(self, region: _Region, split: bool = False) -> None:
        """The bytes of a compiled region's fused ops (`run_compiled`), into the open segment: what they read from
        before once, and what they wrote that outlives the call (still alive once it returned: its results, in any
        container, what autograd saved for backward, tensors from before written in place) or that a kernel of
        its own reads; `split`, where a segment ends inside the region (`_close`): everything they made so far."""
        if not split:
            self._freed()  # the region's temporaries died when its frame returned
        live = self._live
        written = region.made.keys() if split else \
            region.kept | {k for k in region.made if k in live} | {k for k, _, _ in region.read}
        self._bytes += sum(region.read.values()) + sum(region.made[k] for k in written if k in region.made)

    def calling(self) -> None:
        """A c10d op is about to run: the segment so far ends here, so that what the process group does on the
        stream is in no segment. torch's fake one copies an all-gather's input into every rank's chunk of its
        output (torch 2.13 c10d/FakeProcessGroup.hpp ``_allgather_base``), 1,024 copies a call at world 1,024,
        where NCCL's kernel writes the output and the forecast times the call on its link."""
        self._close()

    def made_nodes(self, first: int, end: int) -> None:
        """A compiled call (`run_compiled`) made the autograd nodes numbered [first, end) on this thread."""
        if end > first:
            self._graph_firsts.append(first)
            self._graph_ends.append(end)

    def region(self, args) -> _Region | None:
        """The compiled region the op being counted (reading `args`) is in: a compiled call's (`run_compiled`),
        else in backward the one of the compiled call whose autograd node is running (`backward_region`, asked
        either way, so that a region whose nodes are done ends before a compiled call's in backward counts)."""
        backward = self.backward_region(args) if self._graph_firsts else None
        forward = getattr(_compiled, "region", None)
        return forward if forward is not None else backward

    def backward_region(self, args=()) -> _Region | None:
        """AOTAutograd compiles a compiled call's backward as one graph, as it does its forward; a fake world runs
        it eagerly, node by node (torch.compiler's force_eager stance). The ops of consecutive nodes of one
        compiled call count as one region (its kernels fused); a node of anything else ends it. A node is the
        call's by the sequence number autograd gave it in forward (`made_nodes`; a node running is
        ``torch._C._current_autograd_node``, torch 2.1 on). A parameter's gradient, which autograd accumulates as
        soon as it is ready, between the call's nodes (an add from the second microbatch on; DDP's copy into its
        bucket in the node's hook), is eager work beside the region, which stays open: what it reads of the
        region's is written out."""
        node = torch._C._current_autograd_node()
        graph = None
        if node is not None:
            number = node._sequence_nr()
            if number == _PARAMETER_NODE:
                if self._backward is not None:
                    self._backward[1].keep_read(args)
                return None
            i = bisect_right(self._graph_firsts, number) - 1
            if i >= 0 and number < self._graph_ends[i]:
                graph = i
        if self._backward is not None and self._backward[0] != graph:
            self.ran_compiled(self._backward[1])
            self._backward = None
        if graph is None:
            return None
        if self._backward is None:
            self._backward = (graph, _Region())
        return self._backward[1]

    def _split_region(self) -> None:
        """A compiled region's fused ops so far end where a segment ends inside it (a collective, a wait for one, a
        stream or phase change), in the segment before: a collective in compiled code splits its kernels, and what
        it reads was written. A compiled call's backward region ends whole where the node running is not one of
        its call's (backward ended, or a node of something else runs)."""
        if self._backward is not None:
            self.backward_region()
        # a backward region's nodes have returned what they made but what is alive (a collective in a parameter's
        # hook, DDP's bucket all-reduce, splits it between nodes): its writes are counted as at its end
        backward = self._backward and self._backward[1]
        for region, split in ((getattr(_compiled, "region", None), True), (backward, False)):
            if region is not None and region.counter is self:
                self.ran_compiled(region, split=split)
                region.read, region.made, region.kept = {}, {}, set()

    def issued(self, call: int, func, args, out) -> None:
        """The rank issued its `call`-th call (c10d op `func`): what it writes is needed where first read."""
        # (also inside `outside_the_job`: a fake world's replay issues the job's calls there, `trace.fake.replay`)
        if self.context.step != self._step:
            self._stepped()
        self._close()
        phase = self.context.phase()  # now, not the last op's: a call right after backward is not backward's
        stream = self._number(self.current_stream())
        self.log.items.append([ISSUE, call, stream])
        # what a call writes: the arguments its schema writes (an all-reduce's tensors, an all-to-all's or a
        # receive's output, a coalesced op's outputs) and its results (a functional collective's)
        written = {t.untyped_storage()._cdata: t for t in (
            *(t for i in written_positions(func) if i < len(args) for t in _tensors(args[i])), *_tensors(out))}
        for key, t in written.items():
            self._pending.setdefault(key, []).append(call)
            self._made(t, phase, stream)
        if written and phase == "backward":
            self._in_backward.add(call)
        self._unneeded.add(call)
        work = work_of(out)
        if work is not None:
            self._works.setdefault(id(work), (work, []))[1].append(call)
        self._freed()

    def work_waited(self, work, stream) -> None:
        """The job waited for `work` on `stream` (the selected one): its calls are needed there, read or not. NCCL's
        ``Work.wait`` makes the current stream wait for the call's kernel (torch 2.13 ProcessGroupNCCL.cpp
        ``WorkNCCL::synchronizeStream``), and c10d waits so for every call not made with ``async_op=True``
        (distributed_c10d.py; `_coalescing_manager` for the coalesced ones: Megatron's distributed optimizer
        all-gathers its parameters so after its step, and reads each model chunk's only when that chunk's forward
        runs). A send, which writes nothing, is needed there too. Reported by the fake world's stand-in
        (`trace.fake.cuda_api.work_waits_watched`), also inside `outside_the_job`: a fake world's replay issues the
        job's calls there, and c10d waits for them there."""
        if self.context.step != self._step:
            self._stepped()
        entry = self._works.pop(id(work), None)
        calls = {c for c in entry[1] if c in self._unneeded} if entry is not None else None
        if calls:
            self._close()
            self._needed(calls, self._number(stream))

    def _backward_done(self) -> None:
        """Autograd finished: a call its backward issued whose result no op has read yet is needed now. DDP and
        FSDP read theirs below Python, in a callback autograd runs at its end (torch 2.13 reducer.cpp
        ``finalize_backward`` copies each bucket into the gradients; FSDP2's ``_root_post_backward_final_callback``
        waits for its reduce-scatters), so the first read a dispatch mode sees would be the optimizer's, or none."""
        self._needed(set(self._in_backward), self._stream)

    def _needed(self, calls: set[int], stream: int) -> None:
        """`stream` needs `calls`' results from here: a wait item for each, and none of them is pending after."""
        self.log.items.extend([WAIT, c, stream] for c in sorted(calls))
        for key in [k for k, pending in self._pending.items() if calls.intersection(pending)]:
            rest = [c for c in self._pending[key] if c not in calls]
            if rest:
                self._pending[key] = rest
            else:
                del self._pending[key]
        self._in_backward.difference_update(calls)
        self._unneeded.difference_update(calls)

    # -- orders between streams (`current_stream`'s stand-ins call these) ---------------------------------
    def stream_waits(self, stream, other) -> None:
        self._close()
        self.log.items.append([STREAM_WAITS, self._number(stream), self._number(other)])

    def event_recorded(self, event, stream) -> None:
        self._close()
        self.log.items.append([RECORDED, self._event(event), self._number(stream)])

    def event_waited(self, event, stream) -> None:
        self._close()
        self.log.items.append([EVENT_WAITED, self._event(event), self._number(stream)])

    def _number(self, stream) -> int:
        """0 for the default stream, 1, 2, ... for the others in the order they were first seen."""
        return 0 if stream is None else self._numbered(self._streams, stream, 1)

    def _event(self, event) -> int:
        return self._numbered(self._events, event, 0)

    def _numbered(self, table: dict, obj, first: int) -> int:
        number = table.get(id(obj))
        if number is None:
            number = table[id(obj)] = len(table) + first
            self._keep.append(obj)  # kept alive, so that no id is reused
        return number

    def _stepped(self) -> None:
        """The job's step moved on since the last op (an optimizer step returned): steps before it ended."""
        self._close()
        self._graph_firsts, self._graph_ends, self._backward = [], [], None  # their backward ran in the step
        self._unneeded, self._works = set(), {}  # a later step's forecast takes them as done
        for step in range(self._step, self.context.step):
            self.log.items.append([STEP, step])
        self._step = self.context.step
        self._read_clock()

    def finish(self) -> WorkLog:
        self._close()
        self._read_clock()
        return self.log

    def _read_clock(self) -> None:
        """Each measured segment's seconds, as its item's last field (read once its step ended: on a GPU this
        waits for the stream to get there)."""
        for item, start, end in self._marked:
            item.append(self.clock.seconds(start, end))
        self._marked = []

    # -- segments and memory -------------------------------------------------------------------------
    def _close(self) -> None:
        """End the compute segment so far (if it did anything), and the host's work in it."""
        self._split_region()
        if self._mm or self._bytes:
            item = [COMPUTE, self._phase or "other", self._mm, self._mm_bytes, self._bytes, self._stream]
            self.log.items.append(item)
            self._mm, self._mm_bytes, self._bytes = {}, 0, 0
            if self._opened is not None:
                start, stream = self._opened
                self._marked.append((item, start, self.clock.mark(stream)))  # on the segment's stream
        self._close_host()
        self._opened = None

    def _close_host(self) -> None:
        """End the host's work so far (if any): a segment of its own, in program order with the GPU's."""
        if self._host_bytes:
            self.log.items.append([HOST_WORK, self._phase or "other", self._host_bytes])
            self._host_bytes = 0

    def _hosts(self, t: torch.Tensor) -> bool:
        """`t`'s storage is the host's: named so, and not counted as the GPU's already."""
        storage = t.untyped_storage()
        return storage._cdata not in self._live and self.on_host(storage)

    def _made(self, t: torch.Tensor, phase: str, stream: int | None = None) -> bool:
        """`t`'s storage, made on `stream` (default: the open segment's, that of the op that made it), counts,
        unless it is the host's: whether it is."""
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live:  # (a key is not reused while its weak reference holds the storage's record)
            return False
        if self.on_host(storage):
            return True
        if self._died:
            self._freed()
        size = storage.nbytes()
        if self.allocator.malloc(key, size, self._stream if stream is None else stream):
            self._reserved(phase)
        # torch keeps a storage's Python object for as long as the storage lives (PyObject preservation, torch
        # >= 2.1 c10/core/impl/PyObjectSlot.h), so a weak reference's callback on it runs when the storage dies:
        # a free costs one append, where polling every live storage's weak reference had cost 11 % of a
        # 1,024-rank FSDP trace (py-spy, 2026-12-07)
        died = self._died
        self._live[key] = (StorageWeakRef(storage), weakref.ref(storage, lambda _, key=key: died.append(key)),
                           size, phase)
        self._live_bytes += size
        self._by_phase[phase] = self._by_phase.get(phase, 0) + size
        self._peaked(phase)
        return False

    def resized(self, key: int, size: int) -> None:
        """Storage `key` was resized in place to `size` bytes (FSDP2 frees and refills its gathered parameters so:
        `trace.fake.storage`); what it holds again counts from now, in the phase it is refilled in."""
        entry = self._live.get(key)
        if entry is None or getattr(_outside, "depth", 0):
            return
        if self._died:
            self._freed()
        pin, ref, old, made = entry
        phase = self._phase or "other"
        if self.allocator.resize(key, size, self._number(self.current_stream())):
            self._reserved(phase)
        self._live[key] = (pin, ref, size, phase)
        self._live_bytes += size - old
        self._by_phase[made] -= old
        self._by_phase[phase] = self._by_phase.get(phase, 0) + size
        if size > old:
            self._peaked(phase)

    def _peaked(self, phase: str) -> None:
        """The live bytes grew: a new peak is recorded, where it is."""
        log = self.log
        if self._live_bytes > log.peak_bytes:
            log.peak_bytes = self._live_bytes
            log.peak_at = {"step": self.context.step, "phase": phase, "module": self.context.region(),
                           "by_phase": dict(self._by_phase)}

    def _reserved(self, phase: str) -> None:
        """The allocator reserved more: a new reserved peak is recorded, where it is."""
        log = self.log
        if self.allocator.reserved > log.reserved_bytes:
            log.reserved_bytes = self.allocator.reserved
            log.reserved_at.update(step=self.context.step, phase=phase, module=self.context.region())

    def _freed(self) -> None:
        """The storages that died since the last call leave the count and the allocator."""
        died = self._died  # (the list the callbacks append to: emptied in place)
        while died:
            key = died.popleft()
            self.allocator.free(key)
            _, _, size, made = self._live.pop(key)
            self._in_backward.difference_update(self._pending.get(key, ()))
            self._live_bytes -= size
            self._by_phase[made] -= size
            self._pending.pop(key, None)


class CountingMode:
    """`WorkCounter` for a rank whose tensors hold data (a fake world without ``--fake-tensors``: value-dependent
    routing, MoE): a dispatch mode that counts every aten op as `ModeRecorder` does under fake tensors, while the
    dispatcher's recorder (`Recorder`, the Python kernel: its calls are numbered in Python) records the calls
    below it. A c10d op is the call or calls `issued_so_far()` grew by while it ran. Built on first use, so that
    this module imports no dispatch-mode machinery where nothing counts."""

    def __new__(cls, counter: WorkCounter, issued_so_far):
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils._python_dispatch import TorchDispatchMode

        class Counting(TorchDispatchMode):
            supports_higher_order_operators = True

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if any(t not in (torch.Tensor, torch.nn.Parameter) for t in types):
                    if any(issubclass(t, FakeTensor) for t in types):
                        # DTensor's sharding propagation on fake tensors of its own (`outside_the_job`): torch's
                        # bookkeeping, run by FakeTensor's handler, which defers to a mode above it
                        return func(*args, **(kwargs or {}))
                    return NotImplemented  # a subclass (DTensor) desugars first; its ops come back here
                if func.namespace.startswith("c10d") or func.namespace.startswith("_c10d_functional"):
                    counter.calling()
                    before = issued_so_far()
                    out = func(*args, **(kwargs or {}))
                    issued = range(before, issued_so_far())
                    for call in issued:
                        counter.issued(call, func, args, out)
                    if not issued:  # wait_tensor: where the job needs a functional collective's result
                        counter.op(func, args, kwargs, out)
                    return out
                nbytes = counter.enter(args)  # before it runs: a measured segment starts before its first op
                out = func(*args, **(kwargs or {}))
                if nbytes is not None:
                    counter.count(func, args, kwargs, out, nbytes)
                return out

        return Counting()
