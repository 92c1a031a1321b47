"""``--timeout S``: every process group a traced job creates waits at most S seconds in a collective
(or in its own creation); a script that computes quietly for longer is never stopped, only a waiting
collective times out."""

from __future__ import annotations

import functools
import inspect
from datetime import timedelta

from .entry_points import wrap


def limit_timeouts(seconds: float) -> None:
    """Every process group the job creates waits at most `seconds` in a collective (`entry_points.wrap`:
    DeviceMesh's bindings too)."""

    limit = timedelta(seconds=seconds)

    def limited(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs)  # a timeout given by position too
            bound.arguments["timeout"] = min(bound.arguments.get("timeout") or limit, limit)
            return original(*bound.args, **bound.kwargs)
        return wrapped

    for name in ("init_process_group", "new_group", "split_group"):
        wrap(name, limited)
