"""The analytic model held against real code: `place --compare-trace` and `place --from-trace`.

The math first, pure Python: DDP's bucket rule, FSDP's padding, the per-layer counts of torch's test
Transformer, and its weight inventory against torch's own parameter count. Then the oracle: each
configuration of tests/jobs/transformer.py (2 and 8 layers, TP with and without sequence parallelism,
DDP and FSDP2) traced once on a fake world of 4 (rank 0; tests/test_fake_world.py shows the fake
backend issues what gloo does), and the model's calls per axis and op must equal the trace's exactly,
its bytes within 5 %.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from meshscope.cli.parser import main
from meshscope.core.mesh import Layout
from meshscope.predict.grad_sync import MIB, ddp_buckets, grad_sync
from meshscope.predict.model_spec import ModelSpec
from meshscope.predict.volume import stage_traffic, table
from meshscope.predict.weights import stage_weights

from .helpers import ROOT, cli

JOB = ROOT / "tests" / "jobs" / "transformer.py"
SHAPES = {"hidden": 64, "ffn": 256, "seq_len": 32, "micro_batch": 4, "heads": 8, "dtype": "fp32", "vocab": 64, "position_rows": 32,
              "norm_params": 2, "mlp_bias": True, "separate_qkv": True}
"""tests/jobs/transformer.py's defaults as a ModelSpec (the MLP width is ModelArgs' fixed 4 x dim)."""
PLACE_FLAGS = ["--hidden", "64", "--ffn", "256", "--seq", "32", "--micro-batch", "4", "--heads", "8", "--dtype", "fp32",
               "--vocab", "64", "--position-rows", "32", "--norm-params", "2", "--mlp-bias", "--separate-qkv"]


# -- the model's math ---------------------------------------------------------------------------------
def test_ddp_buckets_close_once_they_reach_the_cap():
    assert ddp_buckets([40, 30, 50, 10, 5], bucket_mb=60 / MIB) == [70, 60, 5]  # 40+30 >= 60, 50+10 >= 60
    # default: the first bucket at 1 MiB, the rest at 25 MiB
    assert ddp_buckets([MIB // 2, MIB // 2, 10 * MIB, 20 * MIB, MIB], bucket_mb=None) == [MIB, 30 * MIB, MIB]


def test_fsdp_pads_each_tensor_to_a_multiple_of_the_group():
    spec = ModelSpec(layers=1, hidden=6, ffn=10, seq_len=4, heads=0, dtype="fp32", data_parallel="fsdp")
    # W1 [10, 6] over 4 ranks: dim 0 padded to 12; W2 [6, 10]: padded to 8
    rows = grad_sync(spec, stage_weights(spec, 1, 0, 1), 4)
    assert rows == [("all_gather", "forward", "layer 0", 1, (12 * 6 + 8 * 10) * 4),
                    ("all_gather", "backward", "layer 0", 1, (12 * 6 + 8 * 10) * 4),
                    ("reduce_scatter", "optimizer", "layer 0", 1, (12 * 6 + 8 * 10) * 4)]


@pytest.mark.parametrize("layers", [1, 5])
def test_test_transformer_tp_counts_per_layer(layers):
    """Hand derivation from torch's parallel plan (tests/jobs/transformer.py's docstring), tp 2 x dp 2."""
    tp = table(stage_traffic(ModelSpec(layers=layers, **SHAPES), Layout(4, tp=2), 0))["tp"]
    assert tp["all_reduce"][0] == (2 + 2 * layers) + (4 * layers + 1)  # embeddings + blocks fwd; Q, K, V, W1, output bwd
    assert tp["all_gather"][0] == 1  # the logits
    sp = table(stage_traffic(ModelSpec(layers=layers, **SHAPES, sequence_parallel=True), Layout(4, tp=2), 0))["tp"]
    assert sp["all_gather"][0] == (2 * layers + 2) + (2 * layers + 2)
    assert sp["reduce_scatter"][0] == (2 * layers + 2) + (2 * layers + 1)
    assert sp["all_reduce"] == (2 * (2 * layers + 1), 2 * (2 * layers + 1) * 64 * 4)  # LayerNorm weight + bias


@pytest.mark.parametrize("tied", [True, False])
def test_weight_inventory_is_torchs_parameter_count(tied):
    from torch.testing._internal.distributed._tensor.common_dtensor import (
        ModelArgs,
        Transformer,
    )

    spec = ModelSpec(layers=3, **SHAPES, tied_embeddings=tied)
    model = Transformer(ModelArgs(n_layers=3, vocab_size=64, max_seq_len=32, dim=64, n_heads=8, weight_tying=tied))
    params = list(model.parameters())  # a tied weight once, in registration order
    weights = stage_weights(spec, 1, 0, 1)
    assert [w.numel for w in weights] == [p.numel() for p in params]
    assert [w.dim0 for w in weights] == [p.shape[0] for p in params]


# -- against traces ------------------------------------------------------------------------------------
CONFIGS = {
    "fsdp-tp-L2": (["--layers", "2"], {"layers": 2, "tied_embeddings": True, "data_parallel": "fsdp"}),
    "fsdp-sp-L2": (["--layers", "2", "--sequence-parallel"],
                   {"layers": 2, "tied_embeddings": True, "data_parallel": "fsdp", "sequence_parallel": True}),
    "fsdp-sp-L8": (["--layers", "8", "--sequence-parallel"],
                   {"layers": 8, "tied_embeddings": True, "data_parallel": "fsdp", "sequence_parallel": True}),
    # DDP rebuilds its buckets in step 1, so its steady run (two alike, `core.steady`) needs 4 steps
    "ddp-sp-L2": (["--steps", "4", "--layers", "2", "--dp-mode", "ddp", "--no-weight-tying", "--bucket-cap-mb", "0.05",
                   "--sequence-parallel"], {"layers": 2, "data_parallel": "ddp", "bucket_mb": 0.05, "sequence_parallel": True}),
    "ddp-tp-L8": (["--steps", "4", "--layers", "8", "--dp-mode", "ddp", "--no-weight-tying", "--bucket-cap-mb", "0.2"],
                  {"layers": 8, "data_parallel": "ddp", "bucket_mb": 0.2}),
    "ddp-sp-L8": (["--steps", "4", "--layers", "8", "--dp-mode", "ddp", "--no-weight-tying", "--sequence-parallel"],
                  {"layers": 8, "data_parallel": "ddp", "sequence_parallel": True}),  # DDP's default buckets
}


def _flags(fields: dict) -> list[str]:
    out = ["--layers", str(fields["layers"]), "--data-parallel", fields["data_parallel"]]
    out += ["--tied-embeddings"] * fields.get("tied_embeddings", False) + ["--sp"] * fields.get("sequence_parallel", False)
    return out + (["--bucket-mb", str(fields["bucket_mb"])] if "bucket_mb" in fields else [])


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """One fake-world trace of rank 0 per configuration, two at a time (each is one process on one core)."""
    root = tmp_path_factory.mktemp("traces")

    def trace(name):
        proc = cli("trace", "--fake-world", 4, "--ranks", 0, "--out", root / name, "--", JOB, *CONFIGS[name][0],
                   timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return root / name

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(CONFIGS, pool.map(trace, CONFIGS)))


def _compare(capsys, trace_dir, fields) -> dict:
    assert main(["place", "--compare-trace", str(trace_dir), *PLACE_FLAGS, *_flags(fields), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", CONFIGS)
def test_model_counts_exact_and_bytes_within_5_percent_of_the_trace(name, traces, capsys):
    fields = CONFIGS[name][1]
    doc = _compare(capsys, traces[name], fields)
    assert doc["layout"]["sizes"]["tp"] == 2 and doc["layout"]["sizes"]["dp"] == 2
    [cls] = doc["classes"]
    args = CONFIGS[name][0]
    last = int(args[args.index("--steps") + 1]) - 1 if "--steps" in args else 2  # the job's default: 3 steps
    assert cls["ranks"] == [0] and cls["step"] == last
    rows = {(r["axis"], r["op"]): r for r in cls["rows"]}
    for row in rows.values():
        assert row["model_calls"] == row["trace_calls"], row
        assert abs(row["model_bytes"] - row["trace_bytes"]) <= 0.05 * row["trace_bytes"], row
    assert doc["agrees"]
    # the flavour shows on dp: FSDP's gathers and scatters, or DDP's buckets and nothing else
    dp_ops = {op for axis, op in rows if axis == "dp"}
    assert dp_ops == ({"all_gather", "reduce_scatter"} if fields["data_parallel"] == "fsdp" else {"all_reduce"})
    if fields["data_parallel"] == "ddp":
        spec = ModelSpec(**SHAPES, **fields)
        buckets = ddp_buckets([w.numel * 4 for w in reversed(stage_weights(spec, 2, 0, 1))], spec.bucket_mb)
        assert rows[("dp", "all_reduce")]["trace_calls"] == len(buckets) > (1 if "bucket_mb" in fields else 0)


def test_text_table_and_from_trace_ranking(traces, capsys):
    trace_dir = traces["fsdp-sp-L2"]
    assert main(["place", "--compare-trace", str(trace_dir), *PLACE_FLAGS, *_flags(CONFIGS["fsdp-sp-L2"][1])]) == 0
    text = capsys.readouterr().out
    assert "tp     all_reduce" in text and "the model agrees: every count exact" in text
    # ranked from the trace's volumes, the placements come out as from the model's (they agree)
    common = ["--gpus-per-node", "2", "--json"]
    assert main(["place", "--from-trace", str(trace_dir), *common]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert main(["place", "--world", "4", "--tp", "2", *PLACE_FLAGS, *_flags(CONFIGS["fsdp-sp-L2"][1]), *common]) == 0
    model = json.loads(capsys.readouterr().out)
    assert traced["volume_source"].startswith(f"the trace {trace_dir}")
    assert [p["order"] for p in traced["placements"]] == [p["order"] for p in model["placements"]]
    assert [p["step_s"] for p in traced["placements"]] == pytest.approx([p["step_s"] for p in model["placements"]])
    assert traced["volume"] == model["volume"]


def test_bad_traces_are_one_line_exit_2(traces, tmp_path, capsys):
    assert main(["place", "--compare-trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a finished meshscope trace directory" in err
    short = tmp_path / "short"
    shutil.copytree(traces["fsdp-tp-L2"], short)
    doc = json.loads((short / "result.json").read_text())
    for r in doc["ranks"]:
        r["steps"] = 2  # as a job of 2 optimizer steps ends
    doc["steady"] = {r: {"complete": 2, "first": None} for r in doc["steady"]}
    (short / "result.json").write_text(json.dumps(doc))
    assert main(["place", "--compare-trace", str(short)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rank 0 completed 2 step(s) and no 2 in a row after step 0 issued the same calls, so no steady step" in err
    assert main(["place", "--compare-trace", str(traces["fsdp-tp-L2"]), "--tp", "4"]) == 2
    assert "--tp 4 disagrees with the trace's layout (tp 2)" in capsys.readouterr().err
