"""`core.mesh_infer`: the mesh axes of groups a job named none of, from their members alone.

The pure cases first, each family of groups written out by hand or built with picotron's own
expressions (huggingface/picotron at 59714b1, ``picotron/process_group_manager.py``, copied below with
torch as it uses it); then one real trace of tests/jobs/unnamed_groups.py on 4 gloo ranks, held
against the groups and calls its docstring derives by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from meshscope.core.mesh_fit import fit
from meshscope.core.mesh_infer import infer
from meshscope.trace.assemble import layout_section

from .helpers import ROOT, trace_json

JOB = ROOT / "tests" / "jobs" / "unnamed_groups.py"


def _picotron(tp: int, cp: int, pp: int, dp: int) -> list[tuple[str, list[int]]]:
    """What ``ProcessGroupManager.__init__`` creates, in order, as ``groups/rank<R>.jsonl`` records it
    (no description; members ascending): its six ``new_subgroups_by_enumeration`` calls, verbatim."""
    grid = torch.arange(tp * cp * pp * dp).view(dp, pp, cp, tp)
    families = [
        [grid[d, p, c, :].tolist() for d in range(dp) for p in range(pp) for c in range(cp)],
        [grid[d, p, :, t].tolist() for d in range(dp) for p in range(pp) for t in range(tp)],
        [grid[d, :, c, t].tolist() for d in range(dp) for c in range(cp) for t in range(tp)],
        [grid[:, p, c, t].tolist() for p in range(pp) for c in range(cp) for t in range(tp)],
        [grid[:, p, :, t].flatten().tolist() for p in range(pp) for t in range(tp)],
        [grid[:, :, c, t].flatten().tolist() for c in range(cp) for t in range(tp)],
    ]
    return [("", sorted(g)) for family in families for g in family]


def _axes(inferred) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {}
    for members, axis in inferred.labels.items():
        out.setdefault(axis, []).append(list(members))
    return {a: sorted(gs) for a, gs in sorted(out.items())}


def test_picotrons_creation_order_names_its_axes_dp2_pp2_cp1_tp2():
    """dp 2 x pp 2 x cp 1 x tp 2 on 8 ranks (picotron's grid, tp fastest): its six families in its order
    prove picotron's names; cp's 1-rank groups join nobody, and cp_dp, which is dp at cp 1, reads dp."""
    inferred = infer(8, _picotron(tp=2, cp=1, pp=2, dp=2))
    assert inferred.convention == "picotron"
    assert _axes(inferred) == {
        "cp": [[r] for r in range(8)],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "pp-dp": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
    }
    # picotron's dp is outermost, outside pp, which no `Layout` order has (Megatron's pp stays at an end):
    # the layout is the job's mesh dims, tp fastest, in picotron's names
    found = fit(8, _axes(inferred))
    assert found.ok and found.layout is None and found.order == ("tp", "pp", "dp")
    assert layout_section(8, _axes(inferred), inferred)["text"] == (
        "tp 2 x pp 2 x dp 2 (order tp-pp-dp); names inferred: the groups were created in the order of picotron's "
        "ProcessGroupManager (tp, cp, pp, dp, cp_dp, pp_dp), and the job named none of them")


def test_the_same_groups_in_another_order_prove_no_convention_and_read_by_stride():
    """picotron's groups, its DP family created first: the members alone give a 2 x 2 x 2 mesh named by
    stride (tp's stride 1 -> axis0, pp's 2 -> axis1, dp's 4 -> axis2; pp_dp -> axis1-axis2)."""
    created = _picotron(tp=2, cp=1, pp=2, dp=2)
    dp_first = created[16:20] + created[:16] + created[20:]  # tp 4 groups, cp 8, pp 4, dp 4, cp_dp 4, pp_dp 2
    inferred = infer(8, dp_first)
    assert inferred.convention == "strides"
    assert _axes(inferred) == {
        "axis0": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "axis1": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "axis1-axis2": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "axis2": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }


def test_a_2x2x2_mesh_is_named_by_stride_whatever_the_creation_order():
    """DESIGN.md's golden world 8 (tp [[0,1],...], dp [[0,2],...], pp [[0,4],...]), created outermost
    first, plus tp x pp (no progression: [0, 1, 4, 5]): axis0..axis2 by stride, the product joined."""
    families = {
        "outer": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "middle": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "inner": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "inner x outer": [[0, 1, 4, 5], [2, 3, 6, 7]],
    }
    inferred = infer(8, [("", g) for gs in families.values() for g in gs])
    assert inferred.convention == "strides"
    assert _axes(inferred) == {"axis0": families["inner"], "axis1": families["middle"], "axis2": families["outer"],
                               "axis0-axis2": families["inner x outer"]}
    section = layout_section(8, _axes(inferred), inferred)
    assert section["text"] == ("axis0 2 x axis1 2 x axis2 2 (order axis0-axis1-axis2); names inferred from the "
                               "groups' strides (axis0 innermost): the job named none of them")
    assert section["inferred"] == "strides"


def test_an_irregular_family_stays_group():
    """[0, 1, 3] and [2, 4, 5] partition 6 ranks but are no progressions of one stride: no axis. A regular
    family beside it (pairs of stride 1) is still one."""
    irregular = [("", [0, 1, 3]), ("", [2, 4, 5])]
    assert infer(6, irregular).labels == {}
    inferred = infer(6, irregular + [("", [0, 1]), ("", [2, 3]), ("", [4, 5])])
    assert inferred.labels == {(0, 1): "axis0", (2, 3): "axis0", (4, 5): "axis0"}


def test_groups_that_do_not_partition_the_world_stay_group():
    """Progressions of stride 1 that overlap ([0,1], [1,2], [2,3]), or leave ranks out ([0,1] alone):
    no family covers the world once, so no axis."""
    assert infer(4, [("", [0, 1]), ("", [1, 2]), ("", [2, 3])]).labels == {}
    assert infer(4, [("", [0, 1])]).labels == {}
    assert infer(4, [("", [0, 1])]).convention == ""


def test_a_group_of_every_rank_is_the_world():
    """DeepSpeed's ZeRO over the whole world: plain new_group(ranks) of every rank, made several times."""
    inferred = infer(4, [("", [0, 1, 2, 3])] * 3)
    assert inferred.labels == {(0, 1, 2, 3): "world"} and inferred.convention == ""


def test_groups_the_job_named_are_its_own_and_calls_alone_suffice():
    """A description meshscope does not know (subgroups.py's ``gloo_pairs``) is a name: its members are
    never inferred, calls on them read `group` whatever. Without any creation record, the groups the
    calls were issued on are the members."""
    named = [("gloo_pairs", [0, 1]), ("gloo_pairs", [2, 3])]
    assert infer(4, named + [("", [0, 2]), ("", [1, 3])], [(0, 1), (2, 3)]).labels == {}
    assert _axes(infer(4, [], [(0, 1), (2, 3), (0, 2), (1, 3)])) == {"axis0": [[0, 1], [2, 3]],
                                                                        "axis1": [[0, 2], [1, 3]]}


# -- a real trace ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unnamed(tmp_path_factory):
    """tests/jobs/unnamed_groups.py on 4 gloo ranks (tp 2 x dp 2), 3 steps: one trace for the module."""
    return trace_json(tmp_path_factory.mktemp("unnamed") / "run", "--nproc-per-node", 4, [str(JOB), "--steps", "3"])


def test_unnamed_tp_and_dp_groups_are_two_inferred_axes(unnamed):
    """The job's docstring: TP [0,1], [2,3] (stride 1) and DP [0,2], [1,3] (stride 2), each step 1 forward
    all_reduce in ``row`` (64 B) on TP, then 1 outside every module (128 B) on DP."""
    proc, doc = unnamed
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["axes"] == {"axis0": [[0, 1], [2, 3]], "axis1": [[0, 2], [1, 3]]}
    for per_rank in doc["per_rank"]:
        rank = per_rank["rank"]
        tp, dp = [rank - rank % 2, rank - rank % 2 + 1], [rank % 2, rank % 2 + 2]
        assert [s["step"] for s in per_rank["steps"]] == [0, 1, 2]
        for step in per_rank["steps"]:
            got = [(e["op"], e["axis"], e["group"], e["phase"], e["region"], e["bytes_in"]) for e in step["events"]]
            assert got == [("all_reduce", "axis0", tp, "forward", "row", 64),
                           ("all_reduce", "axis1", dp, "other", "", 128)], (rank, step["step"])
    assert doc["layout"]["text"] == ("axis0 2 x axis1 2 (order axis0-axis1); names inferred from the groups' "
                                     "strides (axis0 innermost): the job named none of them")
    assert doc["layout"]["inferred"] == "strides"


def test_each_ranks_ledger_names_the_inferred_axes_as_the_result_does(unnamed):
    """The ledger files, read raw, against the job's docstring (per step: TP's [r - r%2, r - r%2 + 1] then
    DP's [r%2, r%2 + 2], 3 steps) in the axes the result inferred (TP axis0, DP axis1), and against
    result.json's own per-rank calls: each rank labelled its ledger itself, so no file says ``group``."""
    proc, doc = unnamed
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Path(doc["run_dir"])
    result = json.loads((run / "result.json").read_text())
    assert [p["rank"] for p in result["per_rank"]] == [0, 1, 2, 3]
    for per_rank in result["per_rank"]:
        rank = per_rank["rank"]
        tp, dp = [rank - rank % 2, rank - rank % 2 + 1], [rank % 2, rank % 2 + 2]
        lines = (run / "ledgers" / f"rank{rank}.jsonl").read_text().splitlines()
        ledger = [(e["axis"], e["group"]) for e in map(json.loads, lines)]
        assert ledger == [("axis0", tp), ("axis1", dp)] * 3, rank
        assert ledger == [(e["axis"], e["group"]) for s in per_rank["steps"] for e in s["events"]], rank
