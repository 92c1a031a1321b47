"""Wrap one of torch.distributed's group-creating entry points everywhere it is bound.

DeviceMesh imports ``init_process_group``, ``new_group`` and ``split_group`` by name, so replacing
``torch.distributed.new_group`` alone would miss every group a mesh creates. `wrap` replaces the
function in ``distributed_c10d`` and in every module that holds that same function object. The trace
wraps them to limit collective timeouts (``--timeout``) and to swap in the fake backend (``--fake-world``).
"""

from __future__ import annotations

from typing import Callable


def wrap(name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace c10d's `name`, wherever it is bound, by ``make(original)``; nothing if torch lacks it."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed import device_mesh

    original = getattr(c10d, name, None)
    if original is None:
        return
    wrapped = make(original)
    for module in (c10d, dist, device_mesh):
        if getattr(module, name, None) is original:
            setattr(module, name, wrapped)
