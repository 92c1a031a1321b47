"""Layout math: golden cases from the design brief and the chapter (docs/chapter.md), round trips, brute force."""

import itertools
import json
import random

import pytest

from meshscope.core.errors import UsageError
from meshscope.core.mesh import GROUP_NAMES, Layout, parse_order

from .helpers import cli, cli_here


def test_chapter_world4_tp2():
    layout = Layout(4, tp=2)
    assert layout.groups("tp") == [[0, 1], [2, 3]]
    assert layout.groups("dp") == [[0, 2], [1, 3]]
    # rank = tp_rank + tp_size * dp_rank (chapter Q1)
    for r in range(4):
        c = layout.coords(r)
        assert r == c["tp"] + 2 * c["dp"]


def test_golden_world8_tp2_pp2():
    layout = Layout(8, tp=2, pp=2)
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("tp-pp") == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_golden_world8_etp2_ep2():
    layout = Layout(8, etp=2, ep=2)
    assert layout.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.edp == 2


def test_chapter_pipeline_mapping_pp_leftmost():
    layout = Layout(4, pp=2, order="pp-tp-cp-ep-dp")
    assert layout.groups("pp") == [[0, 1], [2, 3]]
    assert layout.groups("dp") == [[0, 2], [1, 3]]


def _brute_force_groups(layout: Layout, name: str) -> list[list[int]]:
    """Independent enumeration: ranks sharing every coordinate outside `name`'s axes."""
    tokens = name.split("-")
    family = ("tp", "cp", "dp", "pp") if all(t in ("tp", "cp", "dp", "pp") for t in tokens) else ("etp", "ep", "edp", "pp")
    buckets: dict[tuple, list[int]] = {}
    for r in range(layout.world):
        c = layout.coords(r)
        key = tuple(c[a] for a in family if a not in tokens)
        buckets.setdefault(key, []).append(r)
    return sorted(sorted(g) for g in buckets.values())


def _brute_force_coords(layout: Layout) -> dict[int, dict[str, int]]:
    """Enumerate coordinates odometer-style, leftmost axis fastest, for both families."""
    order = parse_order(layout.order)
    out: dict[int, dict[str, int]] = {r: {} for r in range(layout.world)}
    for family in (("tp", "cp", "dp", "pp"), ("etp", "ep", "edp", "pp")):
        slot = {"etp": "tp", "edp": "dp"}
        axes = sorted(family, key=lambda a: order.index(slot.get(a, a)))
        sizes = [layout.size(a) for a in axes]
        ranges = [range(s) for s in reversed(sizes)]  # product varies the last fastest
        for rank, combo in enumerate(itertools.product(*ranges)):
            for a, v in zip(reversed(axes), combo):
                out[rank][a] = v
    return out


@pytest.mark.parametrize("seed", range(40))  # RNG seed
def test_random_layouts_against_brute_force(seed):
    rng = random.Random(seed)
    sizes = {a: rng.choice([1, 1, 2, 3]) for a in ("tp", "cp", "pp")}
    dp = rng.choice([1, 2, 3])
    world = sizes["tp"] * sizes["cp"] * sizes["pp"] * dp
    # expert family over the same ranks: split tp*cp*dp into etp*ep*edp
    rest = world // sizes["pp"]
    etp = rng.choice([d for d in (1, 2, 3) if rest % d == 0])
    ep = rng.choice([d for d in (1, 2, 3) if (rest // etp) % d == 0])
    order = "-".join(rng.sample(["tp", "cp", "ep", "dp", "pp"], 5))
    try:
        layout = Layout(world, tp=sizes["tp"], cp=sizes["cp"], pp=sizes["pp"], etp=etp, ep=ep, order=order)
    except UsageError as exc:
        # only legitimate refusal: the two families would disagree on the pipeline stages
        assert "different pp groups" in str(exc)
        return
    coords = _brute_force_coords(layout)
    for r in range(world):
        c = layout.coords(r)
        assert {k: c[k] for k in coords[r]} == coords[r]
        assert layout.rank_of(**{a: c[a] for a in ("tp", "cp", "dp", "pp")}) == r
        assert layout.rank_of(**{a: c[a] for a in ("etp", "ep", "edp", "pp")}) == r
    for name in GROUP_NAMES:
        groups = layout.groups(name)
        assert groups == _brute_force_groups(layout, name)
        for g in groups:
            for r in g:
                assert layout.group_of(name, r) == g


def test_groups_partition_world_and_are_orthogonal():
    layout = Layout(24, tp=2, cp=3, pp=2)
    for name in ("tp", "cp", "dp", "pp"):
        flat = sorted(r for g in layout.groups(name) for r in g)
        assert flat == list(range(24))
    # a tp group and a dp group share exactly one rank or none
    for gt in layout.groups("tp"):
        for gd in layout.groups("dp"):
            assert len(set(gt) & set(gd)) <= 1


def test_creation_order_dedups_and_skips_singletons():
    layout = Layout(4, tp=2)
    order = layout.creation_order()
    assert order == [("tp", [0, 1]), ("tp", [2, 3]), ("dp", [0, 2]), ("dp", [1, 3]), ("edp", [0, 1, 2, 3])]
    assert layout.canonical("dp-cp") == "dp" and layout.canonical("tp-pp") == "tp"


@pytest.mark.parametrize("kwargs, needle", [
    (dict(world=5, tp=2), "world 5 is not divisible by tp*cp*pp"),
    (dict(world=4, tp=0), "--tp 0 must be a positive integer"),
    (dict(world=4, order="tp-cp-dp-pp"), "missing axis 'ep'"),
    (dict(world=4, order="tp-tp-ep-dp-pp"), "names axis 'tp' twice"),
    (dict(world=4, order="tp-xx-ep-dp-pp"), "unknown axis 'xx'"),
    (dict(world=6, ep=4), "etp*ep*pp"),
])
def test_bad_layouts(kwargs, needle):
    with pytest.raises(UsageError, match=needle.replace("*", r"\*")):
        Layout(**kwargs)


def test_mixed_family_group_rejected():
    with pytest.raises(UsageError, match="mixes dense axes"):
        Layout(4, tp=2).groups("tp-ep")


def test_layout_json_contract():
    proc = cli("layout", "--world", 8, "--tp", 2, "--pp", 2, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"world", "order", "sizes", "ranks", "groups", "creation_order"}
    assert doc["sizes"] == {"tp": 2, "cp": 1, "ep": 1, "etp": 1, "dp": 2, "edp": 4, "pp": 2}
    assert doc["ranks"][5] == {"rank": 5, "tp": 1, "cp": 0, "ep": 0, "etp": 0, "dp": 0, "edp": 1, "pp": 1}
    assert set(doc["groups"]) == set(GROUP_NAMES)
    assert doc["groups"]["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert doc["creation_order"][0] == ["tp", [0, 1]]


@pytest.mark.parametrize("args, needle", [
    (("layout", "--world", 5, "--tp", 2), "world 5 is not divisible"),
    (("layout", "--world", 4, "--order", "tp-dp"), "missing axis"),
    (("layout", "--world", "x"), "invalid int value"),
    (("run", "nope"), "unknown experiment 'nope'"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    proc = cli_here(*args)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""
