"""Expert-parallel MoE: routing -> splits math, predictor figures, and one world-4 launch of every variant."""

from __future__ import annotations

import pytest
import torch

from meshscope import experiments
from meshscope.core.errors import UsageError
from meshscope.core.events import counts
from meshscope.core.groups import AxisGroup
from meshscope.experiments.ep.experiment import backward_note
from meshscope.models.moe import dispatch as dsp
from meshscope.models.moe.router import Routing, apply_capacity, apportion, fixed_routing, parse_skew

from .helpers import cli_here, failed_checks, run_many

KiB = 1024


def _predict(name, **overrides):
    exp = experiments.get(name)
    return exp.predict(exp.config(overrides))


def _a2a(events, rank, region, phase="forward"):
    hits = [e for e in events if e.rank == rank and e.op == "all_to_all" and e.region == region and e.phase == phase]
    assert len(hits) == 1, hits
    return hits[0]


# -- pure Python: router -> splits ---------------------------------------------------------------
def test_skew_apportion_gives_chapter_splits():
    assert apportion(64, parse_skew("7:1", 2)) == [56, 8]
    assert apportion(64, [1, 1]) == [32, 32]
    assert parse_skew("7:1", 4) == [7, 1, 1, 1]
    assert apportion(64, [7, 1, 1, 1]) == [45, 7, 6, 6]  # largest remainder, sums to 64
    with pytest.raises(UsageError, match="7:1:1"):
        parse_skew("7:1:1", 4)


def test_fixed_routing_packs_by_destination_and_restores_order():
    routing = fixed_routing([56, 8], torch.Generator().manual_seed(3))
    packing = dsp.pack_plan(routing.expert_A, 2)
    assert packing.input_splits(2) == [56, 8]
    assert sorted(packing.slot_A.tolist()) == list(range(64))  # a permutation: no token lost or doubled
    assert routing.expert_A[:56].tolist() != [0] * 56  # the seeded permutation really reorders tokens
    # Every row of expert 0 precedes every row of expert 1 in the send buffer.
    assert packing.slot_A[routing.expert_A == 0].max() < packing.slot_A[routing.expert_A == 1].min()
    # Unpacking an identity round trip returns the tokens in their original order.
    x_TD = torch.randn(64, 4)
    packed = x_TD.new_zeros(64, 4).index_copy(0, packing.slot_A, x_TD[routing.token_A])
    assert torch.equal(dsp.unpack(packed, routing, packing, 64), x_TD)


def test_capacity_drops_and_padding_rows():
    routing = Routing(torch.arange(6), torch.tensor([0, 0, 0, 0, 1, 0]), None, [5, 1], [0, 0], None)
    capped = apply_capacity(routing, 3)
    assert capped.dropped_E == [2, 0] and capped.kept_E == [3, 1]
    assert capped.token_A.tolist() == [0, 1, 2, 4]  # the earliest tokens keep their place
    padded = dsp.pack_plan(capped.expert_A, 2, pad_to=3)
    assert padded.rows_E == (3, 3) and padded.slot_A.tolist() == [0, 1, 2, 3]


def test_predicted_skew_bytes_and_receive_splits():
    events = _predict("ep_skewed")
    hot, cold = _a2a(events, 0, "moe.dispatch"), _a2a(events, 1, "moe.dispatch")
    assert hot.input_splits == (56, 8) and hot.output_splits == (56, 56)  # expert rank 0 receives 112
    assert cold.output_splits == (8, 8)  # expert rank 1 receives 16
    assert hot.bytes_in == cold.bytes_in == 128 * KiB  # dispatch: 128 KiB per source
    assert _a2a(events, 0, "moe.combine").bytes_in == 224 * KiB  # combine from the hot expert
    assert _a2a(events, 1, "moe.combine").bytes_in == 32 * KiB  # ... and from the cold one
    back = _a2a(events, 0, "moe.dispatch", "backward")
    assert back.input_splits == (56, 56) and back.output_splits == (56, 8)  # splits swapped


def test_predicted_counts_and_pruning():
    for name, a2a in (("ep_balanced", 4), ("ep_skewed", 4), ("ep_nograd", 3)):
        events = _predict(name)
        for rank in range(4):
            assert counts(e for e in events if e.rank == rank) == {"all_reduce": 1, "all_to_all": a2a}, name
    nograd = _predict("ep_nograd")
    assert not [e for e in nograd if e.region == "moe.dispatch" and e.phase == "backward"]
    assert "prunes the reverse dispatch" in backward_note(experiments.get("ep_nograd").config({}))


def test_learned_routing_exchanges_counts_unless_padded():
    events = _predict("ep_learned", experts=4)
    first = min((e for e in events if e.rank == 0 and e.axis == "ep"), key=lambda e: e.seq)
    assert (first.region, first.dtype, first.input_splits, first.bytes_in) == ("moe.counts", "int64", (1, 1), 2 * 2 * 8)
    padded = _predict("ep_learned", pad=True, capacity_factor=1.0)
    assert not [e for e in padded if e.region == "moe.counts"]
    cap = 32  # ceil(1.0 * 64 tokens * top-1 / 2 experts)
    assert _a2a(padded, 0, "moe.dispatch").input_splits == (cap, cap)


def test_bad_splits_fail_before_any_collective():
    group = AxisGroup("ep", (0, 1), None)  # no process group: reaching a collective would crash differently
    packing = dsp.Packing(torch.arange(4), (2, 2))
    with pytest.raises(UsageError, match="sums to 4 but the tensor has 3 rows"):
        dsp.combine(torch.zeros(3, 8), packing, torch.tensor([[2], [2]]), group)


def test_bad_config_is_one_line_error():
    for args in (["--experts", "3"], ["--topk", "2"], ["--world", "4", "--ep", "3"], ["--skew", "7:x"]):
        proc = cli_here("predict", "ep_skewed", *args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)


@pytest.mark.parametrize("name, overrides, fragment", [
    ("ep_balanced", {"world": 2, "ep": 1, "fault_split_mismatch": True}, "split-mismatch fault needs --ep 2"),
    ("ep_nograd", {"fault_no_input_grad": True}, "no-input-grad fault needs --input-grad"),
])
def test_faults_that_would_plant_nothing_are_usage_errors(name, overrides, fragment):
    with pytest.raises(UsageError, match=fragment):
        experiments.get(name).config(overrides)


def test_no_input_grad_fault_keeps_the_prediction_of_four_all_to_all():
    """The fault changes the run, not the prediction: 4 all_to_all predicted, as for ep_balanced."""
    exp = experiments.get("ep_balanced")
    assert counts(exp.predict(exp.config({"fault_no_input_grad": True}))) == counts(exp.predict(exp.config({})))


# -- world 4: every variant in one launch -------------------------------------------------------
CASES = [
    ("ep_balanced", {}),
    ("ep_skewed", {}),
    ("ep_nograd", {}),
    ("ep_learned", {"capacity_factor": 0.5}),                        # top-1, capacity 16 of 64: drops
    ("ep_learned", {"capacity_factor": 0.0}),                        # top-1, no capacity: no drops
    ("ep_learned", {"topk": 2, "capacity_factor": 0.5}),             # top-2 over 2 experts: half dropped
    ("ep_learned", {"topk": 2, "capacity_factor": 0.0}),             # top-2, no capacity: no drops
    ("ep_learned", {"pad": True, "capacity_factor": 1.0}),           # padded: static splits
    ("ep_skewed", {"experts": 4}),                                   # 2 local experts per rank
    ("ep_balanced", {"ep": 4, "experts": 4}),                        # ep = world, no edp sync
    ("ep_learned", {"experts": 4, "topk": 2, "input_grad": False}),  # learned, pruned reverse dispatch
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_many(tmp_path_factory.mktemp("ep"), CASES, world=4, timeout=120)


def _per_rank(result):
    return [(r["predicted"], r["captured"]) for r in result["comm"]["per_rank"]]


def test_every_variant_passes(results):
    for (name, over), res in zip(CASES, results):
        assert res["passed"], (name, over, failed_checks(res))
        assert res["comm"]["match"] and res["numerics"]["max_abs_err_grad"] <= 2e-5
        for predicted, captured in _per_rank(res):
            assert predicted == captured


def test_chapter_counts_splits_and_tokens(results):
    balanced, skewed, nograd = results[:3]
    assert [c for _, c in _per_rank(balanced)] == [{"all_reduce": 1, "all_to_all": 4}] * 4
    assert [c for _, c in _per_rank(nograd)] == [{"all_reduce": 1, "all_to_all": 3}] * 4
    assert balanced["experts"]["tokens_per_expert"] == [[64, 64], [64, 64]]
    assert skewed["experts"]["tokens_per_expert"] == [[112, 16], [112, 16]]
    ranks = skewed["experts"]["ranks"]
    assert ranks[0]["dispatch"]["input_splits"] == [56, 8] and ranks[0]["dispatch"]["output_splits"] == [56, 56]
    assert ranks[1]["dispatch"]["output_splits"] == [8, 8]
    assert ranks[0]["combine"]["bytes_in"] == 224 * KiB and ranks[1]["combine"]["bytes_in"] == 32 * KiB
    assert "prunes the reverse dispatch" in nograd["experts"]["note"]
    assert {c["name"] for c in nograd["checks"]} >= {"x.grad absent (reverse dispatch pruned)"}
    assert any(c["name"].startswith("x.grad exists") and c["passed"] for c in skewed["checks"])
    assert any(c["name"] == "replicas equal: experts" and c["passed"] for c in skewed["checks"])


def test_learned_capacity_drops_and_padding(results):
    top1_drop, top1_free, top2_drop, top2_free, padded = results[3:8]
    for res in (top1_drop, top1_free, top2_drop, top2_free):
        assert [c for _, c in _per_rank(res)] == [{"all_reduce": 2, "all_to_all": 5}] * 4  # counts A2A + gate sync
        assert all(isinstance(a, float) for a in res["experts"]["aux_loss"])
    drop1 = top1_drop["experts"]
    assert drop1["capacity"] == 16 and drop1["tokens_per_expert"] == [[32, 32], [32, 32]]
    assert [sum(d) for d in drop1["dropped_per_expert"]] == [64, 64]  # 2 sources x 64 tokens - 2 x 2 x 16 kept
    free1 = top1_free["experts"]
    assert free1["capacity"] is None and free1["dropped_per_expert"] == [[0, 0], [0, 0]]
    assert [sum(t) for t in free1["tokens_per_expert"]] == [128, 128]
    assert free1["tokens_per_expert"] == free1["routed_per_expert"]
    drop = top2_drop["experts"]
    assert drop["capacity"] == 32 and drop["routed_per_expert"] == [[128, 128], [128, 128]]
    assert drop["tokens_per_expert"] == [[64, 64], [64, 64]] and drop["dropped_per_expert"] == [[64, 64], [64, 64]]
    free = top2_free["experts"]
    assert free["dropped_per_expert"] == [[0, 0], [0, 0]] and free["tokens_per_expert"] == [[128, 128], [128, 128]]
    assert [c for _, c in _per_rank(padded)] == [{"all_reduce": 2, "all_to_all": 4}] * 4
    assert padded["experts"]["ranks"][0]["dispatch"]["input_splits"] == [32, 32]
    assert any(c["name"] == "replicas equal: gate" and c["passed"] for c in top1_drop["checks"])


def test_more_experts_and_wider_ep(results):
    four, wide, learned_nograd = results[8:]
    assert four["experts"]["tokens_per_expert"] == [[90, 14, 12, 12]] * 2  # 2 sources x [45, 7, 6, 6]
    assert four["experts"]["ranks"][0]["dispatch"]["input_splits"] == [52, 12]
    assert four["experts"]["ranks"][0]["rows_per_local_expert"] == [90, 14]
    assert [c for _, c in _per_rank(four)] == [{"all_reduce": 2, "all_to_all": 4}] * 4  # one sync per local expert
    assert [c for _, c in _per_rank(wide)] == [{"all_to_all": 4}] * 4  # edp is 1: nothing to sync
    assert wide["experts"]["ranks"][0]["dispatch"]["input_splits"] == [16, 16, 16, 16]
    # ep = world: the all_to_alls run on the communicator created for dp, and the tables say so
    assert wide["axis_labels"]["dp"] == "dp=ep" and four["axis_labels"].get("dp", "dp") == "dp"
    assert [c for _, c in _per_rank(learned_nograd)] == [{"all_reduce": 3, "all_to_all": 4}] * 4


_TIMING_STEP = """
import os, torch
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
from meshscope.experiments import get
from meshscope.experiments.ep.config import tokens_need_grad
from meshscope.experiments.ep.experiment import _Model
from meshscope.experiments.ep.model import source_tokens
from meshscope.models.data_parallel import sgd_step
from meshscope.run.runtime import RankContext
ctx = RankContext.start("gloo", 30, None)
exp = get("{name}")
cfg = exp.config(dict(world=1, ep=1))
step = exp.step_fn(ctx, cfg)  # routes and packs once, no per-GEMM timing
step(); step()
ref = _Model(ctx, cfg, ctx.mesh(cfg.layout))  # the verified step: routes every time, times each GEMM
x = source_tokens(cfg, 0, 0).requires_grad_(tokens_need_grad(cfg))
for _ in range(2):
    x.grad = None
    _, _, record, _ = ref.train_step(0, x)
    sgd_step([p for _, p in ref.named], cfg.lr)
mine = step.__closure__  # the step's model: find its parameters through the closure
model = next(c.cell_contents for c in mine if isinstance(c.cell_contents, _Model))
assert not model.layer.record_durations and ref.layer.record_durations and record.gemm_s[0] > 0
for (name, a), (_, b) in zip(model.named, ref.named):
    assert torch.equal(a, b), name
print("same weights after 2 steps")
"""


@pytest.mark.parametrize("name", ["ep_skewed", "ep_nograd"])
def test_the_timing_step_trains_exactly_as_the_verified_step(name):
    import random
    import subprocess
    import sys

    code = _TIMING_STEP.format(port=random.randint(20000, 40000), name=name)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "same weights after 2 steps" in proc.stdout, proc.stderr[-2000:]
