"""Placement advisor: the volume model against the published formulas and the verified toy predictors,
the group math against brute force, rankings on hand-computed cases, and the CLI contract.

All pure Python (no ranks are launched): the toy predictors `experiments.get(name).predict(cfg)` have
been verified against captured gloo runs event by event, so matching them is matching the capture.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

import pytest

from meshscope import experiments
from meshscope.cli.parser import main
from meshscope.core.errors import UsageError
from meshscope.core.mesh import ORDER_AXES, Layout
from meshscope.place.advisor import rank_placements
from meshscope.place.links import LinkClass, link_from_sweep
from meshscope.place.node_crossing import (
    AXIS_MEMBERS,
    axis_spans,
    crossing_boundaries,
    crossing_groups,
    crossing_per_stage,
)
from meshscope.predict.alpha_beta import fit_alpha_beta, model_bytes
from meshscope.predict.model_spec import ModelSpec
from meshscope.predict.volume import link_bytes, stage_traffic, step_traffic, table

INTRA = LinkClass("intra-node", 1e-5, 100e9)
INTER = LinkClass("inter-node", 1e-4, 10e9)
GPT = dict(layers=2, hidden=1024, ffn=4096, seq_len=1024, micro_batch=1, heads=16, dtype="bf16")
"""A small GPT: ffn = 4h, so a layer holds 12 h^2 weights (Narayanan et al. 2021)."""


def _sizes(**kw):
    return {a: kw.get(a, 1) for a in ("tp", "cp", "pp", "ep", "etp")}


# -- the published formulas ----------------------------------------------------------------------------
def test_tp_volume_is_narayanans_two_allreduces_forward_and_two_backward_per_layer():
    spec = ModelSpec(**GPT, microbatches=3)
    vol = table(step_traffic(spec, Layout(16, tp=8)))
    bsh = 1 * 1024 * 1024 * 2  # b * s * h elements, bf16
    assert vol["tp"] == {"all_reduce": (4 * 2 * 3, 4 * 2 * 3 * bsh)}  # 4 per layer and microbatch
    # dense DP sync: 12 h^2 weights per layer, sharded over tp, gradient bytes in bf16
    assert vol["dp"]["all_reduce"][1] == 12 * 1024 ** 2 * 2 // 8 * 2


def test_sp_moves_the_same_link_bytes_as_tp_korthikanti():
    tp = [t for t in step_traffic(ModelSpec(**GPT), Layout(16, tp=8)) if t.axis == "tp"]
    sp = [t for t in step_traffic(ModelSpec(**GPT, sequence_parallel=True), Layout(16, tp=8)) if t.axis == "tp"]
    assert {t.op for t in sp} == {"all_gather", "reduce_scatter"}
    assert sum(t.count for t in sp) == 2 * sum(t.count for t in tp)  # each AR -> AG + RS
    assert sum(link_bytes(t, 8) for t in sp) == pytest.approx(sum(link_bytes(t, 8) for t in tp))
    assert sum(link_bytes(t, 8) for t in tp) == pytest.approx(2 * 7 / 8 * sum(t.bytes for t in tp))


def test_pp_sends_bsh_per_microbatch_and_boundary():
    bsh = 1024 * 1024 * 2
    ends = table(step_traffic(ModelSpec(**GPT, microbatches=4), Layout(16, pp=2)))["pp"]
    assert ends == {"send": (4, 4 * bsh), "recv": (4, 4 * bsh)}
    middle = table(step_traffic(ModelSpec(**{**GPT, "layers": 4}, microbatches=4), Layout(16, pp=4)))["pp"]
    assert middle == {"send": (8, 8 * bsh), "recv": (8, 8 * bsh)}  # two boundaries
    shard = table(step_traffic(ModelSpec(**GPT, microbatches=4, sequence_parallel=True), Layout(16, tp=2, pp=2)))
    assert shard["pp"]["send"] == (4, 4 * bsh // 2)  # only the sequence shard crosses the boundary


def test_ep_four_all_to_alls_per_moe_layer_and_expert_dp_sync():
    spec = ModelSpec(layers=2, hidden=512, ffn=256, seq_len=64, micro_batch=1, heads=0, experts=8, topk=2,
                     dtype="fp32")
    vol = table(step_traffic(spec, Layout(8, ep=4)))
    assert vol["ep"] == {"all_to_all": (4 * 2, 4 * 2 * 64 * 2 * 512 * 4)}  # tokens x k x h per call
    assert vol["edp"] == {"all_reduce": (2 * 2 * 8 // 4, 2 * 2 * 8 // 4 * 256 * 512 * 4)}
    assert vol["dp"] == {"all_reduce": (2, 2 * 8 * 512 * 4)}  # the router, over dense dp


def test_unbalanced_stages_scale_layer_traffic_but_not_the_boundary_messages():
    spec = ModelSpec(**{**GPT, "layers": 8}, microbatches=2, stage_layers=(6, 2))
    layout = Layout(16, tp=4, pp=2)
    heavy, light = (table(stage_traffic(spec, layout, s)) for s in (0, 1))
    assert heavy["tp"]["all_reduce"][0] == 4 * 6 * 2 and light["tp"]["all_reduce"][0] == 4 * 2 * 2
    assert heavy["dp"]["all_reduce"][1] == 3 * light["dp"]["all_reduce"][1]  # gradient bytes follow the layers
    assert heavy["pp"] == light["pp"] == {"send": (2, 2 * 1024 * 1024 * 2), "recv": (2, 2 * 1024 * 1024 * 2)}
    assert table(step_traffic(spec, layout)) == heavy  # the busiest rank is on the heavy stage
    even = table(step_traffic(ModelSpec(**{**GPT, "layers": 8}, microbatches=2), layout))
    assert even["tp"]["all_reduce"][0] == 4 * 4 * 2


@pytest.mark.parametrize("stage_layers,pp,words", [
    ((6, 1), 2, "--stage-layers 6,1 must be integers >= 1 summing to --layers 8"),
    ((8, 0), 2, "must be integers >= 1"),
    ((4, 2, 2), 2, "--stage-layers 4,2,2 lists 3 stage\\(s\\); --pp 2 needs one entry per stage"),
])
def test_bad_stage_layers_are_one_usage_error(stage_layers, pp, words):
    with pytest.raises(UsageError, match=words):
        ModelSpec(**{**GPT, "layers": 8}, stage_layers=stage_layers).check(1, 1, pp, 1, 1)


def test_cp_ring_attention_is_modelled_and_shares_the_dp_group():
    vol = table(step_traffic(ModelSpec(**GPT), Layout(16, cp=4)))
    kv = 2 * 1024 // 4 * 1024 * 2  # K and V of the rank's sequence quarter
    assert vol["cp"] == {"send": (2 * 3 * 3, 2 * 3 * 3 * kv)}  # (cp-1) hops forward, 2(cp-1) backward
    assert "dp-cp" in vol and "dp" not in vol


# -- the toy experiments: spec fields mapped onto the chapter's models -----------------------------------
def _ledger_table(events, rank):
    out = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for e in events:
        if e.rank == rank:
            cell = out[e.axis][e.op]
            cell[0] += 1
            cell[1] += model_bytes(e)
    return {axis: {op: tuple(v) for op, v in ops.items()} for axis, ops in out.items()}


@pytest.mark.parametrize("name,overrides", [("tp_ar_b128", {}), ("tp_ar_b128", {"world": 8}), ("tp_sp_b128", {})])
def test_volume_equals_the_tp_mlp_ledger(name, overrides):
    exp = experiments.get(name)
    cfg = exp.config(overrides)
    # The chapter's MLP is one MLP-only layer (heads 0): X [B, D] -> W1 [H, D] -> W2 [D, H]; its B rows are
    # the tokens of one microbatch (one sequence of B tokens: sequence parallelism shards those rows).
    spec = ModelSpec(layers=1, hidden=cfg.hidden, ffn=cfg.ffn, seq_len=cfg.batch, micro_batch=1, heads=0,
                     experts=0, dtype="float32", microbatches=1, sequence_parallel=cfg.sequence_parallel)
    want = table(step_traffic(spec, cfg.layout))
    events = exp.predict(cfg)
    for rank in range(cfg.world):
        assert _ledger_table(events, rank) == want


@pytest.mark.parametrize("name,overrides", [("pp_mb8", {}), ("pp_mb1", {"world": 8})])
def test_volume_equals_the_pipeline_ledger(name, overrides):
    exp = experiments.get(name)
    cfg = exp.config(overrides)
    # Two stages of one Linear each, [N, D] -> [N, H] -> [N, D]: the boundary carries width H, so the
    # spec's hidden is H; a spec layer is an MLP (2 x hidden x ffn weights), so ffn = D / 2 gives a stage
    # the toy's D x H weights. One layer per stage; a microbatch's N / M rows are its tokens.
    assert cfg.pp == 2, "widths alternate D, H, D... beyond two stages; the spec has one width"
    spec = ModelSpec(layers=cfg.pp, hidden=cfg.ffn, ffn=cfg.hidden // 2, seq_len=cfg.batch // cfg.microbatches,
                     micro_batch=1, heads=0, dtype="float32",
                     microbatches=cfg.microbatches)
    want = table(step_traffic(spec, cfg.layout))
    events = exp.predict(cfg)
    for rank in range(cfg.world):
        got = _ledger_table(events, rank)
        assert got["pp"] == want["pp"]
        # bytes per axis agree; calls differ: the toy stage holds one weight, a spec layer two halves
        assert {a: sum(b for _, b in ops.values()) for a, ops in got.items()} == \
               {a: sum(b for _, b in ops.values()) for a, ops in want.items()}
        assert (got["dp"]["all_reduce"][0], want["dp"]["all_reduce"][0]) == (1, 2)
        # per stage, which way each message goes: stage 0 sends activations forward, stage 1 receives them
        stage = cfg.layout.coords(rank)["pp"]
        assert {(e.op, e.phase) for e in events if e.rank == rank and e.axis == "pp"} == \
               {(t.op, t.phase) for t in stage_traffic(spec, cfg.layout, stage) if t.axis == "pp"}


# -- group math ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,gpn,sizes", [(32, 4, _sizes(tp=2, cp=2, pp=2, ep=2)), (12, 4, _sizes(tp=2, pp=3))])
def test_crossing_counts_and_dedupe_agree_with_brute_force_groups(world, gpn, sizes):
    seen: dict[tuple, tuple] = {}
    for perm in itertools.permutations(ORDER_AXES):
        try:
            layout = Layout(world, **sizes, order="-".join(perm))
        except UsageError:
            continue
        key, groups = [], []
        for axis in AXIS_MEMBERS:
            if layout.size(axis) == 1:
                continue
            gs = layout.groups(axis)
            spans = axis_spans(layout, axis)
            crosses = [len({r // gpn for r in g}) > 1 for g in gs]
            assert crossing_groups(world, gpn, spans) == sum(crosses), (perm, axis)
            pp_spans = axis_spans(layout, "pp") or ((1, 1),)
            if axis == "pp":  # per boundary: the pairs (stage b, stage b + 1) of each pipeline
                want = [sum(g[b] // gpn != g[b + 1] // gpn for g in gs) for b in range(layout.pp - 1)]
                assert crossing_boundaries(world, gpn, pp_spans[0]) == tuple(want), perm
            else:  # per stage: a group's ranks share one pp coordinate
                want = [sum(c for g, c in zip(gs, crosses) if layout.coords(g[0])["pp"] == st)
                        for st in range(layout.pp)]
                assert crossing_per_stage(world, gpn, spans, pp_spans[0]) == tuple(want), (perm, axis)
            key.append(spans)
            groups.append(tuple(map(tuple, gs)))
        # same key <=> same groups on every axis
        assert seen.setdefault(tuple(key), tuple(groups)) == tuple(groups)
    assert len(set(seen.values())) == len(seen) > 1


# -- rankings on hand-computed cases -------------------------------------------------------------------
def _ar(link, n, count, total_bytes):
    return count * link.latency_s + 2 * (n - 1) / n * total_bytes / link.bandwidth


def test_usual_answer_tp_inside_the_node_dp_across():
    r = rank_placements(16, 8, ModelSpec(**GPT), _sizes(tp=8), INTRA, INTER)
    assert len(r.placements) == 2
    best, worst = r.placements
    act, dp_bytes = 1024 * 1024 * 2, 12 * 1024 ** 2 * 2 // 8 * 2
    assert best.total_s == pytest.approx(_ar(INTRA, 8, 8, 8 * act) + _ar(INTER, 2, 8, dp_bytes))
    assert worst.total_s == pytest.approx(_ar(INTER, 8, 8, 8 * act) + _ar(INTRA, 2, 8, dp_bytes))
    cost = {a.axis: a for a in best.axes}
    assert (cost["tp"].crossing, cost["dp"].crossing, cost["dp"].groups) == (0, 8, 8)
    assert best.order == "tp-cp-ep-dp-pp"
    assert best.reason() == "dp crosses nodes: 6.29 MB/step over 10 GB/s links; inside the node: tp"
    assert [p.step_s for p in r.placements] == pytest.approx([p.total_s for p in r.placements])  # one stage


def _best_crossing(r):
    return {a.axis: a.crossing for a in r.placements[0].axes}


def test_expert_placement_flips_with_expert_size():
    """Token-heavy MoE: the all-to-alls outweigh the expert gradients, EP stays inside the node. Experts
    far larger than the activations: their expert-DP sync outweighs the all-to-alls, so edp goes inside
    and EP crosses (the chapter: "when experts are far larger than activations, the best mapping changes")."""
    moe = dict(layers=1, hidden=1024, heads=0, experts=8, topk=2, dtype="bf16")
    tokens_heavy = ModelSpec(**moe, ffn=256, seq_len=8192, microbatches=4)
    r = rank_placements(16, 8, tokens_heavy, _sizes(ep=8), INTRA, INTER)
    assert len(r.placements) == 2 and _best_crossing(r)["ep"] == 0 and _best_crossing(r)["edp"] == 8
    experts_heavy = ModelSpec(**moe, ffn=65536, seq_len=128)
    r = rank_placements(16, 8, experts_heavy, _sizes(ep=8), INTRA, INTER)
    assert _best_crossing(r)["ep"] == 2 and _best_crossing(r)["edp"] == 0
    a2a, expert, router = 128 * 2 * 1024 * 2, 2 * 65536 * 1024 * 2, 8 * 1024 * 2
    a2a_inter = 4 * INTER.latency_s + 7 / 8 * 4 * a2a / INTER.bandwidth
    assert r.placements[0].total_s == pytest.approx(a2a_inter + _ar(INTRA, 2, 2, expert) + _ar(INTER, 16, 1, router))
    assert "ep crosses nodes" in r.placements[0].reason()


def test_pipeline_goes_inside_the_node_when_activations_outweigh_weights():
    mlp = dict(layers=2, heads=0, dtype="bf16")
    weights_heavy = ModelSpec(**mlp, hidden=4096, ffn=16384, seq_len=256)
    r = rank_placements(16, 8, weights_heavy, _sizes(pp=2), INTRA, INTER)
    assert len(r.placements) == 2 and _best_crossing(r) == {"dp": 0, "pp": 8}
    activations_heavy = ModelSpec(**mlp, hidden=1024, ffn=1024, seq_len=16384, micro_batch=4, microbatches=16)
    r = rank_placements(16, 8, activations_heavy, _sizes(pp=2), INTRA, INTER)
    assert _best_crossing(r) == {"dp": 2, "pp": 0}
    msg, weights = 4 * 16384 * 1024 * 2, 2 * 1024 * 1024 * 2
    pp_intra = 2 * 16 * (INTRA.latency_s + msg / INTRA.bandwidth)  # 16 sends + 16 receives, blocking
    assert r.placements[0].total_s == pytest.approx(pp_intra + _ar(INTER, 8, 2, weights))


def _p2p(link, msgs, size):
    return msgs * (link.latency_s + size / link.bandwidth)


def test_unbalanced_stages_flip_the_pipeline_placement():
    """The chapter's unbalanced-stage flip. dp 8 x pp 2 on two nodes of 8: either dp or pp goes inside a node.
    Per microbatch an end stage sends one activation and receives one gradient, [1792, 1024] bf16 =
    3.67 MB, exactly the ring bytes 2(8-1)/8 x 2 MiB of one layer-weight all-reduce over dp 8: so with
    M = 4 the pipelined pp messages weigh (M + p - 1) / M x 2M = 10 calls against 2 x layers_s dp calls
    of the same cost, and the flip sits at layers_s = 5. Even stages (4 + 4) keep pp inside the node;
    6 + 2 makes stage 0's 12 dp all-reduces pace the step, so dp goes inside and pp crosses."""
    mlp = dict(layers=8, hidden=1024, ffn=1024, seq_len=1792, heads=0, dtype="bf16", microbatches=4)
    msg, ar = 1792 * 1024 * 2, 1024 * 1024 * 2  # one activation; one layer weight's gradient
    even = rank_placements(16, 8, ModelSpec(**mlp), _sizes(pp=2), INTRA, INTER)
    assert len(even.placements) == 2 and _best_crossing(even) == {"dp": 2, "pp": 0}
    assert even.placements[0].step_s == pytest.approx(5 / 4 * _p2p(INTRA, 8, msg) + _ar(INTER, 8, 8, 8 * ar))
    assert even.placements[1].step_s == pytest.approx(5 / 4 * _p2p(INTER, 8, msg) + _ar(INTRA, 8, 8, 8 * ar))

    skewed = rank_placements(16, 8, ModelSpec(**mlp, stage_layers=(6, 2)), _sizes(pp=2), INTRA, INTER)
    assert _best_crossing(skewed) == {"dp": 0, "pp": 8}
    best, worst = skewed.placements
    assert best.step_s == pytest.approx(5 / 4 * _p2p(INTER, 8, msg) + _ar(INTRA, 8, 12, 12 * ar))
    assert worst.step_s == pytest.approx(5 / 4 * _p2p(INTRA, 8, msg) + _ar(INTER, 8, 12, 12 * ar))
    assert (best.pacing.stage, worst.pacing.stage) == (0, 0)
    assert worst.reason().startswith("stage 0 holds 6 of 8 layers and paces the step: dp traffic 5.6 ms")
    assert best.reason().endswith("inside the node: dp")
    # the light stage alone would have kept pp inside: 2 x 2 dp calls < 10 pp calls
    assert best.stages[1].step_s > worst.stages[1].step_s


def test_compute_decides_which_stage_paces():
    """Per-layer compute adds (M + p - 1) x layers_s x layer_s to stage s's time, the same under every
    placement: it moves the step but not a stage's ranking, and it names the heavy stage as the pacer."""
    spec = ModelSpec(layers=8, hidden=1024, ffn=1024, seq_len=1792, heads=0, dtype="bf16", microbatches=4,
                     stage_layers=(2, 6))
    bare = rank_placements(16, 8, spec, _sizes(pp=2), INTRA, INTER)
    busy = rank_placements(16, 8, spec, _sizes(pp=2), INTRA, INTER, layer_s=1e-3)
    assert [p.order for p in busy.placements] == [p.order for p in bare.placements]
    for b, p in zip(busy.placements, bare.placements):
        assert [st.step_s for st in b.stages] == pytest.approx([st.step_s + 5 * n * 1e-3
                                                                for st, n in zip(p.stages, (2, 6))])
        assert b.pacing.stage == 1 and "paces the step: compute 30 ms" in b.reason()
    with pytest.raises(UsageError, match="--layer-ms -1.0 must be >= 0"):
        rank_placements(16, 8, spec, _sizes(pp=2), INTRA, INTER, layer_s=-1e-3)


def test_scale_16k_ranks_five_axes_partitions_the_orders():
    spec = ModelSpec(layers=32, hidden=4096, ffn=14336, seq_len=4096, heads=32, experts=64, topk=2,
                     sequence_parallel=True, microbatches=16)
    r = rank_placements(16384, 8, spec, _sizes(tp=8, cp=2, pp=8, ep=8), INTRA, INTER)
    assert sum(len(p.orders) for p in r.placements) + len(r.skipped_orders) == 120
    totals = [p.step_s for p in r.placements]
    assert totals == sorted(totals) and totals[0] < totals[-1]
    assert {a.axis for a in r.placements[0].axes} == {"tp", "cp", "dp-cp", "pp", "ep", "edp"}


# -- links from a sweep ---------------------------------------------------------------------------------
def test_intra_link_from_a_saved_sweep(tmp_path):
    alpha, beta = 40e-6, 1 / 200e9
    sizes = [1 << 20, 1 << 22, 1 << 24]
    fit = fit_alpha_beta("all_reduce", 4, sizes, [alpha + beta * s for s in sizes])
    (tmp_path / "sweep.json").write_text(json.dumps({"kind": "sweep", "fits": [fit.to_json()]}))
    link = link_from_sweep(tmp_path)
    assert link.latency_s == pytest.approx(alpha)
    assert link.bandwidth == pytest.approx(1.5 * 200e9)  # busbw = 2(n-1)/n x algbw
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UsageError, match="not a readable"):
        link_from_sweep(tmp_path / "bad.json")


# -- the command line -----------------------------------------------------------------------------------
ARGS = ["place", "--world", "16", "--tp", "8", "--layers", "2", "--hidden", "1024", "--ffn", "4096",
        "--seq", "1024", "--heads", "16"]


def test_cli_json_is_one_document_and_writes_the_plot(tmp_path, capsys):
    png = tmp_path / "rank.png"
    assert main([*ARGS, "--json", "--plot", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["order"] for p in doc["placements"]] == ["tp-cp-ep-dp-pp", "cp-ep-dp-tp-pp"]
    assert doc["placements"][0]["axes"]["dp"]["crossing_groups"] == 8
    assert doc["volume"]["tp"]["all_reduce"] == {"calls": 8, "bytes": 8 * 1024 * 1024 * 2}
    assert doc["placements"][0]["stages"][0]["layers"] == 2 and doc["spec"]["stage_layers"] == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra,words", [
    (["--world", "12"], "not divisible by tp*cp*pp"),
    (["--gpus-per-node", "5"], "--gpus-per-node 5 does not divide --world 16"),
    (["--dtype", "fp8"], "--dtype 'fp8' is not a float dtype"),
    (["--heads", "4"], "--tp 8 does not divide --heads 4"),
    (["--ep", "2"], "need an MoE model"),
    (["--pp", "2", "--stage-layers", "2,1"], "--stage-layers 2,1 must be integers >= 1 summing to --layers 2"),
    (["--pp", "2", "--stage-layers", "2"], "--stage-layers 2 lists 1 stage(s); --pp 2 needs one entry per stage"),
    (["--stage-layers", "1;1"], "--stage-layers '1;1' is not a comma-separated list of integers"),
])
def test_cli_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, extra, words):
    png = tmp_path / "rank.png"
    assert main([*ARGS, *extra, "--plot", str(png)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err
    assert not png.exists()
