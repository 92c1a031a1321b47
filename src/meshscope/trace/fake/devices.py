"""CUDA devices mapped to the CPU in a fake world's rank on a machine without CUDA.

Users' scripts are written for GPUs: ``torch.cuda.set_device(local_rank)``, ``.cuda()``,
``model.to(local_rank)``, ``torch.zeros(..., device=torch.cuda.current_device())`` (135 places in
megatron-core 0.16.1), ``init_device_mesh("cuda", ...)``, ``DDP(..., device_ids=[local_rank])``,
``torch.load(..., map_location="cuda:1")``. A fake world exists to run such a script before a GPU is
booked, so on a machine without CUDA (a CPU build of torch, or a CUDA build with no GPU) every CUDA
device becomes the CPU (a fake world's collectives move no data, so nothing depends on where a
tensor lives). torch.cuda and torch.accelerator answer as one GPU per local rank (`cuda_api`); here:

- a TorchFunctionMode rewrites every CUDA device argument of every torch call to the CPU: a
  ``device=`` of a factory or ``.to``, ``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 1)`` or an
  ordinal (``1``: what torch makes of one on a CUDA build, a CUDA device), ``Tensor.to(1)``,
  ``Tensor.cuda()``; ``torch.device(1)`` is ``cuda:1``, as on a CUDA build (the script's device objects
  stay what it wrote; its tensors move). The mode is the one place that sees calls made inside torch's
  own parallel APIs too, which patching the methods one by one would miss;
- the mode also covers what autograd runs: a TorchFunctionMode is popped while its own
  ``__torch_function__`` runs, so everything inside ``loss.backward()`` (a custom
  ``Function.backward`` allocating ``device=torch.cuda.current_device()``: Megatron's
  tensor_parallel/layers.py:551; tensor hooks) ran without it, on the thread that called backward
  (measured: torch 2.13, the mode stack is empty in a CPU graph's backward). Autograd's engine runs
  every graph with the thread-local state it captured when it started, so the mode is pushed around
  that start (``torch.autograd.graph._engine_run_backward``): every backward function sees it, on
  whichever thread the engine runs it;
- ``Module.to(1)`` parses its arguments in C++ (``torch._C._nn._parse_to``), below the mode: an
  ordinal there is read as ``cuda:1``, and the mode moves the tensors;
- checkpoints load on the CPU: a deserializer registered before CUDA's
  (``torch.serialization.register_package``, torch's hook for devices) keeps every storage tagged or
  mapped to ``cuda`` (``map_location="cuda:2"``, ``torch.device("cuda", 2)``, a dict to ``cuda:N``, or
  a checkpoint saved on a GPU) on the CPU. torch itself refuses an int ``map_location`` (it is taken
  for a callable: "'int' object is not callable", serialization.py:1956), on a GPU too, so that is
  left as it is;
- pinned memory, which needs an accelerator's allocator: ``Tensor.pin_memory()`` (DataLoader's
  ``pin_memory=True``, in its pinning thread too) returns the tensor itself and factories'
  ``pin_memory=True`` is dropped;
- ``Tensor.record_stream(stream)``, which tells CUDA's caching allocator that a side stream still uses
  a tensor (DeepSpeed 0.19.8's ZeRO-1/2 with ``overlap_comm`` on every reduced bucket,
  runtime/zero/stage_1_and_2.py:1531, and ZeRO-3 on every gathered parameter,
  runtime/zero/partition_parameters.py:327): the CPU has no kernel for it (``aten::record_stream``),
  so one that does nothing is registered for the CPU at the dispatcher, for every caller on every
  thread and under ``--fake-tensors`` alike: the CPU's memory is not given back early, and a fake
  world's streams order nothing;
- ``rms_norm`` as CUDA's fused kernel (`fused_rms_norm`);
- ``torch.histc`` of integers (MoE routers count their tokens per expert so), which CUDA's kernel takes and
  the CPU's refuses: counted as float64 and returned in their dtype;
- a script's own triton kernels run in triton's interpreter (``TRITON_INTERPRET``), on the CPU;
- ``torch.distributed._shard`` placements (``ShardMetadata(placement="rank:0/cuda:0")``, TorchRec's
  sharded tables): `placements`;
- a ``DeviceMesh`` of type ``cuda`` (``init_device_mesh("cuda", ...)``) is built as a CPU mesh, so
  FSDP2 and DTensor on it take their CPU path (no CUDA streams);
- DDP is built without ``device_ids`` / ``output_device`` (which it accepts only for GPU modules);
  ``init_process_group``'s ``device_id`` is already dropped by the fake backend (`backend`);
- what the script put on a GPU, and whatever any torch call made of it, is marked as standing for a
  CUDA tensor, and answers ``device``, ``is_cuda``, ``type()`` as a GPU's (`cuda_tensors`):
  megatron-core 0.16.1 asserts ``param.grad.type() == 'torch.cuda.FloatTensor'`` when it clips, by default.

Not mapped: a thread the script starts itself does not have the mode (a TorchFunctionMode is
thread-local), so what it makes of a GPU's tensors reads as the host's, as does a tensor torch makes in
C++ and hands to the script without a torch call (DDP's bucket in a comm hook, the gradient a tensor hook
gets); a check of its type fails with one line saying so (`explain`).

`used` names what was mapped, for the result's note. Each installer is a row of `patches.PATCHES`,
applied only where torch has no CUDA (`needed`).
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

from ..entry_points import rebind
from ..script_frames import is_library, place
from . import cuda_tensors
from .cuda_tensors import is_cuda, is_ordinal

used: list[str] = []
"""The CUDA calls this rank mapped to the CPU, each named once, in the order first met."""


class Unmapped(RuntimeError):
    """A CUDA call the device map cannot run on the CPU."""


def mark(name: str, record: list[str] = used) -> None:
    if name not in record:
        record.append(name)


@functools.cache  # asked once, before the patches make torch.cuda say yes
def needed() -> bool:
    """Whether CUDA must be mapped: torch has none here (a CPU build, or a CUDA build with no GPU)."""
    import torch

    return not torch.cuda.is_available()


def unmapped(name: str | None = None, fallback: str = "a CUDA call") -> Unmapped:
    frames, frame = [], sys._getframe(1)
    while frame is not None:
        frames.insert(0, frame)
        frame = frame.f_back
    return Unmapped(_needs_device(frames, name, fallback))


def _needs_device(frames, name: str | None, fallback: str) -> str:
    """'torch.cuda.Stream at train.py:12 needs a CUDA device, ...': the torch.cuda call the script made
    (`name`, else the outermost torch.cuda or torch.accelerator frame of `frames`, outermost first, else
    `fallback`), and the script's innermost line."""
    inside = [f for f in frames if any(f"{os.sep}torch{os.sep}{p}{os.sep}" in f.f_code.co_filename
                                       for p in ("cuda", "accelerator"))]
    if name is None and inside:  # the outermost: what the script (or its library) called
        code = inside[0].f_code
        package = "accelerator" if f"{os.sep}accelerator{os.sep}" in code.co_filename else "cuda"
        name = f"torch.{package}.{code.co_qualname.removesuffix('.__new__').removesuffix('.__init__')}"
    own = [f for f in frames if not is_library(f.f_code.co_filename)]
    name = name or fallback
    where = f"{name} at {os.path.basename(own[-1].f_code.co_filename)}:{own[-1].f_lineno}" if own else name
    return (f"{where} needs a CUDA device, which meshscope's fake world cannot map to the CPU (it maps devices, "
            f".cuda(), set_device, streams, device queries, init_device_mesh, device_ids)")


NO_GPU = ("No CUDA GPUs are available", "no CUDA-capable device is detected", "Found no NVIDIA driver",
          "CUDA driver version is insufficient for CUDA runtime version")
"""What a CUDA build without a GPU says where a call needs one (torch 2.11, the device machine with
CUDA_VISIBLE_DEVICES empty; torch 2.15+cu132 on a machine with no NVIDIA driver installed, the last):
a class of torch.cuda reaches the device in C++."""


def explain(exc: BaseException) -> str | None:
    """One line for what a fake world cannot answer: a check of a CUDA tensor type (``Tensor.type()``),
    or a call that reached a CUDA build's device (`NO_GPU`) past the wrappers of `cuda_api`."""
    import traceback

    if isinstance(exc, RuntimeError) and any(text in str(exc) for text in NO_GPU):
        frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]  # outermost first
        return f"{Unmapped.__name__}: {_needs_device(frames, None, 'a CUDA call')}"
    frames = traceback.extract_tb(exc.__traceback__)
    line = frames[-1].line if frames else ""
    if not isinstance(exc, AssertionError) or "torch.cuda." not in (line or "") or ".type()" not in line:
        return None
    return (f"the script checks for a CUDA tensor type at {os.path.basename(place(frames[-1]))} ({line}), of a tensor "
            f"the fake world could not tell stands for a CUDA one: made in a thread the script started, or by torch in "
            f"C++ and handed over without a torch call (DDP's bucket in a comm hook); skip that check in a fake world")


@functools.cache
def cpu_device_mesh() -> None:
    """A CUDA mesh is built as a CPU one (init_device_mesh builds its mesh through this constructor), its
    device type the CPU that stands for the GPU (`cuda_tensors.MeshCpu`)."""
    from torch.distributed import device_mesh

    original = device_mesh.DeviceMesh.__init__

    def init(mesh, device_type, *args, **kwargs):
        if is_cuda(device_type):
            mark("DeviceMesh('cuda')")
            device_type = cuda_tensors.MeshCpu("cpu")
        original(mesh, device_type, *args, **kwargs)

    device_mesh.DeviceMesh.__init__ = init


@functools.cache
def ddp_without_device_ids() -> None:
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    def init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None or output_device is not None:
            mark("DDP device_ids")
        original(self, module, None, None, *args, **kwargs)

    DistributedDataParallel.__init__ = init


@functools.cache
def cpu_devices() -> None:
    """For the rest of the process (the script runs inside it): the mode, and autograd's runs inside it."""
    import torch
    from torch.autograd import graph
    from torch.overrides import _get_current_function_mode_stack

    mode = _cpu_devices()
    mode.__enter__()
    run_backward = graph._engine_run_backward

    def engine_run_backward(*args, **kwargs):
        """The engine captures the thread-local state here, which it gives every backward function; those
        are the script's code (its hooks, its autograd Functions), which sees CUDA tensors answer as such."""
        if mode in _get_current_function_mode_stack():
            return cuda_tensors.run(run_backward, args, kwargs, depth=0)
        with mode:
            return cuda_tensors.run(run_backward, args, kwargs, depth=0)

    rebind(run_backward, engine_run_backward)  # torch.autograd imports it by name
    parse_to = torch._C._nn._parse_to

    def parse_ordinal(*args, **kwargs):
        """Module.to(1): the C++ parser reads an ordinal without asking the mode."""
        if args and is_ordinal(args[0]):
            mark(".to(ordinal)")
            args = (torch.device("cuda", args[0]), *args[1:])
        if is_ordinal(kwargs.get("device")):
            mark(".to(ordinal)")
            kwargs = {**kwargs, "device": torch.device("cuda", kwargs["device"])}
        return parse_to(*args, **kwargs)

    torch._C._nn._parse_to = parse_ordinal
    mode.parsers += (parse_ordinal,)
    cuda_tensors.compiled_regions()


def _cpu_devices():
    """The TorchFunctionMode: every CUDA device argument of a torch call becomes the CPU, an ordinal a
    CUDA device first, and ``Tensor.cuda()`` a copy to the CPU; the results are marked as standing for
    CUDA tensors where the call put them on a GPU or made them from such tensors, and marked tensors
    answer ``device``, ``is_cuda``, ``type()`` as a GPU's (`cuda_tensors`)."""
    import torch
    from torch.overrides import TorchFunctionMode

    cpu, compiling = torch.device("cpu"), torch.compiler.is_compiling
    to, tensor_cuda, tensor_cpu = torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu

    class CpuDevices(TorchFunctionMode):
        parsers = (torch._C._nn._parse_to,)
        """``Module.to``'s argument parser, and `cpu_devices`' wrapper of it: torch hands the mode the
        function it finds in ``torch._C._nn`` by name (torch/csrc/utils/python_arg_parser.cpp), the wrapper."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.device:  # the script's device objects stay what it wrote; its tensors move
                if args and is_ordinal(args[0]):
                    mark("torch.device(ordinal)")
                    return func("cuda", *args, **kwargs)
                return func(*args, **kwargs)
            marks = not compiling()  # Dynamo traces this mode into its graphs: marks are not for its fake tensors
            if marks and func in self.parsers:  # Module.to's: the device it reads is the one Module.to moves to
                return func(*args, **kwargs)
            asked = None
            if func is tensor_cuda:
                mark(".cuda()")
                asked = cuda_tensors.gpu(kwargs.get("device", args[1] if len(args) > 1 else None))
                func, args, kwargs = to, (args[0], cpu), {"non_blocking": kwargs.get("non_blocking", False)}
            elif func is tensor_cpu:
                asked = cuda_tensors.HOST
            device = kwargs.get("device")
            if device is not None:
                asked = cuda_tensors.named(device)
                if is_cuda(device) or is_ordinal(device):
                    mark("device='cuda'" if is_cuda(device) else "device=ordinal")
                    kwargs = {**kwargs, "device": cpu}
            if func is to and len(args) > 1:
                asked = cuda_tensors.named(args[1]) if asked is None else asked
                if is_ordinal(args[1]):
                    mark(".to(ordinal)")
                    args = (args[0], cpu, *args[2:])
            if any(is_cuda(a) for a in args):
                mark(".to('cuda')")
                asked = next(cuda_tensors.gpu(a) for a in args if is_cuda(a))
                args = tuple(cpu if is_cuda(a) else a for a in args)
            pinned = bool(kwargs.get("pin_memory"))
            if pinned:  # pinned memory is the host's
                mark("pin_memory")
                kwargs, asked = {**kwargs, "pin_memory": False}, cuda_tensors.HOST
            # the host's for certain (`cuda_tensors`): a CPU named alone may be a fake world's mesh's stand-in
            host = func is tensor_cpu or pinned or (
                func is to and asked == cuda_tensors.HOST and bool(kwargs.get("non_blocking")))
            if host and func is to and args and cuda_tensors.on_host_tensor(args[0]):
                # the host's tensor copied without blocking to where FSDP2 puts its shards, its mesh's CPU in a fake
                # world: a copy to the GPU (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py, CPU offload)
                host, asked = False, cuda_tensors.gpu(None)
            if not marks:
                return func(*args, **kwargs)
            operand_gpu, operand_storages = cuda_tensors.operands(args, kwargs)
            out = cuda_tensors.run(func, args, kwargs, host=host or (asked is None and operand_gpu == cuda_tensors.HOST))
            return cuda_tensors.result(out, asked, operand_gpu, operand_storages, host=host)

    return CpuDevices()


@functools.cache
def unpinned_memory() -> None:
    """``Tensor.pin_memory()`` returns a copy marked as the host's (`cuda_tensors`), as torch returns a pinned copy (a
    tensor marked so already comes back as it is): pinning needs an accelerator's allocator, and DataLoader pins in
    a thread of its own, which the mode does not reach."""
    import torch

    def pin_memory(self, device=None):
        mark("pin_memory")
        return self if cuda_tensors.on_host_tensor(self) else cuda_tensors.copied_to_host(self)

    torch.Tensor.pin_memory = pin_memory


_libraries: list = []  # a torch.library registration lasts as long as its Library object


@functools.cache
def streamless_tensors() -> None:
    """``Tensor.record_stream`` does nothing on the CPU: torch 2.13 registers ``aten::record_stream`` for CUDA
    (and Meta) only, so a CPU tensor standing for a CUDA one raised NotImplementedError ("Could not run
    'aten::record_stream' with arguments from the 'CPU' backend"). A kernel at the dispatcher, not a method
    replaced on ``torch.Tensor``: it answers ``torch.ops.aten.record_stream`` and C++ callers too, on any
    thread, and FakeTensorMode runs it as it is."""
    import torch

    def record_stream(tensor, stream) -> None:
        mark("Tensor.record_stream")

    library = torch.library.Library("aten", "IMPL")
    library.impl("record_stream", record_stream, "CPU")
    _libraries.append(library)


@functools.cache
def fused_rms_norm() -> None:
    """RMSNorm runs as CUDA's one kernel: torch 2.13's ``rms_norm`` calls ``_fused_rms_norm``, which has a CUDA
    kernel whose autograd node keeps the input and the reciprocal RMS (fp32, one per row), while the CPU takes its
    composite, above autograd: seven ops in fp32 whose intermediates autograd keeps (twice the input's bytes and
    more, per norm) and whose traffic the roofline counts. Measured on 8 Llama 3 8B blocks, 1 x 8192, bf16: the
    forecast's peak was 26.9 GiB where an H100 allocated 23.95. With a CPU kernel registered (torch's own
    decompositions, torch._decomp), the dispatcher runs the op as on CUDA: one op, torch's autograd formula, the
    same values."""
    import torch
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    library = torch.library.Library("aten", "IMPL")
    for op in (aten._fused_rms_norm.default, aten._fused_rms_norm_backward.default):
        library.impl(op._schema.name.removeprefix("aten::"), decomposition_table[op], "CPU")
    _libraries.append(library)


@functools.cache
def half_precision_matmuls() -> None:
    """bf16 and fp16 matrix products run as a GPU's tensor cores run them: the operands' products summed in fp32,
    the result rounded once. On a CPU without bf16 units torch 2.13's own kernels for them are a hundred times
    slower than fp32's (this project's AVX2 box, 2026-12-07: a 512 x 1024 by 1024 x 1024 ``mm`` took 1.31 s in bf16,
    1.55 s in fp16, 13 ms in fp32 and 17 ms upcast and rounded), which made a bf16 job's fake world compute-bound
    on them: torchtitan's debug model took 2 s a step, all but the collectives in its matmuls. Registered as the
    ops' CPU kernels, below autograd and below every dispatch mode (the work and memory counters see the one op,
    as on CUDA); the fp32 product is computed by the op's ``out`` overload, whose kernel is torch's own. Other
    dtypes take the same ``out`` kernel with their own dtype."""
    import torch

    aten, half = torch.ops.aten, (torch.bfloat16, torch.float16)
    library = torch.library.Library("aten", "IMPL")

    def through(out_overload):
        def kernel(*args, **kwargs):
            dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor))
            with torch._C.DisableTorchFunction():  # the devices mode saw the script's call; these are the kernel's
                if dtype in half:
                    mark("bf16 and fp16 matmuls in fp32")
                    args = tuple(a.float() if isinstance(a, torch.Tensor) else a for a in args)
                out = torch.empty(0, dtype=torch.float32 if dtype in half else dtype)  # sized by the kernel
                out_overload(*args, **kwargs, out=out)
                return out.to(dtype) if dtype in half else out
        return kernel

    with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point, not the script's
        warnings.simplefilter("ignore", UserWarning)
        for name in ("mm", "addmm", "bmm", "baddbmm"):
            library.impl(name, through(getattr(aten, name).out), "CPU")
    _libraries.append(library)


@functools.cache
def integer_histc() -> None:
    """``torch.histc`` of integers counts as CUDA's does: torch 2.13's CPU kernel (and its meta function, which
    FakeTensorMode runs) refuses them ("histogram_cpu" not implemented for 'torch.int64'), while CUDA's takes
    them and returns their dtype; torchtitan 0.2.2 counts each expert's tokens so (models/moe/moe.py:348). The
    integers are counted as float64, exact to 2**53, and the counts returned in the input's dtype."""
    import torch

    original = torch.histc

    def histc(input, bins=100, min=0, max=0, *, out=None):
        if out is None and isinstance(input, torch.Tensor) and not (input.is_floating_point() or input.is_complex()):
            mark("torch.histc of integers")
            return original(input.double(), bins, min, max).to(input.dtype)
        return original(input, bins, min, max, **({} if out is None else {"out": out}))

    def method(self, bins=100, min=0, max=0):
        return histc(self, bins, min, max)

    torch.histc = histc
    torch.Tensor.histc = method


def interpreted_triton_kernels() -> None:
    """A script's own triton kernels run in triton's interpreter, on the CPU tensors standing for the GPU's:
    launched as they are, they ask triton's NVIDIA driver for libcuda ("libcuda.so cannot found!", triton 3.8
    backends/nvidia/driver.py:45); torchtitan 0.2.2's expert parallelism permutes its tokens with one
    (models/moe/kernels.py:207). triton reads the switch when a kernel is decorated, so it is set in the rank's
    environment before the script imports one. Kernels then compute on the CPU, in numpy: slow, and right; a
    fake tensor has no data for them (run such a job without ``--fake-tensors``)."""
    os.environ["TRITON_INTERPRET"] = "1"


@functools.cache
def cuda_checkpoints_on_cpu() -> None:
    """Storages tagged or mapped to ``cuda`` load on the CPU: a deserializer before CUDA's (priority 20)."""
    import re

    from torch import serialization

    def tag(storage):  # saving: every storage is a CPU one here, which the CPU's tagger names
        return None

    def deserialize(storage, location):
        if re.match(r"cuda(:|$)", location):
            mark("torch.load to cuda")
            cuda_tensors.mark_storage(storage, cuda_tensors.gpu(location))  # its tensors are the GPU's
            return storage
        return None

    serialization.register_package(19, tag, deserialize)


def inductor_without_triton_devices() -> None:
    """Inductor never asks triton for a GPU: with triton installed (torchtitan needs it), the mapped
    ``torch.cuda.is_available()`` and the stand-in GPU's capability make ``torch.utils._triton.has_triton()``
    true, and inductor's first compile asks triton's NVIDIA driver for its target, which needs libcuda
    ("libcuda.so cannot found!", torch 2.13 _inductor/runtime/autotune_cache.py:69). The mapped tensors
    are CPU tensors, so inductor's code is its CPU code either way. torch reads the switch from the
    environment when ``torch._inductor.config`` is first imported (importing it here would cost every
    rank inductor's 1.5 s of imports), or from the config where it already is."""
    os.environ["TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION"] = "1"
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.triton_disable_device_detection = True


def compiled() -> bool:
    """Whether torch.compile compiled a graph in this rank: its regions ran on the CPU (inductor's CPU
    code, or the ops themselves under aot_eager), the mapped tensors being CPU tensors."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return bool(dynamo and dynamo.counters["stats"]["unique_graphs"])


COMPILED = "torch.compile (on the CPU)"
"""`used`'s name for a rank whose torch.compile compiled a graph (`compiled`)."""


def note(calls: list[str]) -> str:
    """The result's note: what was mapped (on any traced rank)."""
    compiled = ("; torch.compile's regions ran on the CPU, as inductor's CPU code (or op by op under aot_eager and "
                "eager), not as CUDA kernels: the same collectives, not the GPU's times" if COMPILED in calls else "")
    return f"no CUDA here: the fake world mapped every CUDA device to the CPU ({', '.join(calls)}){compiled}"
