"""torch.cuda and torch.accelerator answered, in a fake world without CUDA, as one GPU per local rank.

A script written for GPUs asks torch.cuda what it has before it uses it, and so does torch: its
optimizers ask ``torch.accelerator`` for the current stream before every step (torch 2.13
optim/optimizer.py:463), DataLoader whether to pin memory, FSDP2 and DDP for streams to wait on,
Lightning's DDP builds its DDP inside ``torch.cuda.stream(torch.cuda.Stream())``
(lightning/pytorch/strategies/ddp.py:194). So both APIs answer alike, on a CPU build of torch (which
has no accelerator) and on a CUDA build with no GPU (where ``torch.accelerator`` names CUDA and asks
``torch.cuda.is_available``):

- ``is_available()`` yes (the script takes its GPU path, the one it will run), ``device_count()`` the
  node's ``LOCAL_WORLD_SIZE``, ``current_device()`` / ``current_device_index()`` the ``LOCAL_RANK``,
  ``current_accelerator()`` ``cuda``; ``set_device``, ``synchronize``, ``empty_cache``, seeding and
  ``set_rng_state`` do nothing; ``get_rng_state`` is the CPU generator's (``torch.random.fork_rng``);
- streams and events are CPU stand-ins that do nothing (`Stream`, `Event`: ``torch.Stream`` and
  ``torch.Event`` of the CPU, so torch.compile's stream tracking takes them), and an event's
  ``elapsed_time`` is the wall time between its records (a CPU's work is done when it returns);
  Dynamo's current stream is the answered one (`dynamo_current_stream`); ``CUDAGraph`` refuses in
  one line (a graph replays GPU kernels, which the CPU cannot; torchtitan 0.3.0 captures its step in
  one unless ``--training.disable-cuda-graphs``);
- the device's name, properties, capability, free memory and memory statistics are the stand-in
  GPU's (`gpu`, ``--fake-device``); NVTX ranges do nothing.

Each answer replaces a function of these packages wherever it is bound: torch.cuda re-exports its
submodules' functions (``torch.cuda.get_rng_state`` is ``torch.cuda.random.get_rng_state``), and a
library may have imported one by name (``rebind``), so the table names each function once and every
alias is found by walking the loaded modules. What is left of torch.cuda needs a real device: every
other public function of its modules is wrapped so that a failure for want of one (a CPU build's
missing ``torch._C._cuda_*`` binding, "not compiled with CUDA", no GPU) raises `devices.Unmapped`,
one line naming the call and the script's line; so do ``_lazy_init``, torch.cuda's gate before it
touches a device, and the placeholder classes a CPU build has for CUDA's C++ types (``CUDAGraph``,
``MemPool``: ``torch._utils._dummy_type``).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from types import FunctionType

from ..entry_points import rebind, resolve
from . import gpu
from .cuda_tensors import local_rank
from .devices import mark, unmapped, used

PACKAGES = ("torch.cuda", "torch.accelerator")


class StreamWatch:
    """What the stand-in streams tell a listener (``--work``'s `capture.work.WorkCounter`): which stream is
    selected, and each order the script puts between streams (``wait_stream``, an event recorded on one and
    waited for on another). On a CPU they order nothing; on a GPU they are what lets FSDP2's all-gathers run
    beside compute (its copy-in and all-gather streams, torch 2.13 distributed/fsdp/_fully_shard/
    _fsdp_collectives.py), so a forecast of the GPU's timeline follows them. The default stream is None."""

    listener = None
    selected: list = []  # the stand-in's stack of selected streams (`_kinds`' ``current``)
    default = None

    @classmethod
    def current(cls):
        top = cls.selected[-1] if cls.selected else None
        if top is None or top is cls.default:
            import torch.cpu

            top = torch.cpu.current_stream()  # a CPU mesh's job (below)
        return cls.key(top)

    @classmethod
    def key(cls, stream):
        import torch.cpu

        return None if stream is None or stream is cls.default or stream is torch.cpu._default_cpu_stream else stream


def _cuda_current():
    """`StreamWatch.current` on a real GPU (``--measure-on cuda``): the selected torch.cuda stream, None for the
    default one, one object per CUDA stream (torch makes a new Python object per query)."""
    import torch

    stream = torch.cuda.current_stream()
    return _cuda_key(stream)


_CUDA_STREAMS: dict = {}


def _cuda_key(stream):
    import torch

    if stream is None:
        return None
    handle = stream.cuda_stream
    if handle == torch.cuda.default_stream(stream.device).cuda_stream:
        return None
    return _CUDA_STREAMS.setdefault(handle, stream)


@functools.cache
def cuda_streams_watched() -> None:
    """torch.cuda's streams and events report to `StreamWatch`, then do what they were asked (``--measure-on
    cuda``: the ranks' kernels run on this host's GPU, each segment timed on its own stream,
    `capture.segment_clock`); `StreamWatch.current` reads the stream torch.cuda has selected."""
    import torch

    StreamWatch.current = staticmethod(_cuda_current)
    _watch(torch.cuda.Stream, torch.cuda.Event, _cuda_key, _cuda_current)


def _watch(stream, event, key, current) -> None:
    """`stream`'s and `event`'s methods that order streams report each order to `StreamWatch.listener` (where
    there is one), the streams named by `key` (None: the default one), then do what they were asked; an event
    recorded on a stream is the one its method returned, or where that is None (torch.cpu's) a new `event`: the
    job may ask it what an event answers (FSDP2 with CPU offload ``synchronize()``s the event its gradients' copy to
    the host recorded, torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param_group.py ``finalize_backward``)."""
    wait_stream, record_event, wait_event = stream.wait_stream, stream.record_event, stream.wait_event
    record, wait, new_event = event.record, event.wait, event

    def watched_wait_stream(self, other) -> None:
        if StreamWatch.listener is not None:
            StreamWatch.listener.stream_waits(key(self), key(other))
        return wait_stream(self, other)

    def watched_record_event(self, event=None):
        recorded = record_event(self) if event is None else record_event(self, event)  # torch.cpu's takes none
        if StreamWatch.listener is None:
            return recorded
        recorded = recorded if recorded is not None else event if event is not None else new_event()
        StreamWatch.listener.event_recorded(recorded, key(self))
        return recorded

    def watched_wait_event(self, waited) -> None:
        if StreamWatch.listener is not None and waited is not None:
            StreamWatch.listener.event_waited(waited, key(self))
        return wait_event(self, waited)

    def watched_record(self, on=None) -> None:
        if StreamWatch.listener is not None:
            StreamWatch.listener.event_recorded(self, key(on) if on is not None else current())
        return record(self, on)

    def watched_wait(self, on=None) -> None:
        if StreamWatch.listener is not None:
            StreamWatch.listener.event_waited(self, key(on) if on is not None else current())
        return wait(self, on)

    stream.wait_stream, stream.record_event, stream.wait_event = (watched_wait_stream, watched_record_event,
                                                                  watched_wait_event)
    event.record, event.wait = watched_record, watched_wait


@functools.cache
def cpu_streams_watched() -> None:
    """torch.cpu's streams report to `StreamWatch` as the CUDA stand-ins do. A fake world's DeviceMesh for CUDA is
    a CPU mesh, so FSDP2 takes its device, and its streams, from torch.cpu (torch 2.13 distributed/fsdp/
    _fully_shard/_fsdp_init.py ``_get_device_from_mesh``; _fsdp_param_group.py ``lazy_init``), whose
    ``Stream`` and ``Event`` do nothing and whose ``record_event`` returns None (torch/cpu/__init__.py). Without a listener
    they behave as before; with one, each order FSDP2 puts between its copy-in, all-gather, reduce-scatter
    streams and the default one is reported, and ``record_event`` returns an event to wait for."""
    import torch.cpu

    # FSDP2 also records events by themselves (``device_handle.Event().record()``, _fsdp_param_group.py:473, 505);
    # torch.cpu's methods do nothing, so doing them after the report changes nothing
    _watch(torch.cpu.Stream, torch.cpu.Event, StreamWatch.key, lambda: StreamWatch.current())


@functools.cache
def work_waits_watched() -> None:
    """A Work's ``wait`` reports to `StreamWatch.listener` which stream waits for the call (the one selected),
    then waits. On a GPU that is where the stream needs the call, whether or not it reads its output yet (NCCL's
    ``WorkNCCL::wait``, torch 2.13 ProcessGroupNCCL.cpp); c10d calls it for every call not made with
    ``async_op=True``. Each Work type torch binds with its own ``wait`` is wrapped (the fake backend's
    ``FakeWork``); a subclass defined in Python is the job's own."""
    from torch._C import _distributed_c10d as c10d

    for kind in (c10d.Work, *c10d.Work.__subclasses__()):
        if "wait" in kind.__dict__ and not isinstance(kind.__dict__["wait"], FunctionType):
            _watch_work(kind)


def _watch_work(kind) -> None:
    wait = kind.wait

    def watched_wait(self, *args, **kwargs):
        if StreamWatch.listener is not None:
            StreamWatch.listener.work_waited(self, StreamWatch.current())
        return wait(self, *args, **kwargs)

    kind.wait = watched_wait


def local_world() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


_CUDA = {
    "is_available": "yes", "device_count": "local_world", "current_device": "local_rank", "set_device": "nothing",
    "synchronize": "nothing", "empty_cache": "nothing", "ipc_collect": "nothing", "init": "nothing",
    "_exchange_device": "local_rank", "_maybe_exchange_device": "local_rank",  # torch.cuda.device(i), device_of
    "manual_seed": "nothing", "manual_seed_all": "nothing", "seed": "nothing", "seed_all": "nothing",
    "get_rng_state": "rng_state", "get_rng_state_all": "rng_state_all",
    "set_rng_state": "nothing", "set_rng_state_all": "nothing",  # fork_rng's restore: no CUDA generator to set
    "is_current_stream_capturing": "no",  # asked of a CUDA build before every optimizer step (torch 2.11)
    # DDP checks it before it takes bf16_compress_hook (torch 2.13 nn/parallel/distributed.py _check_comm_hook)
    "nccl.version": "nccl_version",
    "Stream": "Stream", "Event": "Event", "current_stream": "current_stream", "default_stream": "default_stream",
    "set_stream": "set_stream", "stream": "stream", "ExternalStream": "ExternalStream",  # a real CUDA stream's
    "CUDAGraph": "CUDAGraph",  # a CUDA build's reaches the device in C++, without a torch.cuda frame to name
    "nvtx.range_push": "zero", "nvtx.range_pop": "zero", "nvtx.range_start": "zero", "nvtx.range_end": "nothing",
    "nvtx.mark": "nothing",
    "get_device_name": "gpu.name", "get_device_properties": "gpu.properties",
    "get_device_capability": "gpu.capability", "mem_get_info": "gpu.mem_get_info", "memory_stats": "gpu.memory_stats",
    "memory_stats_as_nested_dict": "gpu.memory_stats_nested",
    **{f: "gpu.zero" for f in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                               "memory_cached", "max_memory_cached")},
    **{f: "gpu.nothing" for f in ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
                                  "reset_accumulated_memory_stats")},
}
_ACCELERATOR = {
    "is_available": "yes", "device_count": "local_world", "current_accelerator": "cuda",
    "current_device_index": "local_rank", "set_device_index": "nothing", "device_index": "device_index",
    "current_device_idx": "local_rank", "set_device_idx": "nothing",  # deprecated, wrapping the two before
    "synchronize": "nothing", "current_stream": "current_stream", "set_stream": "set_stream",
    "empty_cache": "nothing",
    "memory_stats": "gpu.memory_stats", "get_memory_info": "gpu.mem_get_info",
    **{f: "gpu.zero" for f in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")},
    **{f: "gpu.nothing" for f in ("reset_peak_memory_stats", "reset_accumulated_memory_stats")},
}
NCCL_VERSION = (2, 27, 5)
"""What ``torch.cuda.nccl.version()`` answers: the NCCL release PyTorch's CI builds against
(.ci/docker/ci_commit_pins/nccl-cu12.txt, v2.27.5-1 at pytorch/pytorch 06b24a9)."""
_SHOWN = {"torch.cuda._exchange_device": "torch.cuda.device", "torch.cuda._maybe_exchange_device": "torch.cuda.device"}
"""Private answers, named in the note by what the script called."""
ANSWERS = {**{f"torch.cuda.{name}": kind for name, kind in _CUDA.items()},
           **{f"torch.accelerator.{name}": kind for name, kind in _ACCELERATOR.items()}}
"""Dotted torch name -> what answers it (`_kinds`); a ``gpu.`` answer is the stand-in GPU's, named in
`gpu.answered`, the others in `devices.used`. `patches` lists these names as the row's targets."""


def _kinds() -> dict[str, object]:
    """What answers each kind of `ANSWERS`."""
    import torch

    current: list = []  # the selected stream (one CPU "device"); empty: the default one

    class Stream(torch.Stream):
        """torch.cuda.Stream on the CPU: work is done when it returns, so there is nothing to wait for."""

        def __new__(cls, device=None, priority=0, **kwargs):
            mark("torch.cuda.Stream")
            return super().__new__(cls, device="cpu", priority=priority)

        cuda_stream = 0

        def wait_stream(self, stream) -> None:
            if StreamWatch.listener is not None:
                StreamWatch.listener.stream_waits(StreamWatch.key(self), StreamWatch.key(stream))

        def wait_event(self, event) -> None:
            if StreamWatch.listener is not None:
                StreamWatch.listener.event_waited(event, StreamWatch.key(self))

        def record_event(self, event=None):
            event = event if event is not None else Event()
            event.record(self)
            return event

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

        def is_capturing(self) -> bool:
            return False

        def __enter__(self):
            current.append(self)
            return self

        def __exit__(self, *exc) -> None:
            current.pop()

    class Event(torch.Event):
        """torch.cuda.Event on the CPU: recorded at the wall time of its record."""

        def __new__(cls, enable_timing=False, blocking=False, interprocess=False, **kwargs):
            mark("torch.cuda.Event")
            return super().__new__(cls, device="cpu")

        def __init__(self, *args, **kwargs):
            self.at = None

        def record(self, stream=None) -> None:
            self.at = time.perf_counter()
            if StreamWatch.listener is not None:
                StreamWatch.listener.event_recorded(self, StreamWatch.key(stream) if stream is not None
                                                    else StreamWatch.current())

        def wait(self, stream=None) -> None:
            if StreamWatch.listener is not None:
                StreamWatch.listener.event_waited(self, StreamWatch.key(stream) if stream is not None
                                                  else StreamWatch.current())

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end) -> float:
            return (end.at - self.at) * 1e3

    default = torch.Stream.__new__(Stream, device="cpu")  # torch's own, not the script's: not marked
    StreamWatch.selected, StreamWatch.default = current, default

    class stream:  # torch.cuda.stream(s): the context manager that selects `s`
        def __init__(self, selected):
            mark("torch.cuda.stream")
            self.selected = selected

        def __enter__(self):
            if self.selected is not None:
                current.append(self.selected)

        def __exit__(self, *exc) -> None:
            if self.selected is not None:
                current.pop()

    class device_index:  # torch.accelerator.device_index(i): set_device does nothing
        def __init__(self, device, /):
            mark("torch.accelerator.device_index")

        def __enter__(self):
            return None

        def __exit__(self, *exc) -> None:
            pass

    class ExternalStream:  # wraps a stream a library made on a real device
        def __new__(cls, *args, **kwargs):
            raise unmapped("torch.cuda.ExternalStream")

    class CUDAGraph:  # captures and replays GPU kernels: nothing of it runs on the CPU
        def __new__(cls, *args, **kwargs):
            raise unmapped("torch.cuda.CUDAGraph")

    def set_stream(selected) -> None:
        current[:] = [selected]

    cpu_state = torch.get_rng_state
    return {
        "yes": lambda *a, **k: True, "no": lambda *a, **k: False, "nothing": gpu.nothing, "zero": gpu.zero,
        "nccl_version": lambda: NCCL_VERSION,
        "local_world": lambda: local_world(), "local_rank": lambda *a, **k: local_rank(),
        "cuda": lambda check_available=False: torch.device("cuda"),
        "rng_state": lambda *a, **k: cpu_state(), "rng_state_all": lambda: [cpu_state()] * local_world(),
        "Stream": Stream, "Event": Event, "stream": stream, "device_index": device_index,
        "ExternalStream": ExternalStream, "CUDAGraph": CUDAGraph, "set_stream": set_stream,
        "current_stream": lambda device=None: current[-1] if current else default,
        "default_stream": lambda device=None: default,
        **{f"gpu.{f}": getattr(gpu, f) for f in ("name", "properties", "capability", "mem_get_info", "memory_stats",
                                                  "memory_stats_nested", "zero", "nothing")},
    }


def _modules():
    """The loaded public modules of torch.cuda and torch.accelerator (not ``torch.cuda._memory_viz``)."""
    for name, module in list(sys.modules.items()):
        if any(name == p or name.startswith(p + ".") for p in PACKAGES) and module is not None and not any(
                part.startswith("_") for part in name.split(".")[1:]):
            yield module


def _replacer(modules):
    """``replace(original, replacement)``: `original` replaced wherever it is bound, every module for a
    function (``rebind``), every one of `modules` for anything else (a class, a cached function)."""
    bound: dict[int, list[tuple[object, str]]] = {}
    for module in modules:
        for attr, value in vars(module).items():
            bound.setdefault(id(value), []).append((module, attr))

    def replace(original, replacement) -> None:
        if type(original) is FunctionType:
            rebind(original, replacement)
        for module, attr in bound.get(id(original), ()):
            if vars(module).get(attr) is original:
                setattr(module, attr, replacement)
    return replace


def _short(name: str, obj) -> str:
    """``torch.cuda.random.get_rng_state`` as ``torch.cuda.get_rng_state`` when the package re-exports it."""
    package = ".".join(name.split(".")[:2])
    attr = name.rsplit(".", 1)[-1]
    return f"{package}.{attr}" if getattr(sys.modules.get(package), attr, None) is obj else name


@functools.cache  # each installer once per process: the fork server installs it before it forks the ranks
def answer_torch_cuda() -> None:
    kinds = _kinds()
    modules = list(_modules())
    replace = _replacer(modules)
    done: set[int] = set()  # originals and their replacements, each handled once
    for target, kind in ANSWERS.items():
        original = resolve(target)
        answer = kinds[kind]
        if not isinstance(answer, type):
            shown = _SHOWN.get(target) or _short(target, original)
            answer = _recorded(shown, answer, gpu.answered if kind.startswith("gpu.") else used)
        done |= {id(original), id(answer)}
        replace(original, answer)
    for module in modules:
        for attr, value in list(vars(module).items()):
            if attr.startswith("_") or isinstance(value, type) or id(value) in done:
                continue
            if (type(value) is FunctionType or hasattr(value, "__wrapped__")) and str(
                    getattr(value, "__module__", "")).startswith(PACKAGES):
                wrapped = _needs_device(_short(f"{module.__name__}.{attr}", value), value)
                done |= {id(value), id(wrapped)}
                replace(value, wrapped)


def _recorded(name: str, answer, record: list[str]):
    @functools.wraps(answer)
    def call(*args, **kwargs):
        mark(name, record)
        return answer(*args, **kwargs)
    return call


def _needs_device(name: str, original):
    """`original`, with a failure for want of a device turned into one line naming the call."""
    import torch

    @functools.wraps(original)
    def call(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except AttributeError as exc:
            if getattr(exc, "obj", None) is not torch._C:  # not a CPU build's missing binding
                raise
            raise unmapped(name) from None
        except (RuntimeError, AssertionError, ImportError):  # Unmapped too: the outermost call is named
            raise unmapped(name) from None
    return call


@functools.cache
def dynamo_current_stream() -> None:
    """Dynamo's current stream is the answered one. Every Dynamo trace registers
    ``torch.accelerator.current_stream()`` (the CPU stand-in here) and the compiled code fetches it
    again by its device through ``torch._dynamo.utils.get_current_stream``, also bound by name in
    ``torch._dynamo.guards`` (torch 2.15 _dynamo/variables/streams.py SymbolicStreamState). At torch
    2.13 that is a Python function asking ``torch.accelerator``, which the answers already reach; at
    2.15 it is C++ (``torch._C._dynamo.utils``), which on a CUDA build without a GPU refuses the CPU
    stand-in's device: "cpu doesn't match the current accelerator cuda" at the first compiled call
    (torchtitan 0.3.0's compiled ``create_block_mask``)."""
    import torch
    from torch._dynamo import guards, utils

    def get_current_stream(device):
        return torch.accelerator.current_stream(device)

    for module in (utils, guards):
        module.get_current_stream = get_current_stream


@functools.cache
def unmapped_lazy_init() -> None:
    """torch.cuda's own gate before it touches a device, and a CPU build's placeholders for CUDA's C++
    types: the call named instead of 'not compiled' or 'dummy base class'."""
    import torch

    lazy_init = torch.cuda._lazy_init

    def unmapped_init(*args, **kwargs):
        try:
            lazy_init(*args, **kwargs)
        except (AssertionError, RuntimeError):
            raise unmapped() from None

    rebind(lazy_init, unmapped_init)  # torch.cuda.random and others import it by name

    def refuse(cls, *args, **kwargs):
        raise unmapped(fallback=f"torch.cuda.{cls.__name__}")

    for value in list(vars(torch._C).values()):
        new = vars(value).get("__new__") if isinstance(value, type) else None  # a staticmethod
        if getattr(getattr(new, "__func__", None), "__qualname__", "").startswith("_dummy_type."):  # torch/_utils.py
            value.__new__ = refuse
