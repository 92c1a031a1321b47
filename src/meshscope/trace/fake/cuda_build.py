"""What a CUDA build of torch has and a CPU build lacks, present in a fake world that maps CUDA.

`cuda_api` answers torch.cuda's functions; libraries also reach past them, once
``torch.cuda.is_available()`` says yes, to names a CPU build does not have:

- `cuda_generators`: ``torch.Generator(device="cuda")`` raises "Cannot get CUDA generator without
  ATen_cuda library" (nanotron 2411b02 data/dataloader.py:134, its dummy data). ``torch.Generator`` is a
  C class, which neither the TorchFunctionMode of `devices` nor a function table sees: it is replaced by a
  subclass whose CUDA generators are the CPU's (its draws, its state), whose ``device`` answers the CUDA
  device it stands for (as `devices` keeps the script's device objects as written: a tensor made with
  ``device=g.device`` is mapped), and of which every generator torch made is an instance still;
- `cuda_bindings`: torch._C's CUDA bindings, which a library may read at import (bitsandbytes 0.50.2
  backends/cuda/ops.py:69 ``_get_raw_stream = torch._C._cuda_getCurrentRawStream``, imported by
  Colossal-AI 0.5.0's booster: "module 'torch._C' has no attribute"). Each ``_cuda_*`` function torch's
  own stub declares for torch._C (torch/_C/__init__.pyi, the CUDA build's bindings) and this build lacks is
  there, and a call raises `devices.Unmapped` naming it; but ``_cuda_getDeviceCount``, which torch itself
  reads as "compiled with CUDA" (torch 2.13 cuda/__init__.py:162 ``_is_compiled``, :521 ``_lazy_init``);
- `nccl_available`: ``dist.is_nccl_available()`` (and so ``is_backend_available("nccl")``) says yes, as for
  the nccl groups the fake world builds: Colossal-AI 0.5.0 pipeline/p2p.py:159 calls a function torch lacks
  (``is_hccl_available``) where it says no. torch's own code then asks whether a backend is a
  ``ProcessGroupNCCL`` (distributed_c10d.py:1526, 1612, 1650, 2498), a name a CPU build lacks: it is a class
  of which no backend is an instance.

Each installer is a row of `patches.PATCHES`, applied only where torch has no CUDA (`devices.needed`).
"""

from __future__ import annotations

import functools
import os
import re

from .cuda_tensors import gpu, is_cuda, is_ordinal
from .devices import mark, unmapped

KEPT_OUT = ("_cuda_getDeviceCount",)
"""Bindings left missing: torch reads their absence as "not compiled with CUDA"."""


@functools.cache
def cuda_generators() -> None:
    import torch

    base = torch._C.Generator

    class Kind(type(base)):  # torch 2.13's is torch._opaque_base.OpaqueBaseMeta
        """``isinstance(g, torch.Generator)`` holds for every generator, torch's own included."""

        def __instancecheck__(cls, value) -> bool:
            return isinstance(value, base)

        def __subclasscheck__(cls, subclass) -> bool:
            return issubclass(subclass, base)

    class Generator(base, metaclass=Kind):
        """A CUDA generator as the CPU's, its ``device`` the CUDA device it stands for."""

        def __new__(cls, device="cpu"):
            if not (is_cuda(device) or is_ordinal(device)):
                return base.__new__(cls, device)
            mark("torch.Generator(device='cuda')")
            generator = base.__new__(cls, "cpu")
            generator.standing_for = torch.device("cuda", gpu(device))
            return generator

        def __init__(self, device="cpu"):
            pass

        @property
        def device(self):
            return getattr(self, "standing_for", None) or super().device

    Generator.__module__, Generator.__qualname__ = "torch", "Generator"  # pickled by name, as torch's
    torch.Generator = Generator


@functools.cache
def cuda_bindings() -> None:
    import torch

    stub = os.path.join(os.path.dirname(torch.__file__), "_C", "__init__.pyi")
    with open(stub, encoding="utf-8") as f:
        declared = set(re.findall(r"^def (_cuda_\w+)\(", f.read(), re.MULTILINE))
    for name in sorted(declared - set(vars(torch._C)) - set(KEPT_OUT)):
        setattr(torch._C, name, _needs_device(f"torch._C.{name}"))


def _needs_device(name: str):
    def binding(*args, **kwargs):
        raise unmapped(name)

    binding.__name__ = binding.__qualname__ = name.rsplit(".", 1)[-1]
    return binding


@functools.cache
def nccl_available() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from ..entry_points import rebind

    if dist.is_nccl_available():
        return

    def is_nccl_available() -> bool:
        return True

    class ProcessGroupNCCL:
        """A CPU build's stand-in for torch's NCCL backend class: no backend here is one."""

    vars(c10d).setdefault("ProcessGroupNCCL", ProcessGroupNCCL)
    rebind(c10d.is_nccl_available, is_nccl_available)
