"""Pipeline parallelism: schedules vs torch's, P2P program, predictor figures, timeline, and real runs."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import torch.distributed.pipelining.schedules as torch_schedules
import torch.nn.functional as F

from meshscope import experiments
from meshscope.core.errors import UsageError
from meshscope.core.events import counts
from meshscope.core.mesh import Layout
from meshscope.experiments.pp.config import ORDER, fault_knobs
from meshscope.models.pipeline import timeline
from meshscope.models.pipeline.schedules import Exchange, actions, check_matched, peak_stash, program, stash_bound
from meshscope.models.pipeline.stage import stage_forward

from .helpers import cli_here, failed_checks, run_many

KIB, MIB = 1024, 1024 * 1024


# -- torch's Schedule1F1B, executed against a recording fake stage ------------------------------------
class _FakeStage:
    """Records compute calls; its P2P ops are labels, so torch's batching is recorded too."""

    def __init__(self, pp: int, stage: int, log: list):
        self.stage_index, self.pp, self.log = stage, pp, log

    def forward_one_chunk(self, i, *args, **kwargs):
        self.log.append(f"F{i}")

    def backward_one_chunk(self, i, **kwargs):
        self.log.append(f"B{i}")

    def get_fwd_recv_ops(self, i):
        return [("activation", i, self.stage_index - 1)] if self.stage_index > 0 else []

    def get_fwd_send_ops(self, i):
        return [("activation", i, self.stage_index)] if self.stage_index < self.pp - 1 else []

    def get_bwd_recv_ops(self, i):
        return [("gradient", i, self.stage_index)] if self.stage_index < self.pp - 1 else []

    def get_bwd_send_ops(self, i):
        return [("gradient", i, self.stage_index - 1)] if self.stage_index > 0 else []

    def perform_reduce_grad(self, *args):
        pass

    def release_fwd_send_outputs(self, i):  # torch 2.15 frees a sent activation once its send completed
        pass


class _Recording1F1B(torch_schedules.Schedule1F1B):
    """Schedule1F1B with its real `_step_microbatches`; only the stage and loss plumbing is faked."""

    def __init__(self, pp: int, stage: int, m: int, log: list):  # no super(): no real PipelineStage
        self._n_microbatches, self._num_stages, self.scale_grads = m, pp, False
        self._finalize_gradients = True  # torch 2.15: reduce the stage's gradients at the step's end
        self._stage = _FakeStage(pp, stage, log)

    def _check_inputs(self, *args):
        return [()] * self._n_microbatches, [{}] * self._n_microbatches

    def _initialize_stage(self, *args):
        pass

    def _maybe_compute_loss(self, *args):
        pass

    def _maybe_get_loss(self, *args):
        return None

    def _update_losses(self, *args):
        pass


def torch_1f1b(pp: int, stage: int, m: int, monkeypatch) -> tuple[list[str], list[frozenset]]:
    """(compute order, P2P batches with more than one op) of torch's Schedule1F1B for one stage."""
    log, batches = [], []
    monkeypatch.setattr(torch_schedules, "_batch_p2p", lambda ops, desc=None: batches.append(list(ops)) or [])
    _Recording1F1B(pp, stage, m, log)._step_microbatches([()] * m, [{}] * m)
    return log, [frozenset(b) for b in batches if len(b) > 1]


GRID = [(pp, m) for pp in (2, 3, 4, 5) for m in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize("pp,m", GRID)
def test_1f1b_order_equals_torch_and_fusion_is_a_subset(pp, m, monkeypatch):
    for stage in range(pp):
        order, fused = torch_1f1b(pp, stage, m, monkeypatch)
        assert [str(a) for a in actions("1f1b", pp, stage, m)] == order, (pp, stage, m)
        ours = [frozenset((x.kind, x.microbatch, x.boundary) for x in e.messages)
                for e in program("1f1b", pp, stage, m) if isinstance(e, Exchange) and len(e.messages) > 1]
        # Every pair we fuse torch batches too; torch also batches some pairs the peer issues apart
        # (pp 2, M 1: stage 0 fuses send a0 + recv g0), which is safe only for non-blocking batches.
        assert set(ours) <= set(fused), (pp, stage, m)


def test_1f1b_warmup_steady_cooldown_shape():
    # Megatron's formulation, pp 4, M 8, stage 1: 2 warmup F, then F/B pairs, then 2 cooldown B.
    assert " ".join(map(str, actions("1f1b", 4, 1, 8))) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"
    assert " ".join(map(str, actions("gpipe", 2, 0, 3))) == "F0 F1 F2 B0 B1 B2"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_programs_match_across_boundaries_and_bound_the_stash(schedule):
    for pp in range(2, 9):
        for m in range(1, 17):
            check_matched(schedule, pp, m)  # raises on any boundary whose two ends disagree
            for stage in range(pp):
                want = m if schedule == "gpipe" else min(m, pp - stage)
                assert peak_stash(actions(schedule, pp, stage, m)) == stash_bound(schedule, pp, stage, m) == want


def test_unmatched_programs_are_detected(monkeypatch):
    import meshscope.models.pipeline.schedules as sched

    real = sched.gpipe

    def stage1_drains_in_reverse(pp, stage, m):
        acts = real(pp, stage, m)
        return acts[:m] + acts[m:][::-1] if stage == 1 else acts

    monkeypatch.setattr(sched, "gpipe", stage1_drains_in_reverse)
    with pytest.raises(RuntimeError, match="stages 0 and 1 disagree at exchange"):
        check_matched("gpipe", 2, 3)


def test_every_message_is_sent_and_received_once():
    pp, m = 3, 4
    msgs = Counter(x for s in range(pp) for e in program("1f1b", pp, s, m) if isinstance(e, Exchange) for x in e.messages)
    assert len(msgs) == (pp - 1) * 2 * m and set(msgs.values()) == {2}  # each on both ends, once


def test_p2p_cuts_autograd_and_the_gradient_message_rejoins_it():
    g = torch.Generator().manual_seed(0)
    x_bD, t_bD = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    w0_HD, w1_DH = (torch.randn(*s, generator=g).requires_grad_() for s in ((16, 8), (8, 16)))
    h_bH = stage_forward(x_bD, w0_HD, last=False)
    received_bH = h_bH.detach().clone().requires_grad_(True)  # what recv yields: bytes, no graph
    F.mse_loss(stage_forward(received_bH, w1_DH, last=True), t_bD).backward()
    assert received_bH.grad_fn is None and w0_HD.grad is None  # stage 0's weight is out of reach
    h_bH.backward(received_bH.grad)  # the gradient message, applied upstream
    want = torch.autograd.grad(F.mse_loss(stage_forward(stage_forward(x_bD, w0_HD, False), w1_DH, True), t_bD), w0_HD)[0]
    assert torch.allclose(w0_HD.grad, want)


# -- predictor ----------------------------------------------------------------------------------------
def _predict(name, **overrides):
    exp = experiments.get(name)
    cfg = exp.config(overrides)
    return cfg, exp.predict(cfg)


@pytest.mark.parametrize("name,m,msg_bytes", [("pp_mb1", 1, 256 * KIB), ("pp_mb8", 8, 32 * KIB), ("pp_1f1b_mb8", 8, 32 * KIB)])
def test_chapter_message_figures(name, m, msg_bytes):
    cfg, events = _predict(name)
    for rank in range(4):
        mine = [e for e in events if e.rank == rank]
        assert counts(mine) == {"all_reduce": 1, "send": m, "recv": m}
        p2p = [e for e in mine if e.op in ("send", "recv")]
        assert {e.bytes_in + e.bytes_out for e in p2p} == {msg_bytes}
        assert sum(e.bytes_in + e.bytes_out for e in p2p if e.phase == "forward") == 256 * KIB  # total unchanged
        assert {e.peer for e in p2p} == {rank ^ 1} and {e.group for e in p2p} == {(rank & 2, (rank & 2) + 1)}
        (ar,) = [e for e in mine if e.op == "all_reduce"]
        assert (ar.bytes_in, ar.group, ar.phase) == (2 * MIB, (rank % 2, rank % 2 + 2), "optimizer")


def test_chapter_rank_mapping():
    layout = experiments.get("pp_mb8").config({}).layout
    assert layout.groups("pp") == [[0, 1], [2, 3]] and layout.groups("dp") == [[0, 2], [1, 3]]
    assert layout == Layout(4, pp=2, order="pp-tp-cp-ep-dp")


def test_pp4_middle_stages_talk_to_both_neighbours():
    _, events = _predict("pp_mb8", pp=4, schedule="1f1b")
    for rank, peers in ((0, {1}), (1, {0, 2}), (2, {1, 3}), (3, {2})):
        p2p = [e for e in events if e.rank == rank and e.op in ("send", "recv")]
        assert len(p2p) == 2 * 8 * len(peers) and {e.peer for e in p2p} == peers
        assert not [e for e in events if e.rank == rank and e.op == "all_reduce"]  # dp 1: nothing to sync
    widths = {e.bytes_in + e.bytes_out for e in events if e.op == "send" and e.rank in (1, 2)}
    assert widths == {8 * 512 * 4, 8 * 1024 * 4}  # alternating D, H boundaries


@pytest.mark.parametrize("overrides,fragment", [
    ({"batch": 60, "microbatches": 8}, "--batch 60 is not divisible by --microbatches 8"),
    ({"pp": 8}, "--world 4 is not divisible by pp = 8"),
    ({"pp": 3}, "--world 4 is not divisible by pp = 3"),
    ({"pp": 1}, "--pp 1 has no stage boundary"),
    ({"schedule": "zb"}, "--schedule 'zb' is not one of"),
    ({"world": 4, "dp": 4}, "--world 4 disagrees with pp x --dp 4 = 8"),
    ({"fault_p2p_order": True}, "the p2p-order fault needs an exchange carrying messages both ways"),
])
def test_bad_configs_are_usage_errors(overrides, fragment):
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(")):
        experiments.get("pp_mb8").config(overrides)


@pytest.mark.parametrize("pp", [2, 4])
def test_faults_are_planted_in_fault_rank_replica_only(pp):
    """FAULT_RANK = 1 is stage 1 of replica 0; p2p-order plants on both ends of its upstream boundary."""
    layout = Layout(8, pp=pp, order=ORDER)
    knobs = lambda **fault: [fault_knobs(experiments.get("pp_1f1b_mb8").config({"world": 8, "pp": pp, **fault}),  # noqa: E731
                                         layout, r) for r in range(8)]
    assert [k.get("send_first_with") for k in knobs(fault_p2p_order=True)] == [1, 0] + [None] * 6
    assert [k.get("drop_gradients", False) for k in knobs(fault_pp_no_grad=True)] == [False, True] + [False] * 6
    assert [k.get("expect_extra_rows", 0) for k in knobs(fault_p2p_shape=True)] == [0, 1] + [0] * 6
    assert all(k in ({}, {"expect_extra_rows": 0, "drop_gradients": False}) for k in knobs())


def test_cli_bad_microbatches_is_one_line():
    out = cli_here("predict", "pp_mb8", "--batch", "10", "--microbatches", "4")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "--microbatches 4" in out.stderr


# -- timeline -----------------------------------------------------------------------------------------
def test_bubble_theory_and_measure(tmp_path):
    assert timeline.bubble_theory(2, 1) == 0.5 and timeline.bubble_theory(2, 8) == 1 / 9
    assert timeline.bubble_theory(4, 8) == 3 / 11
    # An ideal 2-stage fill-drain of M=2 with unit F and B: each rank idles 2 of 6 units = 1/3 = theory.
    f = lambda mb, k, t: {"microbatch": mb, "kind": k, "start_us": t, "end_us": t + 1}  # noqa: E731
    spans = [[f(0, "F", 0), f(1, "F", 1), f(0, "B", 4), f(1, "B", 5)],
             [f(0, "F", 1), f(1, "F", 2), f(0, "B", 3), f(1, "B", 4)]]
    assert timeline.bubble_fraction(spans) == pytest.approx(timeline.bubble_theory(2, 2))
    section = {"schedule": "gpipe", "pp": 2, "microbatches": 2, "clock": "test", "bubble_fraction": 1 / 3,
               "bubble_theory": 1 / 3, "ranks": [{"rank": r, "stage": r, "spans": s} for r, s in enumerate(spans)]}
    trace_path, png_path = timeline.write_files(tmp_path, "t", section)
    assert [trace_path, png_path] == [str(tmp_path / p) for p in timeline.paths("t")]
    assert timeline.paths("t") == ["figures/t.timeline.json", "figures/t.timeline.png"]
    trace = json.loads(open(trace_path).read())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 8 and {e["tid"] for e in xs} == {0, 1} and xs[0]["name"] == "F0"
    assert open(png_path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# -- real runs: every schedule, pp 2 (two replicas) and pp 4 (dp 1), M in {1, 3, 8}, one launch ---------
RUNS = [(pp, schedule, m) for pp in (2, 4) for schedule in ("gpipe", "1f1b") for m in (1, 3, 8)]


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    items = [("pp_mb8", {"pp": pp, "schedule": schedule, "microbatches": m, "batch": 24 if m == 3 else 64})
             for pp, schedule, m in RUNS]
    run_dir = tmp_path_factory.mktemp("pp_world4")
    return run_dir, dict(zip(RUNS, run_many(run_dir, items, world=4, timeout=120)))


@pytest.mark.parametrize("key", RUNS, ids=[f"pp{p}-{s}-mb{m}" for p, s, m in RUNS])
def test_runs_pass_with_predicted_counts_and_stash(world4, key):
    pp, schedule, m = key
    result = world4[1][key]
    assert result["passed"], failed_checks(result)
    assert result["comm"]["match"]
    for row in result["comm"]["per_rank"]:
        stage = row["rank"] % pp
        neighbours = (stage > 0) + (stage < pp - 1)
        assert row["captured"].get("send", 0) + row["captured"].get("recv", 0) == 2 * m * neighbours
        assert row["captured"].get("all_reduce", 0) == (1 if pp == 2 else 0)
    assert result["numerics"]["max_abs_err_grad"] <= 2e-5
    tl = result["timeline"]
    for r in tl["ranks"]:
        assert r["peak_stash"] == (m if schedule == "gpipe" else min(m, pp - r["stage"]))
        assert sorted((s["kind"], s["microbatch"]) for s in r["spans"]) == sorted((k, i) for k in "FB" for i in range(m))
    assert tl["bubble_theory"] == pytest.approx((pp - 1) / (m + pp - 1))
    assert 0 <= tl["bubble_fraction"] < 1
    if (pp, schedule, m) == (2, "gpipe", 8):  # pp_mb8 as registered: its own name, no suffix
        assert result["label"] == "pp_mb8"
    assert tl["files"] == [f"figures/{result['label']}.timeline.json", f"figures/{result['label']}.timeline.png"]


@pytest.mark.parametrize("pp,m", [(2, 1), (2, 3), (2, 8), (4, 3), (4, 8)])
def test_gpipe_and_1f1b_train_identical_weights(world4, pp, m):
    runs = world4[1]
    assert runs[(pp, "gpipe", m)]["timeline"]["weights_digest"] == runs[(pp, "1f1b", m)]["timeline"]["weights_digest"]


def test_run_labels_name_the_changed_options(world4):
    assert len({r["label"] for r in world4[1].values()}) == len(RUNS)  # no two runs share their files
    exp = experiments.get("pp_mb1")
    assert exp.label({}) == exp.label({"schedule": "gpipe"}) == "pp_mb1"  # the preset's own value changes nothing
    assert exp.label({"schedule": "1f1b"}) == "pp_mb1-schedule-1f1b"
    assert experiments.get("pp_mb8").label({"microbatches": 4, "pp": 4}) == "pp_mb8-pp-4-microbatches-4"
    assert experiments.get("ep_skewed").label({"skew": "3:1", "input_grad": False}) == "ep_skewed-skew-3_1-no-input-grad"


def test_a_run_keeps_its_timeline_once_under_figures_and_report_redraws_it(tmp_path):
    """`meshscope run` draws the timeline once, under figures/ and named after the run's label (the
    experiment plus the options given); the ranks write none; `meshscope report` redraws it. (World 2:
    one pipeline, no replica.)"""
    out = tmp_path / "run"
    proc = cli_here("run", "pp_mb1", "--world", 2, "--schedule", "1f1b", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = ["figures/pp_mb1-world-2-schedule-1f1b.timeline.json", "figures/pp_mb1-world-2-schedule-1f1b.timeline.png"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.timeline.*")) == want
    assert json.loads((out / "result.json").read_text())["timeline"]["files"] == want
    assert "figures/pp_mb1-world-2-schedule-1f1b.timeline.png" in " ".join(proc.stdout.split())
    for name in want:
        (out / name).unlink()
    proc = cli_here("report", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.timeline.*")) == want
    assert all((out / name).stat().st_size > 0 for name in want)


def test_chapter_pp_mb8_1f1b_interleaves(world4):
    spans = world4[1][(2, "1f1b", 8)]["timeline"]["ranks"][1]["spans"]  # rank 1 = last stage
    assert "".join(s["kind"] for s in spans) == "FB" * 8
