"""Which ranks of a fake world stand for which: classes from the groups rank 0 saw created.

Group creation is a global protocol, so rank 0's process notes every group of every axis, member or
not (`trace.created`); ranks that hold the same place in every kind of group issue the same ledger up
to relabelling, and one per class is traced (`world`).
"""

from __future__ import annotations


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
