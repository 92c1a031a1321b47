"""Rank coordinates and orthogonal process groups, in pure Python.

The chapter's rank coordinate system and Megatron's generalisation of it (docs/chapter.md, Q1): a global
rank is the linearisation of per-axis coordinates, and the process group of an axis fixes every other
coordinate while that axis varies. As in Megatron's RankGenerator, an order string such as
``tp-cp-ep-dp-pp`` lists the axes with the LEFTMOST varying fastest:

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))      (order tp-cp-ep-dp-pp)

Two families of axes share the same ranks (Megatron's "decoupled" expert layout):
  dense  : tp, cp, dp, pp            with dp  = world / (tp * cp * pp)   (``ep`` is skipped)
  expert : etp, ep, edp, pp          with edp = world / (etp * ep * pp)  (``cp`` is skipped; etp sits
                                      where tp sits in the order, edp where dp sits)
A group name may combine axes of one family with hyphens (``dp-cp``, ``tp-pp``); ``pp`` belongs to
both families and gives the same groups in either.

Nothing here needs torch.distributed: `Layout` answers rank <-> coordinates and group membership for
100,000 ranks in milliseconds (benchmarks/bench_mesh.py prints the figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .errors import UsageError

ORDER_AXES = ("tp", "cp", "ep", "dp", "pp")
"""Axes an order string must name, each exactly once."""

DEFAULT_ORDER = "tp-cp-ep-dp-pp"

DENSE_AXES = ("tp", "cp", "dp", "pp")
EXPERT_AXES = ("etp", "ep", "edp", "pp")
# Where each expert axis takes its place in the order string.
_EXPERT_SLOT = {"etp": "tp", "ep": "ep", "edp": "dp", "pp": "pp"}

GROUP_NAMES = ("tp", "cp", "dp", "pp", "dp-cp", "tp-pp", "ep", "etp", "edp")
"""The named groups meshscope creates, in the canonical creation order (dense first, then expert)."""

COORD_AXES = ("tp", "cp", "ep", "etp", "dp", "edp", "pp")
"""Coordinates reported per rank, in the order of the `layout --json` contract."""


def parse_order(order: str) -> tuple[str, ...]:
    """Split and validate an order string: a permutation of tp, cp, ep, dp, pp."""
    tokens = tuple(t.strip() for t in order.split("-"))
    unknown = [t for t in tokens if t not in ORDER_AXES]
    if unknown:
        raise UsageError(f"order {order!r} names unknown axis {unknown[0]!r}; valid axes: {'-'.join(ORDER_AXES)}")
    dupes = sorted({t for t in tokens if tokens.count(t) > 1})
    if dupes:
        raise UsageError(f"order {order!r} names axis {dupes[0]!r} twice; give each of {'-'.join(ORDER_AXES)} once")
    missing = [a for a in ORDER_AXES if a not in tokens]
    if missing:
        raise UsageError(f"order {order!r} is missing axis {missing[0]!r}; give each of {'-'.join(ORDER_AXES)} once")
    return tokens


@dataclass(frozen=True)
class _Family:
    """One linearisation of the ranks: axes fastest-first, with their sizes and strides."""

    axes: tuple[str, ...]
    sizes: tuple[int, ...]

    @cached_property
    def strides(self) -> tuple[int, ...]:
        out, stride = [], 1
        for size in self.sizes:
            out.append(stride)
            stride *= size
        return tuple(out)

    def coords(self, rank: int) -> dict[str, int]:
        return {a: (rank // st) % sz for a, st, sz in zip(self.axes, self.strides, self.sizes)}

    def rank(self, coords: dict[str, int]) -> int:
        return sum(coords[a] * st for a, st in zip(self.axes, self.strides))

    def _span(self, axes) -> list[int]:
        """Sorted rank offsets reached by varying `axes` from coordinate zero."""
        offsets = [0]
        for axis, stride, size in zip(self.axes, self.strides, self.sizes):
            if axis in axes:
                offsets = [o + s for s in range(0, stride * size, stride) for o in offsets]
        return sorted(offsets)

    def groups(self, members: tuple[str, ...]) -> list[list[int]]:
        """Groups in which the `members` axes vary and all others are fixed, sorted by first rank."""
        offsets = self._span(members)
        bases = self._span([a for a in self.axes if a not in members])
        return [[b + o for o in offsets] for b in bases]


@dataclass(frozen=True)
class Layout:
    """A parallel layout: the world size, the size of each parallel axis, and their order.

    dp and edp are derived (they absorb whatever the other axes leave). Construction validates
    everything and raises `UsageError` with the offending value.
    """

    world: int
    """Total number of ranks."""
    tp: int = 1
    """Tensor-parallel size (dense family)."""
    cp: int = 1
    """Context-parallel size (dense family)."""
    ep: int = 1
    """Expert-parallel size (expert family)."""
    etp: int = 1
    """Expert tensor-parallel size (expert family)."""
    pp: int = 1
    """Pipeline-parallel size (both families)."""
    order: str = DEFAULT_ORDER
    """Axis order, leftmost varies fastest (Megatron RankGenerator convention)."""

    def __post_init__(self) -> None:
        for name in ("world", "tp", "cp", "ep", "etp", "pp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"--{name} {value!r} must be a positive integer")
        parse_order(self.order)
        dense = self.tp * self.cp * self.pp
        if self.world % dense:
            raise UsageError(
                f"world {self.world} is not divisible by tp*cp*pp = {self.tp}*{self.cp}*{self.pp} = {dense}; "
                f"world must be a multiple of {dense}"
            )
        expert = self.etp * self.ep * self.pp
        if self.world % expert:
            raise UsageError(
                f"world {self.world} is not divisible by etp*ep*pp = {self.etp}*{self.ep}*{self.pp} = {expert}; "
                f"world must be a multiple of {expert}"
            )
        # Both families linearise the same ranks; their pp groups must coincide (Megatron asserts the
        # same), otherwise a pipeline stage would hold different ranks for dense and expert layers.
        if self._dense.groups(("pp",)) != self._expert.groups(("pp",)):
            raise UsageError(
                f"order {self.order!r} gives different pp groups for dense axes (tp {self.tp}, cp {self.cp}, dp "
                f"{self.dp}) and expert axes (etp {self.etp}, ep {self.ep}, edp {self.edp}); "
                f"move pp to an end of the order or make the expert sizes mirror the dense ones"
            )

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Dense data-parallel size: world / (tp * cp * pp)."""
        return self.world // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        """Expert data-parallel size: world / (etp * ep * pp)."""
        return self.world // (self.etp * self.ep * self.pp)

    def size(self, axis: str) -> int:
        """Size of one axis or the product over a hyphenated combination."""
        out = 1
        for token in self._tokens(axis):
            out *= getattr(self, token)
        return out

    @property
    def sizes(self) -> dict[str, int]:
        return {a: self.size(a) for a in ("tp", "cp", "ep", "etp", "dp", "edp", "pp")}

    # -- families -------------------------------------------------------------------------------
    @cached_property
    def _dense(self) -> _Family:
        axes = tuple(a for a in parse_order(self.order) if a != "ep")
        return _Family(axes, tuple(getattr(self, a) for a in axes))

    @cached_property
    def _expert(self) -> _Family:
        slot_to_axis = {slot: axis for axis, slot in _EXPERT_SLOT.items()}
        axes = tuple(slot_to_axis[a] for a in parse_order(self.order) if a != "cp")
        return _Family(axes, tuple(getattr(self, a) for a in axes))

    def _tokens(self, name: str) -> tuple[str, ...]:
        tokens = tuple(name.split("-"))
        valid = set(DENSE_AXES) | set(EXPERT_AXES)
        for t in tokens:
            if t not in valid:
                raise UsageError(f"unknown axis {t!r} in group {name!r}; valid axes: {', '.join(COORD_AXES)}")
        if len(set(tokens)) != len(tokens):
            raise UsageError(f"group {name!r} names an axis twice")
        return tokens

    def _family_of(self, name: str) -> tuple[_Family, tuple[str, ...]]:
        tokens = self._tokens(name)
        if all(t in DENSE_AXES for t in tokens):
            return self._dense, tokens
        if all(t in EXPERT_AXES for t in tokens):
            return self._expert, tokens
        raise UsageError(
            f"group {name!r} mixes dense axes ({', '.join(DENSE_AXES)}) with expert axes "
            f"({', '.join(EXPERT_AXES)}); combine axes of one family only"
        )

    # -- coordinates ----------------------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world:
            raise UsageError(f"rank {rank} is outside the world of {self.world} (valid: 0..{self.world - 1})")

    def coords(self, rank: int) -> dict[str, int]:
        """All coordinates of a rank: tp, cp, ep, etp, dp, edp, pp."""
        self._check_rank(rank)
        both = {**self._dense.coords(rank), **self._expert.coords(rank)}
        return {a: both[a] for a in COORD_AXES}

    def rank_of(self, **coords: int) -> int:
        """Inverse of `coords`: give every axis of one family (dense: tp cp dp pp; expert: etp ep edp pp)."""
        for family in (self._dense, self._expert):
            if set(coords) == set(family.axes):
                for axis, size in zip(family.axes, family.sizes):
                    if not 0 <= coords[axis] < size:
                        raise UsageError(f"{axis} coordinate {coords[axis]} is outside 0..{size - 1}")
                return family.rank(coords)
        raise UsageError(
            f"rank_of needs all axes of one family: {', '.join(DENSE_AXES)} or {', '.join(EXPERT_AXES)}; "
            f"got {', '.join(sorted(coords))}"
        )

    # -- groups ---------------------------------------------------------------------------------
    def groups(self, name: str) -> list[list[int]]:
        """Every group of an axis or hyphenated axis combination, sorted by first rank."""
        family, tokens = self._family_of(name)
        return family.groups(tokens)

    def group_of(self, name: str, rank: int) -> list[int]:
        """The one group of `name` that contains `rank` (computed directly, not by search)."""
        family, tokens = self._family_of(name)
        self._check_rank(rank)
        c = family.coords(rank)
        base = family.rank({a: (0 if a in tokens else c[a]) for a in family.axes})
        return [base + o for o in family._span(tokens)]

    def canonical(self, name: str) -> str:
        """The name a group set is created and recorded under: the first of `GROUP_NAMES` with the
        same groups (``dp-cp`` is recorded as ``dp`` when cp is 1). One-rank groups keep their name."""
        return self._canonical_names.get(name, name)

    @cached_property
    def _canonical_names(self) -> dict[str, str]:
        out: dict[str, str] = {}
        first: dict[tuple, str] = {}
        for name in GROUP_NAMES:
            groups = self.groups(name)
            if len(groups[0]) > 1:
                out[name] = first.setdefault(tuple(map(tuple, groups)), name)
        return out

    def aliases(self) -> dict[str, list[str]]:
        """{canonical group name: the other names with the same groups}: a captured event is recorded
        under the name its communicator was created with (``ep`` all_to_alls show as ``dp`` when the
        groups are the same ranks), and this says which other dimensions that communicator serves."""
        out: dict[str, list[str]] = {}
        for name in GROUP_NAMES:
            canonical = self.canonical(name)
            if canonical != name and len(self.groups(name)[0]) > 1:
                out.setdefault(canonical, []).append(name)
        return out

    def label(self, name: str, experts: bool = True) -> str:
        """`name` joined with the single axes that share its groups, for tables: ``dp=ep`` when the EP
        groups are the DP groups. Composite names (``dp-cp``) are left out, and so are the expert axes
        (etp, ep, edp) when the model has no experts: every layout defines them, and they would only
        say that an unused axis happens to span the same ranks."""
        shown = [n for n in self.aliases().get(name, []) if "-" not in n and (experts or n not in ("etp", "ep", "edp"))]
        return "=".join([name, *shown])

    def creation_order(self) -> list[tuple[str, list[int]]]:
        """The global group-creation protocol: every rank creates these groups, in this order.

        Groups of one rank need no communicator and are skipped; a rank set already created under an earlier
        name (``dp-cp`` when cp is 1, ``edp`` equal to ``dp``...) is reused, not created again. Chapter Q3
        (group creation order is a global protocol): each rank must call new_group for every group, also
        those it is not a member of, in the same order, or initialisation and collective ordering can
        deadlock.
        """
        seen: set[tuple[int, ...]] = set()
        out: list[tuple[str, list[int]]] = []
        for name in GROUP_NAMES:
            groups = self.groups(name)
            if len(groups[0]) < 2:
                continue
            for ranks in groups:
                key = tuple(ranks)
                if key not in seen:
                    seen.add(key)
                    out.append((name, ranks))
        return out

    def brief(self) -> dict:
        """World, order and axis sizes: what rebuilds this layout (`from_json`)."""
        return {"world": self.world, "order": self.order, "sizes": self.sizes}

    @classmethod
    def from_json(cls, d: dict) -> "Layout":
        """The layout of a `brief` or `to_json` document."""
        sizes = d["sizes"]
        return cls(d["world"], tp=sizes["tp"], cp=sizes["cp"], ep=sizes["ep"], etp=sizes["etp"], pp=sizes["pp"],
                   order=d["order"])

    def to_json(self) -> dict:
        """The `meshscope layout --json` contract of the design brief."""
        return {
            "world": self.world,
            "order": self.order,
            "sizes": self.sizes,
            "ranks": [{"rank": r, **self.coords(r)} for r in range(self.world)],
            "groups": {name: self.groups(name) for name in GROUP_NAMES},
            "creation_order": [[name, ranks] for name, ranks in self.creation_order()],
        }
