"""``--timeout S``: every process group a traced job creates waits at most S seconds in a collective
(or in its own creation); a script that computes quietly for longer is never stopped, only a waiting
collective times out."""

from __future__ import annotations

import functools
from datetime import timedelta

from .entry_points import arguments, wrap


def limit_timeouts(seconds: float) -> None:
    """Every process group the job creates waits at most `seconds` in a collective (`entry_points.wrap`:
    DeviceMesh's bindings too)."""

    limit = timedelta(seconds=seconds)

    def limited(original):
        bind = arguments(original)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            given = bind(args, kwargs)  # a timeout given by position too
            given["timeout"] = min(given.get("timeout") or limit, limit)
            return original(**given)
        return wrapped

    for name in ("init_process_group", "new_group", "split_group"):
        wrap(name, limited)
