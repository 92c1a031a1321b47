"""CUDA mapped to the CPU in a fake world's rank on a machine without CUDA.

Users' scripts are written for GPUs: ``torch.cuda.set_device(local_rank)``, ``.cuda()``,
``init_device_mesh("cuda", ...)``, ``DDP(..., device_ids=[local_rank])``. A fake world exists to
run such a script before a GPU is booked, so on a CPU-only machine every CUDA device becomes the CPU
(a fake world's collectives move no data, so nothing depends on where a tensor lives):

- ``torch.cuda.is_available()`` says yes (the script takes its GPU path, the one it will run),
  ``device_count()`` is the node's ``LOCAL_WORLD_SIZE``, ``current_device()`` the ``LOCAL_RANK``,
  ``is_current_stream_capturing()`` is False, ``set_device``, ``synchronize``, ``empty_cache``,
  ``manual_seed(_all)``, ``set_rng_state(_all)`` do nothing and ``get_rng_state(_all)`` gives the CPU generator's state (``torch.random.fork_rng``);
  ``torch.accelerator`` names ``cuda`` as the build's accelerator but says none is usable now;
- a TorchFunctionMode rewrites every CUDA device argument of every torch call (factories'
  ``device=``, ``Tensor.to("cuda")``, ``Tensor.cuda()``, and with them ``Module.cuda()`` and
  ``Module.to``) to the CPU; the mode is the one place that sees calls made inside torch's own
  parallel APIs too, which patching the methods one by one would miss;
- a ``DeviceMesh`` of type ``cuda`` (``init_device_mesh("cuda", ...)``) is built as a CPU mesh, so
  FSDP2 and DTensor on it take their CPU path (no CUDA streams);
- DDP is built without ``device_ids`` / ``output_device`` (which it accepts only for GPU modules);
  ``init_process_group``'s ``device_id`` is already dropped by the fake backend (`backend`).

Anything else of ``torch.cuda`` that needs a device (streams, events, memory statistics, device
properties) cannot be mapped: it raises `Unmapped`, one line naming the call and where the script made
it. `used` names what was mapped, for the result's note. Each installer is a row of
`patches.PATCHES`, applied only where torch has no CUDA (`needed`).
"""

from __future__ import annotations

import functools
import os
import traceback

from ..entry_points import rebind
from ..script_frames import is_library, place

used: list[str] = []
"""The CUDA calls this rank mapped to the CPU, each named once, in the order first met."""


class Unmapped(RuntimeError):
    """A CUDA call the device map cannot run on the CPU."""


def _mark(name: str) -> None:
    if name not in used:
        used.append(name)


def _is_cuda(device) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


@functools.cache  # asked once, before this module's patches make torch.cuda say yes
def needed() -> bool:
    """Whether CUDA must be mapped: torch has none here."""
    import torch

    return not torch.cuda.is_available()


@functools.cache  # each installer once per process: the fork server installs it before it forks the ranks
def answer_torch_cuda() -> None:
    """torch.cuda's device queries and no-ops answered as one GPU per local rank would answer them."""
    import torch

    cuda = torch.cuda
    lazy_init = cuda._lazy_init

    def answer_with(name, make):
        def call(*args, **kwargs):
            _mark(f"torch.{name}")
            return make(*args, **kwargs)
        return call

    def answer(name, value):
        return answer_with(name, lambda *args, **kwargs: value)

    def local_rank() -> int:  # the rank's environment, read at the call (not at install: fork_server)
        return int(os.environ.get("LOCAL_RANK", 0))

    def local_world() -> int:
        return int(os.environ.get("LOCAL_WORLD_SIZE", 1))

    cuda.device_count = answer_with("cuda.device_count", local_world)
    cuda.current_device = answer_with("cuda.current_device", local_rank)
    for name, value in (("is_available", True),
                        ("set_device", None), ("synchronize", None), ("empty_cache", None),
                        ("manual_seed", None), ("manual_seed_all", None),
                        # torch 2.11's optimizers ask it of a CUDA build before every step: no capture on the CPU
                        ("is_current_stream_capturing", False)):
        setattr(cuda, name, answer(f"cuda.{name}", value))
    accelerator = torch.accelerator
    current_accelerator = accelerator.current_accelerator
    usable = accelerator.is_available()  # before the patches: False here, and it stays the answer
    accelerator.is_available = lambda: usable  # torch.compile asks it before it reaches for streams

    def accelerator_type(check_available: bool = False):
        """The device-generic twin, as torch's own test models ask it: the accelerator this machine is
        taken for is ``cuda``; asked whether one is usable now (torch's optimizers, before reaching
        for CUDA streams), it still says no, so torch's internals keep their CPU paths."""
        if check_available:
            return current_accelerator(check_available=True)
        _mark("torch.accelerator.current_accelerator")
        return torch.device("cuda")

    accelerator.current_accelerator = accelerator_type
    accelerator.device_count = answer_with("accelerator.device_count", local_world)

    def unmapped_init(*args, **kwargs):
        """torch.cuda's own gate before it touches a device: name the call instead of 'not compiled'."""
        try:
            lazy_init(*args, **kwargs)
        except (AssertionError, RuntimeError):
            raise _unmapped() from None

    rebind(lazy_init, unmapped_init)  # torch.cuda.random and others import it by name
    cpu_state = torch.get_rng_state
    cuda.get_rng_state = answer_with("cuda.get_rng_state", lambda *args, **kwargs: cpu_state())
    cuda.get_rng_state_all = answer_with("cuda.get_rng_state_all", lambda: [cpu_state()] * local_world())
    cuda.set_rng_state = answer("cuda.set_rng_state", None)  # fork_rng's restore: no CUDA generator to set
    cuda.set_rng_state_all = answer("cuda.set_rng_state_all", None)
    for name in ("Stream", "Event"):  # CPU builds have dummy classes that fail without saying why
        setattr(cuda, name, type(name, (getattr(cuda, name),), {"__new__": _refuse(f"torch.cuda.{name}")}))


def _refuse(name: str):
    def __new__(cls, *args, **kwargs):
        raise _unmapped(name)
    return __new__


def _unmapped(name: str | None = None) -> Unmapped:
    return Unmapped(f"{_call_site(name)} needs a CUDA device, which meshscope's fake world cannot map to the CPU "
                    f"(it maps devices, .cuda(), set_device, init_device_mesh, device_ids)")


def _call_site(name: str | None) -> str:
    """'torch.cuda.Stream at train.py:12': the torch.cuda function the script called (`name`, else the
    outermost torch.cuda frame), and the script's line that called it (`script_frames`)."""
    frames = traceback.extract_stack()[:-3]
    inside = [f for f in frames if f"{os.sep}torch{os.sep}cuda{os.sep}" in f.filename]
    own = [f for f in frames if not is_library(f.filename)]
    name = name or (f"torch.cuda.{inside[0].name}" if inside else "a CUDA call")
    return f"{name} at {place(own[-1]).rsplit(os.sep, 1)[-1]}" if own else name


@functools.cache
def cpu_device_mesh() -> None:
    """A CUDA mesh is built as a CPU one (init_device_mesh builds its mesh through this constructor)."""
    from torch.distributed import device_mesh

    original = device_mesh.DeviceMesh.__init__

    def init(mesh, device_type, *args, **kwargs):
        if _is_cuda(device_type):
            _mark("DeviceMesh('cuda')")
            device_type = "cpu"
        original(mesh, device_type, *args, **kwargs)

    device_mesh.DeviceMesh.__init__ = init


@functools.cache
def ddp_without_device_ids() -> None:
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    def init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None or output_device is not None:
            _mark("DDP device_ids")
        original(self, module, None, None, *args, **kwargs)

    DistributedDataParallel.__init__ = init


@functools.cache
def cpu_devices() -> None:
    """For the rest of the process (the script runs inside it): `_cpu_devices`."""
    _cpu_devices().__enter__()


def _cpu_devices():
    """The TorchFunctionMode: every CUDA device argument of a torch call becomes the CPU, and
    ``Tensor.cuda()`` a ``to("cpu")``."""
    import torch
    from torch.overrides import TorchFunctionMode

    cpu = torch.device("cpu")

    class CpuDevices(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.device:  # the script's device objects stay what it wrote; its tensors move
                return func(*args, **kwargs)
            if func is torch.Tensor.cuda:
                _mark(".cuda()")
                return args[0].to(cpu, non_blocking=kwargs.get("non_blocking", False))
            device = kwargs.get("device")
            if device is not None and _is_cuda(device):
                _mark("device='cuda'")
                kwargs = {**kwargs, "device": cpu}
            if any(_is_cuda(a) for a in args):
                _mark(".to('cuda')")
                args = tuple(cpu if _is_cuda(a) else a for a in args)
            return func(*args, **kwargs)

    return CpuDevices()


def note(calls: list[str]) -> str:
    """The result's note: what was mapped (on any traced rank)."""
    return f"no CUDA here: the fake world mapped every CUDA device to the CPU ({', '.join(calls)})"
