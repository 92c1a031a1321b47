"""Replace one of torch's functions everywhere it is bound.

DeviceMesh imports ``init_process_group``, ``new_group`` and ``split_group`` by name, so replacing
``torch.distributed.new_group`` alone would miss every group a mesh creates; and a library the script
imports may have bound a name earlier still (in a fake world's forked rank, the server imported it
before the rank's patches: `trace.fork_server`). `rebind` replaces a function in every loaded module
that holds that same object; `wrap` does it for c10d's entry points, which the trace wraps to limit
collective timeouts (``--timeout``) and to swap in the fake backend (``--fake-world``).
"""

from __future__ import annotations

import sys
from typing import Callable


def rebind(original: Callable, replacement: Callable) -> None:
    """Every loaded module's global bound to `original` now names `replacement`."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):  # a module with a read-only namespace (typing.io) binds nothing
            continue
        for name, value in list(namespace.items()):
            if value is original:
                namespace[name] = replacement


def wrap(name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace c10d's `name`, wherever it is bound, by ``make(original)``; nothing if torch lacks it."""
    import torch.distributed.distributed_c10d as c10d

    original = getattr(c10d, name, None)
    if original is not None:
        rebind(original, make(original))
