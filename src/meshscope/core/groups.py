"""Safe creation of the mesh's process groups on torch.distributed, and the group registry.

Chapter Q3 (group creation order is a global protocol): every rank calls ``new_group`` for every group of
every axis, in one global order, including groups it is not a member of; ranks that create overlapping
groups in different orders can deadlock at initialisation or mis-order collectives. `create_groups` walks
`Layout.creation_order()` identically on every rank, keeps the groups this rank belongs to, and records
the sequence it created (for the doctor to compare across ranks).

The registry maps a ProcessGroup (or its ``group_name``, which functional collectives pass around)
back to its mesh axis and member ranks, so that a captured collective is placed on its dimension.
"""

from __future__ import annotations

import datetime
import inspect
from dataclasses import dataclass, field

import torch.distributed as dist

from .mesh import GROUP_NAMES, Layout

STARTUP_S = 120.0
"""How long the default group's rendezvous waits for every rank to start, at the least."""


def init_default_group(backend: str, rank: int, world: int, timeout: datetime.timedelta, **kwargs) -> None:
    """torch's ``init_process_group(backend, timeout=timeout)`` through torchrun's store, once every
    rank has started: each waits for the others on the rendezvous store for `STARTUP_S` at least. The
    group's own timeout bounds its connection too (gloo waits that long for its peers' addresses,
    ProcessGroupGloo's constructor), and a short one (planted hangs: ``--timeout 6``) failed a rank
    that started 6 s late on a busy 2-core CI box, ``DistStoreError: wait timeout after 6000ms``,
    before any fault (2026-12-03). The group's calls, P2P included, and later subgroups' creation keep
    `timeout` (a creation order that differs must still hang there)."""
    startup = max(timeout, datetime.timedelta(seconds=STARTUP_S))
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=startup))
    store.set(f"meshscope/started/{rank}", "1")
    store.wait([f"meshscope/started/{r}" for r in range(world)], startup)
    store.set_timeout(timeout)
    # the prefix torch gives the store it makes itself (distributed_c10d.py, init_process_group)
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world,
                            timeout=timeout, **kwargs)


@dataclass(frozen=True)
class AxisGroup:
    """This rank's group on one mesh axis."""

    axis: str
    """Canonical axis name (`Layout.canonical`): the name the group was created under."""
    ranks: tuple[int, ...]
    pg: object | None
    """The ProcessGroup, or None where the group has one rank (no communicator is needed)."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    def local_rank(self, rank: int) -> int:
        return self.ranks.index(rank)


@dataclass
class MeshGroups:
    """Every group this rank belongs to, by axis name, plus the creation sequence it followed."""

    layout: Layout
    rank: int
    by_axis: dict[str, AxisGroup] = field(default_factory=dict)
    created: list[tuple[str, list[int]]] = field(default_factory=list)

    def __getitem__(self, axis: str) -> AxisGroup:
        return self.by_axis[axis]


_BY_ID: dict[int, tuple[str, tuple[int, ...], object]] = {}
_BY_NAME: dict[str, tuple[str, tuple[int, ...]]] = {}


def register(pg, axis: str, ranks) -> None:
    """Remember which mesh axis and ranks a ProcessGroup stands for."""
    ranks = tuple(ranks)
    _BY_ID[id(pg)] = (axis, ranks, pg)  # the pg is kept alive so its id cannot be reused
    name = getattr(pg, "group_name", None)
    if name:
        _BY_NAME[name] = (axis, ranks)


def forget_all() -> None:
    """Drop the registry, and with it the references that keep every registered ProcessGroup alive.

    Called after ``destroy_process_group`` (`RankContext.close`): for gloo that call does not stop a
    group's threads (its ``shutdown`` is a no-op); only the group's destructor joins them, and it runs
    when the last Python reference goes. The ids of destroyed groups may be reused, so the entries are
    meaningless afterwards anyway.
    """
    _BY_ID.clear()
    _BY_NAME.clear()


def describe(group) -> tuple[str, tuple[int, ...]]:
    """(axis, ranks) of a ProcessGroup, a group name, or None (the default group)."""
    if group is None:
        group = dist.group.WORLD
    if isinstance(group, str):
        if group in _BY_NAME:
            return _BY_NAME[group]
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group)
    hit = _BY_ID.get(id(group))
    if hit is not None:
        return hit[0], hit[1]
    ranks = tuple(dist.get_process_group_ranks(group))
    axis = "world" if group is dist.group.WORLD else "group"
    register(group, axis, ranks)
    return axis, ranks


def _new_group(ranks: list[int], desc: str, timeout):
    kwargs = {"timeout": timeout} if timeout is not None else {}
    if "group_desc" in inspect.signature(dist.new_group).parameters:  # torch >= 2.4 names NCCL comms by it
        kwargs["group_desc"] = desc
    return dist.new_group(ranks, **kwargs)


def create_groups(layout: Layout, rank: int, timeout=None, on_create=None, misorder: bool = False) -> MeshGroups:
    """Create every group of `layout` on torch.distributed, in the global creation order.

    Must be called by every rank of the world. `on_create(axis, ranks)` is called before each
    new_group (the flight log records it, so a rank stuck in new_group shows where).
    `misorder` plants the chapter's group-creation fault on this rank: its last group is created first.
    """
    if dist.get_world_size() != layout.world:
        raise ValueError(f"layout is for world {layout.world} but torch.distributed has {dist.get_world_size()} ranks")
    out = MeshGroups(layout, rank)
    made: dict[tuple[int, ...], object] = {}
    order = layout.creation_order()
    if misorder:
        order = order[-1:] + order[:-1]
    for axis, ranks in order:
        desc = f"meshscope:{axis}:{'-'.join(map(str, ranks))}"
        out.created.append((axis, ranks))
        if on_create is not None:
            on_create(axis, ranks)
        pg = _new_group(ranks, desc, timeout)
        if rank in ranks:
            made[tuple(ranks)] = pg
            register(pg, axis, ranks)
    for axis in GROUP_NAMES:
        ranks = tuple(layout.group_of(axis, rank))
        pg = made[ranks] if len(ranks) > 1 else None
        out.by_axis[axis] = AxisGroup(layout.canonical(axis), ranks, pg)
    return out
