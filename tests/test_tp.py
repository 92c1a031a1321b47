"""Tensor/sequence-parallel MLP: the predictor's figures for the chapter (pure Python), then one 4-rank gloo launch
running both experiments x both semantics x input grad on/off at tp 2 and tp 4, and a wrong DP group."""

from __future__ import annotations

import pytest
import torch

from meshscope import experiments
from meshscope.core.errors import UsageError
from meshscope.core.events import counts
from meshscope.experiments.numerics import Worst
from tests.helpers import cli_here, failed_checks, run_many

KiB, MiB = 1 << 10, 1 << 20
SEMANTICS = ("summed-loss", "replicated-loss")


def expected_counts(name: str, semantics: str, input_grad: bool, dp: int) -> dict[str, int]:
    """The chapter's per-rank collectives per step (design brief table), extended to replicated-loss."""
    dp_sync = 2 if dp > 1 else 0  # one all_reduce per weight shard
    column_in = int(semantics == "replicated-loss" and input_grad)  # CopyToGroup's backward AR
    if name.startswith("tp_ar"):
        tp = 2 if semantics == "summed-loss" else 1  # AR fwd (+ AR bwd under summed-loss)
        return {"all_reduce": dp_sync + tp + column_in}
    out = {"all_reduce": dp_sync + column_in, "all_gather": 2, "reduce_scatter": 2 if semantics == "summed-loss" else 1}
    return {op: n for op, n in out.items() if n}


def predict(name: str, **overrides):
    exp = experiments.get(name)
    return exp.predict(exp.config(overrides))


def tp_events(events, rank=0):
    return [(e.op, e.phase, e.region, e.bytes_in, e.bytes_out) for e in events if e.rank == rank and e.axis == "tp"]


# -- predictor, pure Python --------------------------------------------------------------------------
@pytest.mark.parametrize("name, payload", [("tp_ar_b32", 64 * KiB), ("tp_ar_b128", 256 * KiB)])
def test_tp_allreduce_payload_is_batch_times_hidden(name, payload):
    events = predict(name)
    assert tp_events(events) == [("all_reduce", "forward", "fc2.out", payload, payload),
                                 ("all_reduce", "backward", "fc2.out", payload, payload)]
    dp = [(e.op, e.phase, e.group, e.bytes_in) for e in events if e.rank == 0 and e.axis == "dp"]
    assert dp == [("all_reduce", "optimizer", (0, 2), 1 * MiB)] * 2


def test_sp_payloads_split_input_and_output_bytes():
    assert tp_events(predict("tp_sp_b128")) == [
        ("reduce_scatter", "forward", "sp.scatter", 256 * KiB, 128 * KiB),
        ("all_gather", "forward", "sp.gather", 128 * KiB, 256 * KiB),
        ("reduce_scatter", "backward", "sp.gather", 256 * KiB, 128 * KiB),  # AG <-> RS dual
        ("all_gather", "backward", "sp.scatter", 128 * KiB, 256 * KiB),  # RS <-> AG dual
    ]


@pytest.mark.parametrize("name", ["tp_ar_b32", "tp_sp_b128"])
@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("input_grad", [False, True])
def test_predicted_counts_per_rank(name, semantics, input_grad):
    events = predict(name, semantics=semantics, input_grad=input_grad)
    for rank in range(4):
        assert counts(e for e in events if e.rank == rank) == expected_counts(name, semantics, input_grad, dp=2)


def test_replicated_loss_prunes_column_input_allreduce_without_input_grad():
    without = tp_events(predict("tp_ar_b32", semantics="replicated-loss", input_grad=False))
    with_grad = tp_events(predict("tp_ar_b32", semantics="replicated-loss", input_grad=True))
    assert without == [("all_reduce", "forward", "fc2.out", 64 * KiB, 64 * KiB)]
    assert with_grad == without + [("all_reduce", "backward", "fc1.in", 64 * KiB, 64 * KiB)]
    # summed-loss: X.grad stays a partial sum, so asking for it adds no collective
    assert predict("tp_ar_b32", input_grad=True) == predict("tp_ar_b32", input_grad=False)


def test_tp4_shards_shrink_dp_vanishes():
    events = predict("tp_ar_b128", tp=4)
    assert {e.axis for e in events} == {"tp"}  # dp = 1: no gradient sync
    assert [e.group for e in events if e.rank == 3] == [(0, 1, 2, 3)] * 2
    sp = predict("tp_sp_b128", tp=4)
    assert tp_events(sp)[0] == ("reduce_scatter", "forward", "sp.scatter", 256 * KiB, 64 * KiB)


@pytest.mark.parametrize("overrides, world, dp", [({}, 4, 2), ({"tp": 4}, 4, 1), ({"dp": 1}, 2, 1),
                                                  ({"world": 8}, 8, 4), ({"world": 8, "dp": 4}, 8, 4)])
def test_world_and_dp_resolve_through_tp(overrides, world, dp):
    cfg = experiments.get("tp_ar_b32").config(overrides)
    assert (cfg.world, cfg.dp) == (world, dp)


@pytest.mark.parametrize("name, overrides, words", [
    ("tp_ar_b32", {"tp": 3}, "--tp 3 does not divide --ffn 1024"),
    ("tp_ar_b32", {"world": 4, "dp": 1}, "disagrees"),
    ("tp_ar_b32", {"world": 6, "tp": 4}, "--world 6 is not divisible by tp = 4"),
    ("tp_sp_b128", {"batch": 130, "tp": 4}, "--batch 130 is not divisible by --tp 4"),
    ("tp_ar_b32", {"semantics": "mean-loss"}, "'mean-loss' is not one of"),
    ("tp_ar_b32", {"steps": 0}, "--steps 0 must be a positive integer"),
])
def test_bad_config_is_a_usage_error(name, overrides, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        experiments.get(name).config(overrides)


def test_gradient_check_sees_the_t_times_bug_and_nan():
    """An undivided summed-loss gives T x the gradient (measured 2.000 at T=2, models/tp_mlp.py); a
    gradient of the chapter's size (~1e-3) doubled must fail, and so must a NaN or a missing gradient."""
    g = torch.full((4, 4), 1e-3)
    for got, ok in [(g + 1e-9, True), (2 * g, False), (g * float("nan"), False), (None, False)]:
        worst = Worst()
        worst.add("grad", got, g)
        assert worst.check("grad", "grad").passed is ok


def test_cli_bad_tp_is_one_line_exit_2():
    proc = cli_here("run", "tp_ar_b32", "--tp", "3", "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "--tp 3 does not divide --ffn 1024" in proc.stderr


def test_fault_knob_is_not_a_cli_flag():
    proc = cli_here("predict", "tp_ar_b32", "--dp-group-fault")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


# -- 4 gloo ranks, one launch ------------------------------------------------------------------------
RUNS = [(name, {"semantics": s, "input_grad": ig}) for name in ("tp_ar_b32", "tp_sp_b128")
        for s in SEMANTICS for ig in (False, True)]
RUNS += [(name, {"tp": 4, "semantics": s, "input_grad": s == "replicated-loss"})
         for name in ("tp_ar_b128", "tp_sp_b128") for s in SEMANTICS]
FAULT = ("tp_ar_b32", {"dp_group_fault": True})


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    docs = run_many(tmp_path_factory.mktemp("tp"), RUNS + [FAULT], world=4, timeout=120)
    assert len(docs) == len(RUNS) + 1
    return docs


@pytest.mark.parametrize("index", range(len(RUNS)), ids=[f"{n}-tp{o.get('tp', 2)}-{o['semantics']}-ig{int(o['input_grad'])}"
                                                        for n, o in RUNS])
def test_run_passes_and_matches_prediction(results, index):
    name, overrides = RUNS[index]
    doc = results[index]
    assert doc["experiment"] == name and doc["passed"], failed_checks(doc)
    assert doc["comm"]["match"] and doc["comm"]["diff"] == []
    want = expected_counts(name, overrides["semantics"], overrides["input_grad"], dp=doc["config"]["dp"])
    assert [r["captured"] for r in doc["comm"]["per_rank"]] == [want] * 4
    names = {c["name"] for c in doc["checks"]}
    assert {"output == unsharded MLP", "weight grads == unsharded slices", "weights after 3 SGD steps == unsharded",
            "losses finite", "replicas equal: tp shard weights"} <= names
    assert ("input grad == unsharded" in names) == overrides["input_grad"]
    assert doc["numerics"]["max_abs_err_output"] <= 2e-5 and doc["numerics"]["max_abs_err_grad"] <= 2e-5
    assert doc["numerics"]["max_rel_err_grad"] <= 1e-4


def test_captured_sp_payloads_are_the_chapters(results):
    doc = results[RUNS.index(("tp_sp_b128", {"semantics": "summed-loss", "input_grad": False}))]
    tp = [(e["op"], e["phase"], e["bytes_in"], e["bytes_out"]) for e in doc["comm"]["events"]["captured"]
          if e["rank"] == 0 and e["axis"] == "tp"]
    assert tp == [("reduce_scatter", "forward", 256 * KiB, 128 * KiB), ("all_gather", "forward", 128 * KiB, 256 * KiB),
                  ("reduce_scatter", "backward", 256 * KiB, 128 * KiB), ("all_gather", "backward", 128 * KiB, 256 * KiB)]


def test_dp_over_different_shards_is_caught(results):
    """The chapter's common mistake (Q2): DP over [0,1] adds gradients of different shards."""
    doc = results[-1]
    assert not doc["passed"]
    failed = {c["name"] for c in failed_checks(doc)}
    assert {"weight grads == unsharded slices", "weights after 3 SGD steps == unsharded",
            "replicas equal: tp shard weights"} <= failed
    assert "losses finite" not in failed and "comm ledger == prediction" in failed  # synced on tp, not dp


def test_predict_names_the_options_that_differ_from_the_preset():
    exp = experiments.get("tp_ar_b32")
    assert exp.changed(exp.config({})) == []
    assert exp.changed(exp.config({"batch": 64})) == ["--batch 64"]
    assert exp.changed(exp.config({"input_grad": True})) == ["--input-grad"]  # a switch, as typed
    proc = cli_here("predict", "tp_ar_b32", "--batch", 64)  # the command line's own start: test_report's
    assert proc.returncode == 0 and "changed: --batch 64" in " ".join(proc.stdout.split())
