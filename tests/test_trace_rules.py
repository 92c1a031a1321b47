"""The pure parts of `meshscope trace`: axis labels, the layout behind groups, and each check caught
on a synthetic ledger (so that none of them can pass vacuously)."""

from __future__ import annotations

import pytest

from meshscope.core.axes import axis_of, is_mesh_axis
from meshscope.core.events import CommEvent
from meshscope.core.mesh import Layout
from meshscope.core.mesh_fit import dims, fit_layout
from meshscope.core.steady import of_ranks
from meshscope.trace import checks
from meshscope.trace.assemble import layout_section


@pytest.mark.parametrize("desc, axis", [
    ("default_pg", "world"), ("mesh_tp", "tp"), ("mesh_dp_cp", "dp_cp"), ("mesh_dp_shard", "dp_shard"),
    ("mesh_dim_0", "dim_0"), ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("DATA_PARALLEL_GROUP", "dp"), ("DATA_PARALLEL_GROUP_GLOO", "dp"), ("DATA_PARALLEL_GROUP_WITH_CP", "dp-cp"),
    ("CONTEXT_PARALLEL_GROUP", "cp"), ("MODEL_PARALLEL_GROUP", "tp-pp"), ("TENSOR_AND_DATA_PARALLEL_GROUP", "tp-dp"),
    ("EXPERT_MODEL_PARALLEL_GROUP", "ep"), ("EXPERT_TENSOR_PARALLEL_GROUP", "etp"),
    ("EXPERT_DATA_PARALLEL_GROUP", "edp"), ("EXPERT_DATA_PARALLEL_GROUP_GLOO", "edp"),
    ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "etp-ep"), ("EMBEDDING_GROUP", "embedding"),
    ("HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L1", "cp.l1"), ("something_else", "group"), ("", "group"),
    ("tp", "tp"), ("dp", "dp"), ("metrics", "group"),
])
def test_axis_labels(desc, axis):
    assert axis_of(desc) == axis


MEGATRON_CORE_0_19_2 = {
    # every group_desc that megatron/core/parallel_state.py of megatron-core 0.19.2 passes to create_group
    # (the wheel megatron_core-0.19.2-cp312; 0.19.2 needs Python 3.12, CI runs 3.11, so the names are
    # copied here), the f-strings with the descriptions and levels they are called with; the labels by
    # hand from the RankGenerator token each group is built from
    "TENSOR_MODEL_PARALLEL_GROUP": "tp", "PIPELINE_MODEL_PARALLEL_GROUP": "pp", "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_GLOO": "dp", "DATA_PARALLEL_GROUP_WITH_CP": "dp-cp", "DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp-cp",
    "DATA_PARALLEL_GROUP_WITH_CP_AG": "dp-cp", "CONTEXT_PARALLEL_GROUP": "cp", "MODEL_PARALLEL_GROUP": "tp-pp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp-dp", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp-dp-cp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp-cp", "EMBEDDING_GROUP": "embedding",
    "POSITION_EMBEDDING_GROUP": "position_embedding", "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp", "EXPERT_DATA_PARALLEL_GROUP": "edp", "EXPERT_DATA_PARALLEL_GROUP_GLOO": "edp",
    "EXPERT_DATA_PARALLEL_GROUP_AG": "edp", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "etp-ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "etp-ep-pp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp-cp.intra", "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp-cp.intra",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "dp-cp.instance",
    "HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L0": "cp.l0", "HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L1": "cp.l1",
    "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0": "edp.l0", "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_GLOO_L1": "edp.l1",
    "HYBRID_DP_CP_GROUP_4": "dp-cp.hybrid4",
    # new in 0.19 (generalized tensor parallelism with weight rematerialisation)
    "GTP_WEIGHT_REMAT_GROUP": "gtp", "EXPERT_GTP_WEIGHT_REMAT_GROUP": "egtp",
    "DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "gtp-dp", "DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT": "gtp-dp-cp",
    "EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "egtp-edp",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP": "etp-ep-egtp-pp",
}


def test_every_group_megatron_core_0_19_2_creates_has_its_axis():
    assert {desc: axis_of(desc) for desc in MEGATRON_CORE_0_19_2} == MEGATRON_CORE_0_19_2
    named = {"embedding", "position_embedding"}
    assert all(is_mesh_axis(a) != (a in named or "." in a) for a in MEGATRON_CORE_0_19_2.values())


def test_mesh_axes_and_named_groups():
    assert is_mesh_axis("tp") and is_mesh_axis("tp-pp") and is_mesh_axis("dp_shard")
    assert not any(map(is_mesh_axis, ("world", "group", "embedding", "cp.l1")))


def test_fit_finds_the_golden_layouts_and_refuses_what_fits_none():
    golden = Layout(8, tp=2, pp=2)
    found = fit_layout(8, {a: golden.groups(a) for a in ("tp", "dp", "pp")})
    assert found.ok and all(found.layout.groups(a) == golden.groups(a) for a in ("tp", "dp", "pp"))
    assert found.sizes == {"tp": 2, "dp": 2, "pp": 2}
    # pp fastest (the pipeline experiment's order) is found too
    pp_first = Layout(4, pp=2, order="pp-tp-cp-ep-dp")
    assert fit_layout(4, {"pp": pp_first.groups("pp"), "dp": pp_first.groups("dp")}).layout.groups("pp") == [[0, 1], [2, 3]]
    # a dense Megatron job: its parallel_state creates the expert groups too, etp = tp and edp = dp at
    # ep 1; the layout counts each dim once and says the other name has its groups
    dense = Layout(1024, tp=8)
    found = fit_layout(1024, {a: dense.groups(b) for a, b in (("tp", "tp"), ("etp", "tp"), ("dp", "dp"), ("edp", "dp"))})
    assert found.sizes == {"tp": 8, "dp": 128} and found.same == (("etp", "tp"), ("edp", "dp"))
    assert found.describe().startswith("tp 8, dp 128 (order tp-cp-ep-dp-pp; etp has the groups of tp; edp has the "
                                       "groups of dp; meshscope layout --world 1024 --tp 8 --etp 8")
    moe = Layout(64, tp=2, ep=4)  # with experts the expert axes are dims of their own
    found = fit_layout(64, {a: moe.groups(a) for a in ("tp", "dp", "ep", "edp")})
    assert found.sizes == {"tp": 2, "ep": 4, "dp": 32, "edp": 16} and not found.same
    bad = fit_layout(4, {"tp": [[0, 3], [1, 2]]})
    assert not bad.ok and "fit no tp-cp-ep-dp-pp order" in bad.reason
    assert dims(4, {"dp_shard": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}).order == ("tp", "dp_shard")
    assert "missing" in dims(8, {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "pp": [[0, 4], [1, 5], [2, 6], [3, 7]]}).reason


def _unflattened(world: int, names: tuple[str, ...], degrees: tuple[int, ...], flattened=()) -> dict:
    """The groups of each dim of a row-major mesh (the last dim fastest, as torch's DeviceMesh lays out
    an unflattened world); `flattened` adds (name, dims) as torch's ``_flatten`` of those dims does."""
    strides = {n: 1 for n in names}
    for i in range(len(names) - 2, -1, -1):
        strides[names[i]] = strides[names[i + 1]] * degrees[i + 1]
    sizes = dict(zip(names, degrees))

    def groups(dims):
        span = [0]
        for d in dims:
            span = [r + k * strides[d] for r in span for k in range(sizes[d])]
        return sorted({tuple(sorted(base + r for r in span)) for base in range(world)
                       if all((base // strides[d]) % sizes[d] == 0 for d in dims)})

    return {**{n: [list(g) for g in groups([n])] for n in names}, **{f: [list(g) for g in groups(ds)] for f, ds in flattened}}


def _titan(world, dp_replicate, dp_shard, tp, cp=1, pp=1, ep=1, etp=1) -> dict:
    """The axes torchtitan 0.2.2's ParallelDims.build_mesh makes (distributed/parallel_dims.py): the world
    unflattened into its dataloading, dense and sparse meshes, and loss_mesh (batch x cp); every dim of
    size 1 too, as a fake world's created groups list them."""
    fsdp, efsdp = dp_shard * cp, dp_shard * cp * tp // (etp * ep)
    dataloading = _unflattened(world, ("pp", "batch", "cp", "tp"), (pp, dp_replicate * dp_shard, cp, tp),
                               flattened=[("loss_mesh", ("batch", "cp"))])
    dense = _unflattened(world, ("pp", "dp_replicate", "fsdp", "tp"), (pp, dp_replicate, fsdp, tp))
    sparse = _unflattened(world, ("pp", "dp_replicate", "efsdp", "ep", "etp"), (pp, dp_replicate, efsdp, ep, etp))
    return {**sparse, **dense, **dataloading}


def test_torchtitans_hsdp_reads_as_both_its_dims_and_nothing_derived():
    """HSDP 4 x 32 x TP 8 at 1,024 ranks: the layout names dp_replicate and fsdp (dp_shard x cp, torchtitan
    0.2.2's dim), not "dp 128"; batch, loss_mesh and efsdp are products of those dims; the size-1 dims
    (cp, pp, ep, etp) are no axes of the layout, and nothing derives an edp."""
    axes = _titan(1024, dp_replicate=4, dp_shard=32, tp=8)
    assert (len(axes["fsdp"][0]), len(axes["batch"][0]), len(axes["efsdp"][0]), len(axes["ep"][0])) == (32, 128, 256, 1)
    section = layout_section(1024, axes)
    assert section["text"] == "tp 8 x fsdp 32 x dp_replicate 4 (order tp-fsdp-dp_replicate)"
    assert section["sizes"] == {"tp": 8, "fsdp": 32, "dp_replicate": 4} and "layout" not in section
    # FSDP alone over dp_shard: batch, loss_mesh and fsdp are the same groups, one dim under three names
    assert layout_section(1024, _titan(1024, dp_replicate=1, dp_shard=128, tp=8))["text"] == (
        "tp 8 x batch/fsdp/loss_mesh 128 (order tp-batch/fsdp/loss_mesh)")


def test_meshscope_vocabulary_still_fits_a_layout_without_derived_expert_axes():
    """Dims that are all tp, cp, ep, etp, dp, edp, pp read as `meshscope layout` names them; a singleton
    ep or etp (a dense model's) adds no edp, an ep above 1 does."""
    dense = Layout(8, tp=2, pp=2)
    axes = {a: dense.groups(a) for a in ("tp", "dp", "pp")} | {"ep": [[r] for r in range(8)], "etp": [[r] for r in range(8)]}
    assert layout_section(8, axes)["sizes"] == {"tp": 2, "dp": 2, "pp": 2}
    moe = Layout(8, tp=2, ep=2)
    assert layout_section(8, {a: moe.groups(a) for a in ("tp", "ep")})["sizes"] == {"tp": 2, "ep": 2, "dp": 4, "edp": 4}


def _e(rank, seq, op, group=(0, 1), *, step=2, b=64, ins=None, outs=None, peer=None, axis="tp", t=0.0):
    return CommEvent(rank, seq, op, axis, tuple(group), "forward", "float32", b if op != "recv" else 0,
                     b if op != "send" else 0, "", None, ins, outs, peer, step, t)


def test_group_agreement_catches_a_size_and_a_missing_call():
    same = [_e(r, 0, "all_reduce") for r in (0, 1)]
    assert checks.group_agreement(same, {0, 1}).passed
    sizes = [_e(0, 0, "all_reduce", b=64), _e(1, 0, "all_reduce", b=32)]
    c = checks.group_agreement(sizes, {0, 1})
    assert c.failed and "call #0" in c.detail and "32->32" in c.detail
    missing = same + [_e(0, 1, "all_gather")]
    c = checks.group_agreement(missing, {0, 1})
    assert c.failed and "rank 1 issued no call #1" in c.detail


def test_p2p_pairs_catch_an_unanswered_send_and_a_size():
    ok = [_e(0, 0, "send", peer=1, axis="world"), _e(1, 0, "recv", peer=0, axis="world")]
    assert checks.p2p_pairs(ok, {0, 1}).passed
    c = checks.p2p_pairs(ok[:1], {0, 1})
    assert c.failed and "never receives" in c.detail
    c = checks.p2p_pairs([ok[0], _e(1, 0, "recv", peer=0, axis="world", b=32)], {0, 1})
    assert c.failed and "64 B sent, 32 B expected" in c.detail


def test_a2a_mirror_catches_splits_computed_differently():
    good = [_e(0, 0, "all_to_all", ins=(3, 1), outs=(3, 2)), _e(1, 0, "all_to_all", ins=(2, 5), outs=(1, 5))]
    assert checks.a2a_mirror(good, {0, 1}).passed
    bad = [good[0], _e(1, 0, "all_to_all", ins=(2, 5), outs=(4, 5))]
    c = checks.a2a_mirror(bad, {0, 1})
    assert c.failed and "rank 0 sends 1 rows to rank 1, which expects 4" in c.detail


def test_steady_steps_report_a_change_and_accept_routing():
    def step(k, b=64, ins=(1, 1)):
        return [_e(0, 2 * k, "all_reduce", step=k, b=b), _e(0, 2 * k + 1, "all_to_all", step=k, ins=ins, outs=ins)]
    def check(events, complete):
        return checks.steady_steps(events, of_ranks(events, {0: complete}))
    same = step(1) + step(2) + step(3) + step(4)
    assert check(same, 5).passed
    routed = step(1) + step(2) + step(3, ins=(2, 0)) + step(4)
    c = check(routed, 5)
    assert c.passed and "routing" in c.detail and "steps [3]" in c.detail
    grown = step(1) + step(2) + step(3, b=128) + step(4)
    c = check(grown, 5)
    assert c.failed and "step 3 call 0" in c.detail
    short = check(step(1) + step(2, b=128), 3)
    assert short.status == "not_checked" and "trace more steps" in short.detail


def test_axes_partition_catches_overlap_and_a_gap():
    assert checks.axes_partition({"tp": [[0, 1], [2, 3]], "world": [[0, 1, 2, 3]]}, {0, 1, 2, 3}, 4).passed
    c = checks.axes_partition({"tp": [[0, 1], [1, 2]]}, {0, 1, 2}, 3)
    assert c.failed and "rank 1 is in two tp groups" in c.detail
    c = checks.axes_partition({"tp": [[0, 1]]}, {0, 1, 2, 3}, 4)
    assert c.failed and "leave out ranks [2, 3]" in c.detail


def test_step_boundaries_count_the_outermost_step_of_the_first_optimizer():
    import torch

    from meshscope.capture.job_context import JobContext

    class Wrapper(torch.optim.Optimizer):
        """Steps an inner optimizer created before it, as ZeroRedundancyOptimizer does."""

        def __init__(self, params):
            self.inner = torch.optim.SGD(params, lr=0.1)
            super().__init__(self.inner.param_groups, {})

        def step(self, closure=None):
            self.inner.step()

    seen = []
    ctx = JobContext(on_step=seen.append)
    ctx.install()
    try:
        w = torch.nn.Parameter(torch.ones(2))
        wrapped, other = Wrapper([w]), torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])
        for _ in range(3):
            w.grad = torch.ones(2)
            wrapped.step()      # one boundary: inner and outer step are one call
            other.step()        # not the first optimizer created: no boundary
        assert seen == [1, 2, 3] and ctx.optimizers_seen == 9
        named = JobContext(step_optimizer="Adam", on_step=seen.append)
        assert named._is_boundary(other) and not named._is_boundary(wrapped.inner)
    finally:
        ctx.remove()
    assert ctx.phase() == "other" and ctx.region() == ""


def test_a_flattened_dim_does_not_break_the_mesh_and_classes_keep_places_apart():
    from meshscope.trace.fake.classes import rank_classes

    axes = {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "cp": [[0, 2], [1, 3], [4, 6], [5, 7]],
            "dp": [[0, 4], [1, 5], [2, 6], [3, 7]], "dp_cp": [[0, 2, 4, 6], [1, 3, 5, 7]]}
    assert dims(8, axes).order == ("tp", "cp", "dp")
    # groups without descriptions: rank 1 is last in tp and first in dp, rank 2 the other way round
    classes = rank_classes(4, [("", [0, 1]), ("", [2, 3]), ("", [0, 2]), ("", [1, 3])])
    assert sorted(classes.values()) == [[0], [1], [2], [3]]


def test_classes_keep_three_places_only_where_the_first_ranks_showed_an_order():
    """tp 3 x pp 3 (world 9, tp inner): the traced ranks' sends on pp make its middle stage a place of
    its own; on tp, where only collectives rooted at the first member ran, the middle and the last
    member are one class. A send on the default group orders its members; one on a group no rank saw
    created keeps three places everywhere."""
    from meshscope.trace.fake.classes import DEFAULT, ORDERED, ordered_kinds, rank_classes

    groups = [("tp", [0, 1, 2]), ("tp", [3, 4, 5]), ("tp", [6, 7, 8]),
              ("pp", [0, 3, 6]), ("pp", [1, 4, 7]), ("pp", [2, 5, 8])]

    def call(op, group, peer=None):
        return CommEvent(rank=0, seq=0, op=op, axis="", group=tuple(group), phase="other", dtype="float32",
                         bytes_in=4, bytes_out=4, peer=peer)

    rooted_at_first = [call("all_reduce", [0, 1, 2]), call("broadcast", [0, 1, 2], peer=0)]
    assert ordered_kinds(9, groups, rooted_at_first) == set()
    assert ordered_kinds(9, groups, [*rooted_at_first, call("send", [0, 3, 6], peer=3)]) == {"pp"}
    assert ordered_kinds(9, groups, [call("gather", [6, 7, 8], peer=8)]) == {"tp"}
    # on the default group, the smallest groups holding both ends: tp's for 0 -> 1, none but the world's for 0 -> 4
    assert ordered_kinds(9, groups, [call("send", range(9), peer=1)]) == {"tp"}
    assert ordered_kinds(9, groups, [call("send", range(9), peer=4)]) == {DEFAULT}
    assert ordered_kinds(9, groups, [call("send", [0, 4], peer=4)]) == ORDERED
    assert sorted(rank_classes(6, [], {DEFAULT}).values()) == [[0], [1, 3], [2, 4], [5]]  # middles by parity
    assert sorted(rank_classes(6, [], set()).values()) == [[0], [1, 2, 3, 4, 5]]
    by_pp = rank_classes(9, groups, {"pp"})
    assert sorted(by_pp.values()) == [[0], [1, 2], [3], [4, 5], [6], [7, 8]]
    assert sorted(rank_classes(9, groups, set()).values()) == [[0], [1, 2], [3, 6], [4, 5, 7, 8]]
    assert len(rank_classes(9, groups)) == 9
