"""The suite on a reduced subset: one launch, every table's figures checked against the predictor."""

import json
import shutil
from pathlib import Path

import pytest

from meshscope import experiments
from meshscope.core.errors import UsageError
from meshscope.core.events import counts
from meshscope.core.result import SuiteResult
from meshscope.report.suite import tables
from meshscope.suite.plan import SUITE, SuiteOptions, world_of
from meshscope.suite.verdicts import summary

from .helpers import cli, cli_here

SUBSET = ("tp_ar_b32", "tp_sp_b128", "pp_mb8", "pp_1f1b_mb1", "ep_balanced", "ep_skewed", "ep_nograd")
"""In the suite's order; two PP configurations, one of them (pp_1f1b_mb1) an experiment with an option changed."""


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    proc = cli_here("suite", "--configs", ",".join(SUBSET), "--rounds", 2, "--iters", 4, "--warmup", 1, "--out", out,
                    "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


def test_suite_summary_and_counts_match_the_predictor(suite_run):
    out, doc = suite_run
    assert doc["summary"]["passed"] and list(doc["results"]) == list(SUBSET)
    for label, result in doc["results"].items():
        exp = experiments.get(result["experiment"])
        predicted = exp.predict(exp.config({k: v for k, v in next(e for e in SUITE if e.label == label).overrides.items()}))
        for row in result["comm"]["per_rank"]:
            assert row["captured"] == counts(e for e in predicted if e.rank == row["rank"])
    chapter_counts = {"tp_ar_b32": {"all_reduce": 4}, "tp_sp_b128": {"all_reduce": 2, "all_gather": 2, "reduce_scatter": 2},
                   "pp_mb8": {"all_reduce": 1, "send": 8, "recv": 8}, "ep_skewed": {"all_reduce": 1, "all_to_all": 4},
                   "ep_nograd": {"all_reduce": 1, "all_to_all": 3}}
    for label, want in chapter_counts.items():
        assert doc["results"][label]["comm"]["per_rank"][0]["captured"] == want
    s = doc["summary"]
    predicted_events = 0
    for label in SUBSET:
        entry = next(e for e in SUITE if e.label == label)
        exp = experiments.get(entry.experiment)
        predicted_events += len(exp.predict(exp.config(dict(entry.overrides))))
    assert s["communication_records"] == predicted_events  # one record per captured event, as many as predicted
    assert s["timeline_records"] == 4 * 16 + 4 * 2  # pp_mb8: 8 F and 8 B spans on each of the 4 ranks; pp_1f1b_mb1: 1 and 1
    assert s["checked_invariants"] > 20


def test_suite_tables_show_the_chapter_payloads(suite_run):
    _, doc = suite_run
    payload = next(rows for title, _, rows in tables(SuiteResult.from_json(doc)) if title.startswith("payload"))
    cells = {(r[0], r[1], r[2], r[3]): (r[4], r[5]) for r in payload}
    assert cells[("tp_ar_b32", "tp", "all_reduce", "forward")] == ("64 KiB", "64 KiB")
    assert cells[("tp_sp_b128", "tp", "reduce_scatter", "forward")] == ("256 KiB", "128 KiB")
    assert cells[("tp_sp_b128", "tp", "all_gather", "forward")] == ("128 KiB", "256 KiB")
    assert cells[("tp_ar_b32", "dp", "all_reduce", "optimizer")] == ("1 MiB", "1 MiB")
    assert cells[("pp_mb8", "pp", "send", "forward")] == ("32 KiB", "0 B")
    assert cells[("pp_mb8", "dp", "all_reduce", "optimizer")] == ("2 MiB", "2 MiB")
    assert doc["results"]["ep_skewed"]["experts"]["tokens_per_expert"][0] == [112, 16]
    perf = next(rows for title, _, rows in tables(SuiteResult.from_json(doc)) if title.startswith("performance"))
    assert {r[0] for r in perf} == set(SUBSET)
    for label, t in doc["timing"].items():
        assert t["host"]["n"] == 2 * 4 and len(t["host_steps"]) == 4  # rounds x iters, per rank
        assert t["host"]["median"] == sorted(max(col) for col in zip(*t["host_steps"]))[3] * 0.5 + \
            sorted(max(col) for col in zip(*t["host_steps"]))[4] * 0.5
    (cmp,) = doc["comparisons"]  # only "ep balanced vs skewed" has both of its configs in the subset
    assert cmp["title"] == "ep balanced vs skewed"
    assert cmp["structure_a"]["tokens_per_expert"][0] == [64, 64] and cmp["structure_b"]["tokens_per_expert"][0] == [112, 16]
    assert cmp["timing_source"] == "measured: critical-rank host time"
    a, b = doc["timing"]["ep_balanced"]["host"], doc["timing"]["ep_skewed"]["host"]
    disjoint = a["p95"] < b["p5"] or b["p95"] < a["p5"]
    assert cmp["timing_distinguishable"] == disjoint
    # the verdict from the two series' own figures: stable only when both CVs are within the
    # threshold and the [P5, P95] intervals are disjoint
    noisy = a["cv"] > a["cv_threshold"] or b["cv"] > b["cv_threshold"]
    want = ("stable" if disjoint and not noisy else
            "PERF_UNSTABLE, but the [P5, P95] intervals are disjoint" if disjoint else "PERF_UNSTABLE")
    assert cmp["timing_verdict"] == want
    assert cmp["timing_ratio"] == pytest.approx(doc["timing"]["ep_skewed"]["host"]["median"]
                                                / doc["timing"]["ep_balanced"]["host"]["median"])


def test_report_rerenders_a_saved_run(suite_run):
    out, doc = suite_run
    for name in ("report.md", "figures/performance.png", "figures/expert_load.png", "figures/pp_mb8.timeline.png",
                 "records/communication.jsonl", "records/invariants.jsonl", "records/training.jsonl"):
        (out / name).unlink()
    proc = cli_here("report", out)
    assert proc.returncode == 0, proc.stderr
    assert doc["summary"]["line"] in " ".join(proc.stdout.split())  # the terminal may wrap it
    for name in ("report.md", "figures/performance.png", "figures/expert_load.png", "figures/pp_mb8.timeline.png"):
        assert (out / name).stat().st_size > 0
    lines = (out / "records/communication.jsonl").read_text().splitlines()
    assert len(lines) == doc["summary"]["communication_records"]
    invariants = (out / "records/invariants.jsonl").read_text().splitlines()
    assert len(invariants) == doc["summary"]["checked_invariants"]
    assert "| tp_ar_b32 | tp | all_reduce | forward | 64 KiB | 64 KiB |" in (out / "report.md").read_text()
    assert summary(SuiteResult.from_json(doc)) == doc["summary"]


def test_doctor_reads_a_finished_suite_directory(suite_run):
    """A suite's result.json holds its results by label: the doctor reads each one (it once failed
    with KeyError: 0), and a healthy suite is reported healthy."""
    out, _ = suite_run
    proc = cli_here("doctor", out, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["healthy"] and report["findings"] == [] and report["ranks"] == [0, 1, 2, 3]
    assert "no problem found" in cli_here("doctor", out).stdout


def test_failed_suite_launch_still_prints_one_json_document(tmp_path):
    """--json prints exactly one document when the launch fails (here gloo cannot open its sockets on
    a network interface that does not exist, so every rank fails to start; two ranks do)."""
    proc = cli("suite", "--configs", "tp_ar_b32", "--world", 2, "--rounds", 1, "--iters", 1, "--warmup", 1,
               "--out", tmp_path, "--json", timeout=200, env={"GLOO_SOCKET_IFNAME": "nonexistent0"})
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "suite" and doc["passed"] is False and doc["run_dir"] == str(tmp_path) and doc["error"]


def test_suite_keeps_each_timeline_once_under_figures_named_after_its_config(suite_run):
    """One place, one name per file: each PP configuration's trace and Gantt chart are in figures/,
    named after the suite label (pp_1f1b_mb1, not the experiment with its options), nowhere else;
    result.json lists them and `meshscope report` redraws them there."""
    out, _ = suite_run
    want = {label: [f"figures/{label}.timeline.json", f"figures/{label}.timeline.png"]
            for label in ("pp_mb8", "pp_1f1b_mb1")}

    def timelines():
        return sorted(str(p.relative_to(out)) for p in out.rglob("*timeline*") if p.parent.name != "records")

    assert timelines() == sorted(f for files in want.values() for f in files)
    doc = json.loads((out / "result.json").read_text())
    assert {label: r["timeline"]["files"] for label, r in doc["results"].items() if r.get("timeline")} == want
    assert all(r.get("timeline") is None for label, r in doc["results"].items() if label not in want)
    for files in want.values():
        for name in files:
            (out / name).unlink()
    proc = cli_here("report", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert timelines() == sorted(f for files in want.values() for f in files)
    assert all((out / f).stat().st_size > 0 for files in want.values() for f in files)


@pytest.mark.parametrize("args, needle", [
    (("suite", "--configs", "tp_ar_b32,nope"), "unknown suite config 'nope'"),
    (("suite", "--iters", 0), "--iters 0 must be a positive integer"),
    (("suite", "--cuda-graph", "--configs", "tp_ar_b32"), "--cuda-graph replays CUDA graphs and needs --backend nccl"),
    (("sweep", "--cuda-graph"), "--cuda-graph replays CUDA graphs and needs --backend nccl"),
])
def test_suite_bad_input(args, needle, tmp_path):
    proc = cli_here(*args, "--out", tmp_path / "x")
    assert proc.returncode == 2 and needle in proc.stderr and not (tmp_path / "x").exists()


def test_graph_blockers_name_what_a_cuda_graph_cannot_replay():
    from meshscope.experiments import get

    fixed = [get(name).config({}) for name in ("ep_balanced", "ep_skewed", "ep_nograd")]
    assert all(get("ep_balanced").graph_blocker(cfg) is None for cfg in fixed)
    assert ".tolist()" in get("ep_learned").graph_blocker(get("ep_learned").config({}))
    assert get("tp_sp_b128").graph_blocker(get("tp_sp_b128").config({})) is None
    assert get("pp_1f1b_mb8").graph_blocker(get("pp_1f1b_mb8").config({})) is None
    assert "host" in get("nd_mlp").graph_blocker(get("nd_mlp").config({"moe": True}))


GPU_RUN = Path(__file__).parent.parent / "docs/results/h200x2/graph/suite_graph_20"
"""A suite measured on 2 x H200 with --cuda-graph --profile --sweep (docs/results/h200x2.md)."""


def test_a_gpu_run_is_judged_on_the_gpu_clock_and_rerenders(tmp_path):
    from meshscope.suite.rank import comparisons

    doc = json.loads((GPU_RUN / "result.json").read_text())
    timing = doc["timing"]
    [pp] = [c for c in comparisons(SuiteResult.from_json(doc).results, timing) if c["a"] == "pp_mb1"]
    assert pp["timing_source"] == "measured: critical-rank GPU time (CUDA events)"
    assert pp["timing_ratio"] == pytest.approx(timing["pp_mb8"]["gpu"]["median"] / timing["pp_mb1"]["gpu"]["median"])
    by_title = {title: (head, rows) for title, head, rows in tables(SuiteResult.from_json(doc))}
    [(head, rows)] = [v for t, v in by_title.items() if t.startswith("performance")]
    verdicts = {row[0]: row[-1] for row in rows}
    assert verdicts["tp_ar_b32"] == ("PERF_UNSTABLE" if timing["tp_ar_b32"]["gpu"]["unstable"] else "stable")
    [(head, rows)] = [v for t, v in by_title.items() if t.startswith("communication time")]
    assert head[-2:] == ["measured (graph replay)", "error"] and len(rows) == 12
    assert "timing method per configuration" not in by_title  # one method for all
    doc["timing"]["ep_skewed"]["method"] = "eager, not a CUDA graph: test"
    assert "timing method per configuration" in {t for t, _, _ in tables(SuiteResult.from_json(doc))}
    shutil.copytree(GPU_RUN, tmp_path / "run")
    proc = cli_here("report", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "measured (graph replay)" in (tmp_path / "run" / "report.md").read_text()


def test_world_of_rejects_mixed_worlds():
    assert world_of(SuiteOptions(configs=("tp_ar_b32", "pp_mb1"))) == 4
    with pytest.raises(UsageError):
        SuiteOptions(configs=()).validate()
    # every suite entry runs at world 4, so a mixed world needs a synthetic plan: nd_mlp runs at 8
    mixed = [(None, None, experiments.get(n).config({})) for n in ("tp_ar_b32", "nd_mlp")]
    with pytest.raises(UsageError, match=r"different world sizes \[4, 8\]"):
        world_of(SuiteOptions(configs=("tp_ar_b32",)), plan=mixed)
