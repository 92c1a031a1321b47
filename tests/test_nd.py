"""nd_mlp: TP x PP x DP (and an MoE stage) on one world: layout, composed predictor, and one gloo launch.

Shapes of every test (S): hidden D 64, ffn H 128, batch 16 in M 2 microbatches -> b = 8 rows; tp 2,
pp 2, dp 2 on world 8. Figures derived by hand:
  activation / its gradient [b, D] fp32     8 * 64 * 4        = 2048 B
  its 1/tp slab (scatter/gather)            4 * 64 * 4        = 1024 B
  fc1 shard [H/T, D], fc2 shard [D, H/T]    64 * 64 * 4       = 16384 B each; an expert [D, D] as well
Rank 0 is stage 0 (tp [0,1], dp [0,2], pp [0,4]); rank 4 is stage 1 (tp [4,5], dp [4,6]).
"""

from __future__ import annotations

import re

import pytest

from meshscope import experiments
from meshscope.core.errors import UsageError
from meshscope.core.events import counts
from meshscope.core.mesh import Layout
from meshscope.doctor import diagnose
from meshscope.experiments.nd.predict import axis_breakdown, predict_step

from .helpers import cli_here, failed_checks, run_many

S = dict(hidden=64, ffn=128, batch=16, microbatches=2)
ACT, SLAB, SHARD = 2048, 1024, 16384


def cfg_of(**overrides):
    return experiments.get("nd_mlp").config({**S, **overrides})


def op(count, bytes_in, bytes_out):
    return {"count": count, "bytes_in": bytes_in, "bytes_out": bytes_out}


def p2p(per_message):
    """2 microbatches: 2 sends and 2 receives across the stage's one boundary."""
    return {"send": op(2, 2 * per_message, 0), "recv": op(2, 0, 2 * per_message)}


DP_SYNC = {"dp": {"all_reduce": op(2, 2 * SHARD, 2 * SHARD)}}  # fc1 and fc2 shards, once per step


def breakdown(rank, **overrides):
    return axis_breakdown(predict_step(cfg_of(**overrides)), rank)


# -- layout ------------------------------------------------------------------------------------------
def test_dense_groups_are_the_default_orders_and_ep_is_carved_from_dp():
    cfg = cfg_of(moe=True)
    layout, default = cfg.layout, Layout(8, tp=2, pp=2)
    for axis in ("tp", "dp", "pp"):
        assert layout.groups(axis) == default.groups(axis)
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # ep members share tp and pp and differ in dp: different tokens; edp = the tp copies of an expert.
    assert layout.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("edp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.aliases() == {"dp": ["dp-cp", "ep"], "tp": ["edp"]}
    assert (layout.label("dp"), layout.label("tp"), layout.label("pp")) == ("dp=ep", "tp=edp", "pp")
    assert layout.label("tp", experts=False) == "tp"  # a dense model's unused expert axes are not named


# -- predictor, per axis -----------------------------------------------------------------------------
def test_summed_loss_per_axis():
    # Stage 0 and 1 alike: fc2.out AR forward and backward per microbatch (4 x 2048 B); fc1.in issues
    # nothing under summed-loss; activations out / gradients in (or the reverse) on pp.
    for rank in (0, 4):
        assert breakdown(rank) == {"tp": {"all_reduce": op(4, 4 * ACT, 4 * ACT)}, "pp": p2p(ACT), **DP_SYNC}


def test_replicated_loss_prunes_only_the_first_stages_input_edge():
    # Stage 0: fc2.out AR forward only (g); its input is data, so f's backward AR is pruned: 2 AR.
    # Stage 1: its input is a received leaf that needs grad: 2 forward AR + 2 backward AR (f).
    assert breakdown(0, semantics="replicated-loss")["tp"] == {"all_reduce": op(2, 2 * ACT, 2 * ACT)}
    assert breakdown(4, semantics="replicated-loss")["tp"] == {"all_reduce": op(4, 4 * ACT, 4 * ACT)}


def test_scatter_gather_summed_loss():
    # P2P carries the 1024 B slab. Sender: the slice and its zero-filled gradient issue nothing (the
    # fc2.out AR backward sums the slabs). Receiver: AG forward (1024 -> 2048), RS backward (2048 -> 1024).
    assert breakdown(0, pp_scatter_gather=True) == {"tp": {"all_reduce": op(4, 4 * ACT, 4 * ACT)},
                                                   "pp": p2p(SLAB), **DP_SYNC}
    assert breakdown(4, pp_scatter_gather=True)["tp"] == {"all_reduce": op(4, 4 * ACT, 4 * ACT),
                                                          "all_gather": op(2, 2 * SLAB, 2 * ACT),
                                                          "reduce_scatter": op(2, 2 * ACT, 2 * SLAB)}


def test_scatter_gather_replicated_loss():
    # Sender: the gradient slab it receives is all-gathered before the identity g (AG backward).
    # Receiver: AG forward, its backward keeps the own slab (no collective); f's AR backward stays.
    assert breakdown(0, pp_scatter_gather=True, semantics="replicated-loss")["tp"] == {
        "all_reduce": op(2, 2 * ACT, 2 * ACT), "all_gather": op(2, 2 * SLAB, 2 * ACT)}
    assert breakdown(4, pp_scatter_gather=True, semantics="replicated-loss")["tp"] == {
        "all_reduce": op(4, 4 * ACT, 4 * ACT), "all_gather": op(2, 2 * SLAB, 2 * ACT)}


def test_moe_stage_per_axis():
    # Last stage = MoE, ep 2 = dp (recorded on the dp communicator), 2 experts, one per ep rank,
    # balanced 8 tokens -> [4, 4]: dispatch, combine, and both backwards per microbatch = 8 all_to_all
    # of 2048 B. Its expert syncs once in edp [4, 5] (the tp communicator). No dense shard, no dp sync.
    assert breakdown(4, moe=True) == {"dp": {"all_to_all": op(8, 8 * ACT, 8 * ACT)},
                                      "pp": p2p(ACT), "tp": {"all_reduce": op(1, SHARD, SHARD)}}
    assert breakdown(0, moe=True) == breakdown(0)  # the dense stage does not change


def test_moe_skewed_splits_follow_the_router():
    # 7:1 of 8 tokens -> [7, 1]: every source sends 7 rows to expert 0 (on ep rank 0) and 1 to expert 1.
    events = predict_step(cfg_of(moe=True, routing="skewed"))
    first = {e.rank: e for e in events if e.region == "moe.dispatch" and e.phase == "forward" and e.microbatch == 0}
    assert (first[4].input_splits, first[4].output_splits, first[4].group) == ((7, 1), (7, 7), (4, 6))
    assert (first[6].input_splits, first[6].output_splits) == ((7, 1), (1, 1))
    assert (first[6].bytes_in, first[6].bytes_out) == (8 * 256, 2 * 256)
    back = [e for e in events if e.rank == 6 and e.region == "moe.dispatch" and e.phase == "backward"]
    assert [(e.input_splits, e.output_splits) for e in back] == [((1, 1), (7, 1))] * 2  # splits swapped


def test_any_sizes_that_multiply_into_the_world():
    cfg = cfg_of(tp=2, pp=4, microbatches=4, pp_scatter_gather=True, schedule="1f1b")
    assert (cfg.world, cfg.dp) == (8, 1)
    per_rank = {r: counts(e for e in predict_step(cfg) if e.rank == r) for r in range(8)}
    # middle stages (ranks 2..5) talk to both neighbours: 4 activations + 4 gradients each way
    assert per_rank[2]["send"] == per_rank[2]["recv"] == 8
    assert per_rank[0]["send"] == per_rank[6]["recv"] == 4


@pytest.mark.parametrize("overrides, fragment", [
    (dict(moe=True, ep=3), "--ep 3 does not divide dp 2"),
    (dict(ep=2), "need --moe"),
    (dict(world=8, dp=4), "--world 8 disagrees with tp x pp (2 x 2) x --dp 4 = 16"),
    (dict(world=10), "--world 10 is not divisible by tp x pp (2 x 2) = 4"),
    (dict(batch=12, microbatches=2, tp=4, pp=2, world=8, pp_scatter_gather=True), "splits each microbatch's 6 rows"),
    (dict(moe=True, experts=3), "--experts 3 is not a multiple of --ep 2"),
    (dict(schedule="zigzag"), "--schedule 'zigzag'"),
    (dict(pp=1, fault_pp_no_grad=True), "the pp-no-grad fault needs a stage boundary"),
])
def test_bad_configs_are_usage_errors(overrides, fragment):
    with pytest.raises(UsageError, match=re.escape(fragment)):
        cfg_of(**overrides)


def test_cli_flags_reach_the_config_and_errors_are_one_line():
    bad = cli_here("predict", "nd_mlp", "--moe", "--ep", "3", "--json")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "ep 3" in bad.stderr
    ok = cli_here("predict", "nd_mlp", "--moe", "--pp-scatter-gather", "--json")
    assert ok.returncode == 0 and '"moe": true' in ok.stdout and '"pp_scatter_gather": true' in ok.stdout


# -- one gloo launch at world 8 ----------------------------------------------------------------------
STAGE0, STAGE1 = range(4), range(4, 8)
RUNS = {  # name: (overrides, {ranks: captured counts per rank})
    "gpipe": ({}, {STAGE0: {"all_reduce": 6, "send": 2, "recv": 2}, STAGE1: {"all_reduce": 6, "send": 2, "recv": 2}}),
    "1f1b-replicated": (dict(schedule="1f1b", semantics="replicated-loss"),
                        {STAGE0: {"all_reduce": 4, "send": 2, "recv": 2}, STAGE1: {"all_reduce": 6, "send": 2, "recv": 2}}),
    "moe": (dict(moe=True), {STAGE0: {"all_reduce": 6, "send": 2, "recv": 2},
                             STAGE1: {"all_reduce": 1, "all_to_all": 8, "send": 2, "recv": 2}}),
    "scatter-gather-1f1b": (dict(pp_scatter_gather=True, schedule="1f1b"),
                            {STAGE0: {"all_reduce": 6, "send": 2, "recv": 2},
                             STAGE1: {"all_reduce": 6, "all_gather": 2, "reduce_scatter": 2, "send": 2, "recv": 2}}),
    "moe-scatter-gather-replicated": (dict(moe=True, pp_scatter_gather=True, semantics="replicated-loss"),
                                      {STAGE0: {"all_reduce": 4, "all_gather": 2, "send": 2, "recv": 2},
                                       STAGE1: {"all_reduce": 1, "all_gather": 2, "all_to_all": 8, "send": 2, "recv": 2}}),
    # experts scaled by 1/(ep*c) = 1/4 here: a wrong factor fails the gradient check
    "tp1-ep4-replicated": (dict(tp=1, moe=True, ep=4, experts=4, semantics="replicated-loss"), {}),
    "pp4-1f1b-scatter-gather": (dict(pp=4, microbatches=4, schedule="1f1b", pp_scatter_gather=True), {}),
}


@pytest.fixture(scope="module")
def world8(tmp_path_factory):
    results = run_many(tmp_path_factory.mktemp("nd"), [("nd_mlp", {**S, **o}) for o, _ in RUNS.values()],
                       world=8, timeout=120)
    return dict(zip(RUNS, results))


@pytest.mark.parametrize("name", list(RUNS))
def test_runs_pass_with_predicted_counts(world8, name):
    result = world8[name]
    assert result["passed"], failed_checks(result)
    assert result["comm"]["match"]
    for ranks, want in RUNS[name][1].items():
        for r in ranks:
            assert result["comm"]["per_rank"][r]["captured"] == want, (name, r)
    names = {c["name"] for c in result["checks"]}
    assert {"stage outputs == unsharded chain", "losses finite"} <= names
    if result["config"]["dp"] > 1:  # dp 1 (pp 4 x tp 2) has no replica to compare
        assert any(n.startswith("replicas equal") for n in names)


def test_every_captured_tp_and_ep_event_names_its_microbatch(world8):
    captured = world8["moe"]["comm"]["events"]["captured"]
    inside = [e for e in captured if e["region"].startswith(("fc", "moe.", "pp."))]
    assert inside and all(e["microbatch"] in (0, 1) for e in inside)


def test_axes_section_places_each_collective_on_its_dimension(world8):
    axes = world8["moe"]["axes"]
    assert axes["rank"] == 0 and axes["groups"] == {"dp": [0, 2], "pp": [0, 4], "tp": [0, 1]}
    assert axes["ops"] == {"dp": DP_SYNC["dp"], "pp": p2p(ACT), "tp": {"all_reduce": op(4, 4 * ACT, 4 * ACT)}}
    assert axes["aliases"]["dp"] == ["dp-cp", "ep"]


def test_injected_pp_hang_is_placed_on_the_pp_axis(tmp_path):
    # Rank 5 (stage 1 of rank 1's pipeline) never sends the gradient back: rank 1 hangs in its recv,
    # its tp peer rank 0 then waits in the fc2.out backward all_reduce and the dp syncs stall. The
    # doctor must name the pp boundary [1, 5] first, not the tp or dp collectives the hang spread to.
    flags = [a for k, v in S.items() for a in (f"--{k}", v)]
    proc = cli_here("run", "nd_mlp", *flags, "--inject", "pp-no-grad", "--timeout", 6, "--out", tmp_path, "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    findings = diagnose(tmp_path).to_json()["findings"]
    first = findings[0]
    assert (first["kind"], first["axis"], first["group"], first["ranks"], first["root_cause"]) == \
        ("pp-no-grad", "pp", [1, 5], [5], True)
    assert any(f["axis"] == "tp" for f in findings[1:])  # the spread is visible, ranked after the cause
