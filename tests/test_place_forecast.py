"""``place --from-trace DIR --cluster SPEC``: placements ranked by the forecast's job step (`place.forecast_ranking`).

Oracles: the node maps and the winners are worked out here by hand from `mesh.Layout`'s convention (leftmost axis
fastest) and the link figures of tests/test_forecast_cluster.py (NVLink 370.8 GB/s of bus bandwidth on an H100 SXM
node, one 400 Gb/s NIC at 47 GB/s between nodes); the end-to-end case takes its calls from tests/jobs/fsdp_tp.py's
docstring (per step: 4 tp all-reduces, 5 dp all-gathers and 3 dp reduce-scatters) and its bytes from the job's
shapes (`DP_BYTES`)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from meshscope.capture.work import WorkLog
from meshscope.core.events import CommEvent
from meshscope.core.mesh import Layout
from meshscope.core.trace_result import TraceResult
from meshscope.forecast.cluster import SHIPPED
from meshscope.forecast.collective_time import collective_time, default_nodes, span
from meshscope.forecast.inputs import TracedJob
from meshscope.forecast.step import forecast
from meshscope.place.forecast_ranking import placed_ranks, rank_by_forecast

from .helpers import cli_here

GIB = 1 << 30
NVLINK_H100 = 450e9 * 20.6 / 25  # bus bandwidth of a ring inside an H100 SXM node (tests/test_forecast_cluster.py)
NDR = 50e9 * 0.94  # one GPU's 400 Gb/s NIC as NCCL reaches it
HIDDEN, BATCH = 1024, 4
BLOCK = 4 * HIDDEN * HIDDEN // 2 + 4 * HIDDEN // 2 + HIDDEN * 4 * HIDDEN // 2 + HIDDEN  # fc1, fc2 on tp 2 (fc2's bias whole)
ROOT = 2 * (HIDDEN * HIDDEN + HIDDEN)  # inp and head, not tensor-parallel
DP_BYTES = 4 * ((2 * 2 * BLOCK + ROOT) + (2 * BLOCK + ROOT))  # fp32; all-gathers 2 x 2 blocks + root, scatters 3 units
TP_BYTES = 4 * 4 * BATCH * HIDDEN  # 4 all-reduces of [batch, hidden] fp32


def _cluster(gpus_per_node: int):
    h100 = SHIPPED["h100-sxm"]
    return replace(h100, network=replace(h100.network, gpus_per_node=gpus_per_node))


# -- the node map --------------------------------------------------------------------------------------------------
def test_a_rank_moves_to_where_its_coordinates_sit_in_the_other_order():
    # trace tp-cp-ep-dp-pp, world 8, tp 2: r = tp + 2 dp; in dp-tp-cp-ep-pp the same coordinates sit at dp + 4 tp
    trace = Layout(8, tp=2)
    assert placed_ranks(trace, replace(trace, order="dp-tp-cp-ep-pp")) == (0, 4, 1, 5, 2, 6, 3, 7)
    assert placed_ranks(trace, trace) == tuple(range(8))  # the trace's own order moves nothing
    assert placed_ranks(trace, replace(trace, order="cp-tp-ep-pp-dp")) == tuple(range(8))  # size-1 axes: the same


def test_an_order_that_pairs_experts_otherwise_is_no_relabelling_of_the_trace():
    # world 4, ep 2 (dense: dp 4 at stride 1; expert: ep at stride 1, edp 2 at stride 2). In tp-cp-dp-ep-pp the dense
    # ranks stay (dp still fastest) but rank 1 (ep 1, edp 0) would sit at edp + 2 ep = 2: dense and expert disagree
    trace = Layout(4, ep=2)
    assert placed_ranks(trace, replace(trace, order="tp-cp-dp-ep-pp")) is None
    assert placed_ranks(trace, replace(trace, order="cp-tp-ep-dp-pp")) == (0, 1, 2, 3)


def test_the_default_node_map_is_rank_over_gpus_per_node():
    nodes = default_nodes(4)
    assert [nodes(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert span([0, 1, 4, 5, 6], nodes) == (2, 2)
    # another map: the same group on one node
    assert span([0, 1, 4, 5, 6], {0: 3, 1: 3, 4: 3, 5: 3, 6: 3}.__getitem__) == (1, 5)


# -- a job written by hand -----------------------------------------------------------------------------------------
def _job(tp_bytes: int, dp_bytes: int) -> TracedJob:
    """World 4, tp 2 x dp 2 in order tp-cp-ep-dp-pp (tp {0,1} {2,3}, dp {0,2} {1,3}), every rank traced: each step
    one tp all-reduce then one dp all-reduce, each waited for at once, no compute."""
    trace = Layout(4, tp=2)
    ledgers, programs, work = {}, {}, {}
    for r in range(4):
        ledgers[r] = [CommEvent(r, 0, "all_reduce", "tp", tuple(trace.group_of("tp", r)), "backward", "float32",
                                tp_bytes, tp_bytes, step=1),
                      CommEvent(r, 0, "all_reduce", "dp", tuple(trace.group_of("dp", r)), "backward", "float32",
                                dp_bytes, dp_bytes, step=1)]
        programs[r] = [["i", 0, 0], ["w", 0, 0], ["i", 1, 0], ["w", 1, 0]]
        work[r] = WorkLog(r)
    result = TraceResult(world=4, command=["job.py"], events=[e for r in range(4) for e in ledgers[r]], axes={},
                         layout={}, checks=[], ranks=[])
    return TracedJob(Path("hand"), result, 1, ledgers, work, programs, {r: r for r in range(4)}, {r: 1 for r in range(4)})


@pytest.mark.parametrize("heavy", ["tp", "dp"])
def test_the_placement_that_keeps_the_heavy_axis_inside_a_node_wins(heavy):
    # 2 GPUs a node: either tp's groups or dp's sit inside a node, the other axis crosses. The heavy axis moves 1 GiB
    # (over NVLink about 1 GiB / 370.8 GB/s = 2.9 ms; through one NIC per node at least 1 GiB / 47 GB/s = 22.8 ms),
    # the light one 1 KiB (microseconds either way): the placement with the heavy axis inside wins
    job = _job(GIB if heavy == "tp" else 1024, GIB if heavy == "dp" else 1024)
    cluster = _cluster(2)
    ranking = rank_by_forecast(job, Layout(4, tp=2), cluster)
    assert len(ranking.placements) == 2 and ranking.orders == 120 and not ranking.skipped_orders
    best, worst = ranking.placements
    light = "dp" if heavy == "tp" else "tp"
    # the heavy axis is the faster of the two in every winning order (leftmost fastest), and never in a losing one
    assert all(o.index(heavy) < o.index(light) for o in best.orders)
    assert all(o.index(light) < o.index(heavy) for o in worst.orders)
    assert best.crossing == {heavy: 0, light: 1} and worst.crossing == {heavy: 1, light: 0}
    assert best.step_s <= GIB / NVLINK_H100 + 100e-6 and worst.step_s >= GIB / NDR
    # the step is the two calls one after the other, each on the links the placement's node map gives it
    (tp_call, dp_call) = job.ledgers[0]
    assert best.step_s == pytest.approx(sum(collective_time(e, cluster, best.nodes.__getitem__).seconds
                                            for e in (tp_call, dp_call)), rel=1e-12)
    assert ranking.traced is (best if heavy == "tp" else worst)  # the trace ran tp-cp-ep-dp-pp: tp inside


def test_the_traces_own_order_forecasts_what_forecast_does():
    job = _job(1 << 20, 1 << 24)
    cluster = _cluster(2)
    own = rank_by_forecast(job, Layout(4, tp=2), cluster).traced
    assert own.nodes == (0, 0, 1, 1)  # rank r on node r // 2
    assert own.forecast.to_json() == forecast(job, cluster).to_json()


def test_one_node_holding_the_world_is_one_placement():
    ranking = rank_by_forecast(_job(1024, GIB), Layout(4, tp=2), _cluster(4))
    (only,) = ranking.placements
    assert len(only.orders) == 120 and only.crossing == {"tp": 0, "dp": 0}


# -- end to end ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """tests/jobs/fsdp_tp.py at world 4 (tp 2, dp 2; mesh [[0, 1], [2, 3]]), hidden 1024, fake tensors, work
    counted."""
    out = tmp_path_factory.mktemp("place-forecast") / "t"
    proc = cli_here("trace", "--fake-world", 4, "--fake-tensors", "--work", "--out", out, "--json", "--",
                    "tests/jobs/fsdp_tp.py", "--steps", 5, "--hidden", HIDDEN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_a_traced_job_is_ranked_by_its_forecast(traced):
    proc = cli_here("place", "--from-trace", traced, "--cluster", "h100-sxm", "--gpus-per-node", 2, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "place-forecast" and "forecast" in doc["ranked_by"] and doc["cluster"]["name"] == "h100-sxm"
    assert doc["layout"]["order"] == "tp-cp-ep-dp-pp" and doc["gpus_per_node"] == 2 and doc["nodes"] == 2
    # two axes of 2 on nodes of 2: tp's groups inside a node (the trace's order) or dp's, no third way
    placements = doc["placements"]
    assert len(placements) == 2 and doc["orders"] == 120
    assert [p["step_s"] for p in placements] == sorted(p["step_s"] for p in placements)
    own = next(p for p in placements if p["traced"])
    other = next(p for p in placements if not p["traced"])
    assert all(o.index("dp") < o.index("tp") for o in other["orders"])
    # per step (the job's docstring): 4 tp all-reduces; 5 all-gathers + 3 reduce-scatters on dp
    for p in placements:
        assert (p["axes"]["tp"]["calls"], p["axes"]["dp"]["calls"]) == (4, 8)
        assert (p["axes"]["tp"]["bytes"], p["axes"]["dp"]["bytes"]) == (TP_BYTES, DP_BYTES)
    assert (own["axes"]["tp"]["crossing_calls"], own["axes"]["dp"]["crossing_calls"]) == (0, 8)
    assert (other["axes"]["tp"]["crossing_calls"], other["axes"]["dp"]["crossing_calls"]) == (4, 0)
    # what crosses costs more on its link, and tp's all-reduces, read at once, are exposed whole
    assert other["axes"]["tp"]["seconds"] > own["axes"]["tp"]["seconds"]
    assert own["axes"]["dp"]["seconds"] > other["axes"]["dp"]["seconds"]
    assert other["axes"]["tp"]["exposed_s"] == pytest.approx(other["axes"]["tp"]["seconds"])
    # dp's 117.5 MB against tp's 64 KiB: dp inside the node wins. Across nodes dp's calls, one after another on its
    # group's stream, move half their bytes each way (a ring of 2) through one NIC: at least 1.25 ms of the step
    assert placements[0] is other and own["step_s"] >= DP_BYTES / 2 / NDR > other["step_s"]
    # the trace's own placement is the forecast of the trace on the same cluster
    plain = cli_here("forecast", "--from-trace", traced, "--cluster", "h100-sxm", "--gpus-per-node", 2, "--json")
    assert plain.returncode == 0, plain.stderr
    assert own["step_s"] == json.loads(plain.stdout)["step_s"]
    text = cli_here("place", "--from-trace", traced, "--cluster", "h100-sxm", "--gpus-per-node", 2)
    assert text.returncode == 0, text.stderr
    assert "ranked by the forecast's job step" in text.stdout and "h100-sxm" in text.stdout
    assert "2 distinct placements from 120 orders" in text.stdout and "(the trace's)" in text.stdout


def test_without_cluster_the_alpha_beta_ranking_stays(traced):
    proc = cli_here("place", "--from-trace", traced, "--gpus-per-node", 2, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "kind" not in doc and doc["links"]["inter"]["name"] == "inter-node" and len(doc["placements"]) == 2


def test_a_trace_without_work_names_the_trace_to_make(traced, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(traced, bare)
    shutil.rmtree(bare / "work")
    proc = cli_here("place", "--from-trace", bare, "--cluster", "h100-sxm", "--gpus-per-node", 2)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "meshscope trace --fake-world 4 --fake-tensors --work -- tests/jobs/fsdp_tp.py --steps 5" in proc.stderr
    # the alpha-beta ranking needs no work log
    assert cli_here("place", "--from-trace", bare, "--gpus-per-node", 2).returncode == 0


@pytest.mark.parametrize("args, words", [
    (("--cluster", "h100-sxm", "--world", "8"), "--from-trace DIR"),
    (("--cluster", "h900", "--from-trace", "TRACE"), "h900"),
    (("--cluster", "h100-sxm", "--from-trace", "TRACE", "--gpus-per-node", "3"), "--gpus-per-node 3"),
    (("--cluster", "h100-sxm", "--from-trace", "TRACE", "--gpus-per-node", "0"), "--gpus-per-node 0"),
    (("--cluster", "h100-sxm", "--from-trace", "TRACE", "--tp", "4"), "--tp 4"),
    (("--cluster", "h100-sxm", "--from-trace", "TRACE", "--plot", "x.png"), "--plot"),
    (("--cluster", "h100-sxm", "--compare-trace", "TRACE"), "--compare-trace"),
    # the alpha-beta model's options would be ignored by the forecast: refused, each named
    (("--cluster", "h100-sxm", "--from-trace", "TRACE", "--inter-bw", "50", "--hidden", "1024"), "--hidden, --inter-bw"),
    (("--cluster", "h100-sxm", "--from-trace", "TRACE", "--sp"), "--sp:"),
    (("--cluster", "h100-sxm", "--from-trace", "/nonexistent/trace"), "/nonexistent/trace"),
])
def test_bad_input_is_one_line(traced, args, words):
    proc = cli_here("place", *(str(traced) if a == "TRACE" else a for a in args))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr and "Traceback" not in proc.stderr
