"""The fake process-group backend under a traced script: every group a fake world's rank creates.

``meshscope trace --fake-world N`` runs each chosen rank r in a process of its own and swaps
whatever backend the script asks ``init_process_group`` for with torch's ``fake`` one (and a store
that needs no peer, torch/testing/_internal/distributed/fake_pg.py, torch 2.11-2.13), and so for
every subgroup, whatever backend it names (`fake_new_group`, `fake_split_group`): its
collectives return at once with their input as output, so the script runs alone while issuing
every call it would issue at N ranks, each seen by the dispatcher recorder as usual. Values received
from other ranks are not there: all-to-all split sizes exchanged at run time come back as this
rank's own (`assumed` marks what a call's fields cannot know), and a P2P receive gets no data (what
``torch.distributed.pipelining``'s warm-up learns from its peers is `pipeline`'s). DDP's built-in gradient hook
takes the reduced bucket from the work's future, which the fake backend leaves empty, so DDP gets a
hook that issues the same all-reduce of the same bucket and hands the bucket back
(`fake_allreduce_hook`); a script that registers a comm hook of its own fails there ("can only be
called once"). What object collectives receive is `objects`'s.

Each installer here is one row of `patches.PATCHES` (its target, why, the torch versions read) and
idempotent: the fork server installs them before it forks the ranks, which install them again.
"""

from __future__ import annotations

import functools
import os

from ..entry_points import arguments, wrap


asked: list[str] = []
"""The backend the script's init_process_group named ("default" where it named none), once it has run."""


@functools.cache
def fake_init_process_group() -> None:
    """The script's ``init_process_group`` makes a fake group of the world the environment names (read
    at the call: the fork server installs this before it forks the ranks)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def fake_init(original):
        bind = arguments(original)

        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            given = bind(args, kwargs)
            for name in ("device_id", "init_method", "_ranks"):  # the fake backend binds no device, needs no peer
                given.pop(name, None)
            asked[:] = [str(given.get("backend") or "default")]
            given.update(backend="fake", store=FakeStore(), rank=int(os.environ["RANK"]),
                         world_size=int(os.environ["WORLD_SIZE"]))
            return original(**given)
        return init_process_group

    wrap("init_process_group", fake_init)


@functools.cache
def fake_new_group() -> None:
    """Every group ``new_group`` makes is a fake one, whatever backend the script names: ``"gloo"`` (on the
    fake store, torch 2.13's ``ProcessGroupGloo(...)`` fails: "INTERNAL ASSERT FAILED ... Not implemented",
    distributed_c10d.py:2169, from Megatron-core's ``_GLOO`` twins), ``"nccl"`` (absent from a CPU build),
    ``"cpu:gloo,cuda:nccl"``, DeviceMesh's backend override. Its ``device_id`` is dropped (the fake backend
    binds no device), and its ``pg_options``: they are the named backend's options, which the fake one does not
    take (DeviceMesh reads their timeout before it calls, and passes it as ``timeout``)."""
    def fake(original):
        bind = arguments(original)

        @functools.wraps(original)  # its signature stays visible to the --timeout wrapper
        def new_group(*args, **kwargs):
            given = bind(args, kwargs)
            for name in ("device_id", "pg_options"):
                given.pop(name, None)
            given["backend"] = "fake"
            return original(**given)
        return new_group

    wrap("new_group", fake)


@functools.cache
def fake_split_group() -> None:
    """``split_group`` builds this rank's split as a fake group. torch's own needs a device bound to the default
    group and a backend that splits (NCCL), neither of which a fake world has ("No device associated with the
    default pg", torch 2.13 distributed_c10d.py:5565); every member of the parent calls it once and gets its
    own split, which `new_group` with ``use_local_synchronization`` makes the same way (members only, the
    name hashed from its ranks as split_group's is). Its description, when none is given, is NCCL's:
    ``<parent>:split:<n>``, n counting this rank's splits of that parent."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    splits: dict[str, int] = {}

    def fake(original):
        bind = arguments(original)

        @functools.wraps(original)
        def split_group(*args, **kwargs):
            given = bind(args, kwargs)
            parent = given.get("parent_pg") or dist.group.WORLD
            desc = given.get("group_desc")
            if desc is None:
                n = splits[parent.group_name] = splits.get(parent.group_name, -1) + 1
                desc = f"{parent.group_desc}:split:{n}"
            mine = dist.get_rank(parent)
            split = next((s for s in given.get("split_ranks") or () if mine in s), None)
            if split is None:  # in no split: torch returns None
                return None
            ranks = sorted(dist.get_global_rank(parent, r) for r in split)
            return c10d.new_group(ranks, timeout=given.get("timeout"), group_desc=desc, use_local_synchronization=True)
        return split_group

    wrap("split_group", fake)


@functools.cache
def hook_ddp() -> None:
    """Every DDP the script builds gets `fake_allreduce_hook` in place of its built-in one."""
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.register_comm_hook(self.process_group, fake_allreduce_hook)

    DistributedDataParallel.__init__ = __init__


def fake_allreduce_hook(group, bucket):
    """DDP's one all-reduce of the bucket, completed with the bucket itself (the fake work's future
    carries no tensor, which DDP's built-in hook asserts on)."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda _: buffer)


def assumed(op: str, input_splits, output_splits) -> tuple[str, ...]:
    """What a fake world's rank cannot know of one call, by the fields that hold it.

    What an all-to-all receives is what its peers send: the fake backend hands back this rank's own
    input, so ``output_splits`` and ``bytes_out`` are assumed on every all-to-all. Uneven input splits
    are assumed too: a rank computes them from counts it received earlier (a MoE combine sends back
    what its dispatch received), and the ledger cannot tell them from splits it chose itself (a
    dispatch's routing), so neither is presented as known. Even input splits are the even split of
    the tensor the script allocated and are kept.
    """
    if op != "all_to_all":
        return ()
    if input_splits and len(set(input_splits)) > 1:
        return ("input_splits", "output_splits", "bytes_in", "bytes_out")
    return ("output_splits", "bytes_out")
