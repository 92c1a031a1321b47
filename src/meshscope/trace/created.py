"""Every process group a traced rank creates, in creation order, member or not, written as it happens.

The default group's ``init_process_group`` is noted too (``initialised``), once it returned: the
result's notes say whether a job that issued nothing had a process group at all from this record.

Group creation is a global protocol: every rank must call ``new_group`` for every group, with the
same ranks, in the same order. A job that breaks it hangs (or fails) inside ``new_group`` itself,
before any collective that the flight log would show, so each call is noted twice in
``groups/rank<R>.jsonl``: ``creating`` (index, description, ranks) before torch is asked, and
``created`` (index, the group's name) once it returned. The doctor compares the sequences across
ranks (`doctor.evidence` reads the file, `doctor.collective.group_order` compares); a ``creating``
without its ``created`` is where a rank was stuck.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from ..core.rundir import RunDir
from .entry_points import arguments, wrap


def note_creations(run_dir: RunDir, rank: int) -> None:
    """Wrap ``new_group`` (DeviceMesh's binding too) to log each creation of this rank."""
    import torch.distributed as dist

    path = run_dir.groups(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    # open for the rank's life, line-buffered: a rank killed while stuck keeps every line
    log = open(path, "w", buffering=1)  # noqa: SIM115
    lock, count = threading.Lock(), [0]

    def write(**fields) -> None:
        with lock:
            log.write(json.dumps({"t": time.time(), **fields}) + "\n")

    def noted(original):
        bind = arguments(original)

        @functools.wraps(original)  # its signature stays visible to the --timeout wrapper
        def new_group(*args, **kwargs):
            given = bind(args, kwargs)
            with lock:
                index, count[0] = count[0], count[0] + 1
            ranks = given.get("ranks")
            # int(): torch takes any integers (nanotron passes numpy's), JSON only Python's
            members = sorted(int(r) for r in ranks) if ranks is not None else list(range(dist.get_world_size()))
            write(kind="creating", index=index, desc=given.get("group_desc") or "", ranks=members,
                  local=bool(given.get("use_local_synchronization")))  # members only: not a global protocol
            group = original(*args, **kwargs)
            name = getattr(group, "group_name", None) if group not in (None, dist.GroupMember.NON_GROUP_MEMBER) else None
            write(kind="created", index=index, name=name)
            return group
        return new_group

    def initialising(original):
        @functools.wraps(original)  # its signature stays visible to the wrappers after this one
        def init_process_group(*args, **kwargs):
            out = original(*args, **kwargs)
            write(kind="initialised", world=dist.get_world_size())  # a fact the result's notes rest on
            return out
        return init_process_group

    wrap("new_group", noted)
    wrap("init_process_group", initialising)

