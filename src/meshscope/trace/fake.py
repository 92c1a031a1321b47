"""A rank of a large world on one CPU: torch's ``fake`` process-group backend under a traced script.

``meshscope trace --fake-world N`` runs each chosen rank r in a process of its own, with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` set as torchrun would for N
ranks on nodes of G, and swaps whatever backend the script asks ``init_process_group`` for with
``fake`` (and a store that needs no peer): its collectives return at once with their input as
output, so the script runs alone while issuing every call it would issue at N ranks, each seen by
the dispatcher recorder as usual. Values received from other ranks are not there: all-to-all split
sizes exchanged at run time come back as this rank's own (the ledger marks such a job's splits as
assumed), and a P2P receive gets no data, so ``torch.distributed.pipelining`` needs static stage
shapes (``input_args``). A blocking ``recv`` fills its buffer with ones (`_recv_ones`): the
pipeline's warm-up vote multiplies every stage's 1 ("static shapes") along the stages, and the
untouched zero the fake backend would leave reads as a vote for shape inference over P2P, which
a fake world cannot answer. DDP's built-in gradient hook takes the reduced bucket from the work's
future, which the fake backend leaves empty, so DDP gets a hook that issues the same all-reduce
of the same bucket and hands the bucket back (`_fake_allreduce_hook`); a script that registers a
comm hook of its own fails there ("can only be called once").

Every ``new_group`` call is noted with its ranks, member or not (`trace.created`, as in any trace):
group creation is a global protocol, so rank 0's process sees every group of every axis, which
`rank_classes` turns into classes of ranks that should issue the same ledger up to relabelling.
"""

from __future__ import annotations

import functools
import inspect
import os

from .entry_points import rebind, wrap

@functools.cache  # once per process: the fork server installs it before it forks the ranks, which call it again
def use_fake_backend() -> None:
    """Make the script's ``init_process_group`` a fake one of the world the environment names (read at
    the call: the fork server installs this before it forks the ranks)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def fake_init(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            given = signature.bind_partial(*args, **kwargs).arguments  # by name, positional ones too
            for name in ("device_id", "init_method", "_ranks"):  # the fake backend binds no device, needs no peer
                given.pop(name, None)
            given.update(backend="fake", store=FakeStore(), rank=int(os.environ["RANK"]),
                         world_size=int(os.environ["WORLD_SIZE"]))
            return original(**given)
        return init_process_group

    def deviceless_new_group(original):
        @functools.wraps(original)  # its signature stays visible to the --timeout wrapper
        def new_group(*args, **kwargs):
            kwargs.pop("device_id", None)  # the fake backend binds no device
            return original(*args, **kwargs)
        return new_group

    wrap("init_process_group", fake_init)
    wrap("new_group", deviceless_new_group)
    _hook_ddp()
    _recv_ones()


def _recv_ones() -> None:
    """``dist.recv`` returns a buffer of ones: what every real peer sends in pipelining's vote."""
    import torch.distributed.distributed_c10d as c10d

    original = c10d.recv

    def recv(tensor, *args, **kwargs):
        out = original(tensor, *args, **kwargs)
        tensor.fill_(1)
        return out

    rebind(original, recv)


def _hook_ddp() -> None:
    """Every DDP the script builds gets `_fake_allreduce_hook` in place of its built-in one."""
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.register_comm_hook(self.process_group, _fake_allreduce_hook)

    DistributedDataParallel.__init__ = __init__


def _fake_allreduce_hook(group, bucket):
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


def environment(rank: int, world: int, per_node: int) -> dict[str, str]:
    """What torchrun sets for `rank` of `world` ranks on nodes of `per_node`."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(rank // per_node), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "meshscope-fake-world", "MESHSCOPE_FAKE_WORLD": str(world)}


def rank_classes(world: int, groups: list[tuple[str, list[int]]]) -> dict[tuple, list[int]]:
    """Ranks grouped by their place in every group they belong to.

    A rank's key is, for each group description (each kind of group: an axis), whether it is the
    first, a middle or the last member of its group there, and the group's size. Ranks with equal
    keys hold the same position everywhere (the same pipeline end, the same root of a broadcast),
    which is what makes two ledgers equal up to relabelling in the parallel APIs torch and
    Megatron-core provide. A script that branches on the rank number itself can defeat this; the
    claim is verified on small worlds by tracing every rank (tests/test_fake_world.py).
    """
    by_desc: dict[str, list[list[int]]] = {}
    for desc, ranks in groups:
        by_desc.setdefault(desc, []).append(ranks)
    key: dict[int, list] = {r: [] for r in range(world)}
    for desc in sorted(by_desc):
        for ranks in by_desc[desc]:
            for i, r in enumerate(ranks):
                place = "first" if i == 0 else "last" if i == len(ranks) - 1 else "middle"
                if r in key:
                    key[r].append((desc, place, len(ranks)))
    classes: dict[tuple, list[int]] = {}
    for r in range(world):
        classes.setdefault(tuple(key[r]), []).append(r)  # built in one fixed order: sorting would merge places
    return classes
