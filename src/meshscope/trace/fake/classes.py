"""Which ranks of a fake world stand for which: classes from the groups rank 0 saw created.

Group creation is a global protocol, so rank 0's process notes every group of every axis, member or
not (`trace.created`); ranks that hold the same place in every kind of group issue the same ledger up
to relabelling, and one per class is traced (`world`). A group's kind is its description, or where
the job gave none (picotron's, DeepSpeed's groups) the axis its members make it (`core.mesh_infer`):
one empty description would put every unnamed family in one kind, and an order shown on one family
would then split the places of all of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...core.events import P2P, CommEvent, orders_members
from ...core.mesh_infer import infer

DEFAULT = "default_pg"
"""The default group's kind (torch's description of it): every rank, created by no `new_group`, is one
group of it (a pipeline of tests/jobs/pipelining.py sends on it)."""
ORDERED = "ordered"
"""`ordered_kinds`'s answer where every kind of group keeps its members' places (first, odd or even middle, last)."""


def rank_classes(world: int, groups: list[tuple[str, list[int]]],
                 ordered: set[str] | str = ORDERED, exact: bool = False) -> dict[tuple, list[int]]:
    """Ranks grouped by their place in every group they belong to.

    A rank's key is, for each kind of group (`kinds`: a description or an inferred axis; the default group is one,
    `DEFAULT`), its place in its group there and the group's size. In the kinds of `ordered` (all of
    them by default) the place is first, last, or a middle member at an even or an odd position: a
    pipeline's two ends differ from its inner stages, and torch 2.15 connects neighbouring stages pair
    by pair before the first step, one matching of pairs after the other (pipelining/_p2p.py,
    ``_preconnect_shared_p2p_edges``), so that stages 1 and 2 of four issue their first sends and
    receives in other orders. In the others it is first or not: a collective's members issue the same
    calls, its first member being the root of torch's and Megatron-core's rooted calls (broadcast,
    gather, logging on a group's rank 0).
    Ranks with equal keys issue the same ledger up to relabelling in the parallel APIs torch and
    Megatron-core provide, though not always in the same order: a 1F1B schedule's stage runs as many forwards
    before its first backward as there are stages after it (torch 2.13 pipelining/schedules.py
    ``Schedule1F1B``, megatron-core's interleaved schedule), so with `exact` (``--work``, whose forecast runs each
    rank's program in order) a middle member's place is its own position. A script that branches on the rank
    number itself can defeat this; the claim is verified on small worlds by tracing every rank
    (tests/test_fake_world.py).
    """
    by_desc: dict[str, list[list[int]]] = {DEFAULT: [list(range(world))]}
    for desc, ranks in kinds(world, groups):
        by_desc.setdefault(desc, []).append(ranks)
    key: dict[int, list] = {r: [] for r in range(world)}
    for desc in sorted(by_desc):
        in_order = ordered == ORDERED or desc in ordered
        for ranks in by_desc[desc]:
            for i, r in enumerate(ranks):
                if r in key:
                    key[r].append((desc, place(i, len(ranks), in_order, exact), len(ranks)))
    classes: dict[tuple, list[int]] = {}
    for r in range(world):
        classes.setdefault(tuple(key[r]), []).append(r)  # built in one fixed order: sorting would merge places
    return classes


OTHER = "other"
"""`place`'s name for a member after the first where the members' order does not show."""


def place(i: int, size: int, in_order: bool, exact: bool = False) -> str:
    """The place of a group's `i`-th member of `size` (`rank_classes`; a budget's rank classes too):
    ``first`` or ``other``; where the members' order shows (`in_order`), ``first``, ``middle 0`` or
    ``middle 1`` (the parity of its position; with `exact`, ``middle i``) or ``last``."""
    if i == 0:
        return "first"
    if not in_order:
        return OTHER
    return "last" if i == size - 1 else f"middle {i if exact else i % 2}"


def kinds(world: int, groups: list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
    """`groups` ((description, ranks), as rank 0 created them) with each description replaced by its kind:
    itself, or for a group the job named none of, the axis `core.mesh_infer` reads from its members
    (empty where they fit none)."""
    labels = infer(world, groups).labels
    return [(desc or labels.get(tuple(sorted(ranks)), ""), ranks) for desc, ranks in groups]


def ordered_kinds(world: int, groups: list[tuple[str, list[int]]], events: Iterable[CommEvent]) -> set[str] | str:
    """The kinds of group (`kinds`) whose members' places beyond first or not show in what the traced
    ranks issued: those that carried a point-to-point call (a pipeline's stages, a ring) or a rooted call
    whose root was not the group's first member. `ORDERED` (every kind) where such a call was on a group
    rank 0 saw no creation of.

    A point-to-point call on the default group names its peer by global rank and so no axis (picotron's
    ``batch_isend_irecv`` between stages, huggingface/picotron at 59714b1,
    ``pipeline_parallel/pp_communications.py``): the pair's place is in the smallest groups that hold
    both ends (its pipeline, `pp`), whose kind is ordered; the default group only where no smaller one
    does. Ordering the world instead keeps first, parity and last of the global rank, which puts a last
    stage whose rank has a middle stage's parity in that middle stage's class."""
    world_group = tuple(range(world))
    kinds_of: dict[tuple[int, ...], set[str]] = {world_group: {DEFAULT}}
    for kind, ranks in kinds(world, groups):
        kinds_of.setdefault(tuple(sorted(ranks)), set()).add(kind)
    ordered: set[str] = set()
    for e in events:
        if not orders_members(e):
            continue
        group = tuple(e.group)
        if e.op in P2P and group == world_group and e.peer is not None:
            holding = [g for g in kinds_of if e.rank in g and e.peer in g]  # the world at least
            smallest = min(map(len, holding))
            ordered.update(*(kinds_of[g] for g in holding if len(g) == smallest))
        elif group in kinds_of:
            ordered |= kinds_of[group]
        else:
            return ORDERED
    return ordered
