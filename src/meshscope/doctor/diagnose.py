"""The doctor's orchestration: every source of a directory read once, every rule run, the findings
ordered with the likely root cause first (`ends.order`)."""


from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from ..capture.flightlog import read_flight
from ..core.errors import UsageError
from ..core.events import P2P
from ..core.findings import Diagnosis, Finding, RankError
from ..core.mesh import Layout
from ..core.result import RunResult, SuiteResult
from ..core.rundir import RunDir
from ..core.time_result import TimeSection
from .collective import collectives, group_order
from .ends import blocked, ends, order, script_errors
from .evidence import load
from .fr_findings import diagnose_job
from .fr_job import FrJob, load_job
from .p2p import p2p, pp_no_grad
from .prediction import dp_wrong_group, pruned_a2a
from .stragglers import finding as straggler
from .stragglers import time_of


def _results(run_dir: RunDir) -> list[RunResult]:
    """The verified runs in the directory's result.json: one for ``run``, one per configuration for a
    suite; none when the run never got that far."""
    doc = run_dir.read_result()
    if doc is None:
        return []
    if doc.get("kind") == "trace":  # a traced job has no prediction; its calls are in the flight logs
        return []
    if doc.get("kind") == "suite":
        return list(SuiteResult.from_json(doc).results.values())
    return [RunResult.from_json(d) for d in doc.get("results", [doc])]


def _first_experiment(run_dir: RunDir):
    """(experiment, config, layout) of a ``run`` directory's first experiment, from spec.json; None
    for a suite or sweep directory (many layouts) or an unreadable spec."""
    try:
        spec = run_dir.read_spec() or {}
        item = spec["experiments"][0]
        from .. import experiments  # imports torch: not for a trace directory, which has no experiment

        exp = experiments.get(item["name"])
        cfg = exp.config(item.get("overrides", {}))
    except (OSError, KeyError, IndexError, ValueError):
        return None
    layout = Layout.from_json(item["layout"]) if "layout" in item else cfg.layout
    return exp, cfg, layout


def _plan(first, results: list[RunResult]) -> dict | None:
    """Predicted collective ops of one step, per group and rank (P2P excluded): the result's own
    prediction when the run got that far, else the experiment's."""
    if first is None:
        return None
    exp, cfg, _ = first
    predicted = results[0].predicted if results else exp.predict(cfg)
    out: dict = defaultdict(lambda: defaultdict(list))
    for e in sorted(predicted, key=lambda e: (e.rank, e.axis, e.group, e.seq)):
        if e.op not in P2P:
            out[(e.axis, e.group)][e.rank].append(e.op)
    return out


def _flight_log_findings(run_dir: RunDir, ranks) -> tuple[list[Finding], list[RankError], list[int]]:
    """Findings, rank errors and blocked ranks of meshscope's own evidence in a run or trace directory."""
    results = _results(run_dir)
    first = _first_experiment(run_dir)
    layout = first[2] if first else None
    errors = [RankError(err["rank"], err["error"]) for err in map(_json, run_dir.files("errors"))]
    ended = ends(run_dir)  # a traced job: how each rank ended
    errors += [RankError(e.rank, e.error, e.status) for e in ended if not e.ended]
    findings = group_order(ranks)  # with groups created differently, every later entry is suspect
    if not findings:
        no_grad = pp_no_grad(ranks)
        explained = {tuple(f.group) for f in no_grad}  # its upstream's unanswered recv is the same fault
        findings = (collectives(ranks, _plan(first, results)) + no_grad
                    + [f for f in p2p(ranks, {e.rank: e.error for e in errors}) if tuple(f.group) not in explained])
    findings += dp_wrong_group(ranks, layout) + [f for r in results for f in pruned_a2a(r)]
    return findings + script_errors(ended, run_dir), errors, blocked(ended, ranks)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _merge(logged: list[Finding], recorded: list[Finding]) -> list[Finding]:
    """Both sources' findings; one that both show (same kind, axis and group) is kept once, as ``both``."""
    seen = {(f.kind, f.axis, tuple(f.group)) for f in recorded}
    shared = {(f.kind, f.axis, tuple(f.group)) for f in logged} & seen
    return ([replace(f, evidence="both") if (f.kind, f.axis, tuple(f.group)) in shared else f for f in logged]
            + [f for f in recorded if (f.kind, f.axis, tuple(f.group)) not in shared])


def _trace_groups(run_dir: RunDir) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Group name -> (axis, ranks) as a trace's flight logs name its groups (`trace.rank` writes the
    name; meshscope's own runs do not, and give none)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for rank in run_dir.ranks_with("flight"):
        for line in read_flight(run_dir.flight(rank), rank).groups:
            if "name" in line:
                out.setdefault(line["name"], (line["axis"], tuple(line["ranks"])))
    return out


def _sources(job: FrJob | None, logged: bool) -> dict:
    out: dict = {"flight_log": logged}
    if job is not None:
        out["flight_recorder"] = {"source": job.source, "version": job.version, "backend": job.backend,
                                  "ranks": sorted(job.dumps)}
    return out


def diagnose(run_dir: Path | RunDir, time: TimeSection | None = None) -> Diagnosis:
    """The diagnosis of a run directory, a trace directory, or a directory or prefix of Flight Recorder
    dumps: its ranks, the rank errors, and the findings, the likely root cause first (`ends.order`);
    ``healthy`` when there is neither an error nor a finding. `time`: the trace's own time section, where
    the caller assembled it already (else it is analysed here from the flight logs)."""
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    logged = bool(run_dir.ranks_with("flight"))
    job = load_job(run_dir.path, _trace_groups(run_dir) if logged else None)
    if not logged and job is None:
        raise UsageError(f"{run_dir} has no flight logs (flight/rank*.jsonl) and no Flight Recorder dumps "
                         f"(files <prefix><rank>, or fr/ in a trace directory)")
    ranks = load(run_dir) if logged else {}
    findings, errors, stuck = _flight_log_findings(run_dir, ranks) if logged else ([], [], [])
    if job is not None:
        findings = _merge(findings, diagnose_job(job))
    if time is None and logged:
        time = time_of(run_dir, ranks, ends(run_dir))
    performance = [straggler(s, time.step_ms) for s in time.stragglers] if time is not None else []
    return Diagnosis(str(run_dir), sorted(set(ranks) | set(job.dumps if job else ())), order(findings, stuck), errors,
                     {r: ranks[r].last_mark for r in sorted(ranks)}, _sources(job, logged), performance=performance,
                     time_note=time.note if time is not None and not time.analysed else "")


def render(report: Diagnosis) -> list[str]:
    """The text report: the earliest finding marked as the likely root cause, the rest as what followed."""
    if report.failure is not None:
        return [report.failure]
    lines = [e.line() for e in report.errors]
    for i, f in enumerate(report.findings):
        lines.append(("likely root cause: " if i == 0 else "  then: ") + f.line())
    if report.healthy:
        lines.append(f"no problem found in the {_evidence(report)} of ranks {report.ranks}")
    elif line := progress(report):  # where each rank last reported progress: the only trace of a hang in timing
        lines.append(line)
    lines += [f"performance: {f.line()}" for f in report.performance]
    if report.time_note:
        lines.append(f"time not analysed: {report.time_note}")
    return lines


def progress(report: Diagnosis) -> str | None:
    """'last progress: rank R 'mark'; ...' from the report's last marks, None if no rank left one."""
    marks = "; ".join(f"rank {r} {m!r}" for r, m in report.last_marks.items() if m)
    return f"last progress: {marks}" if marks else None


def _evidence(report: Diagnosis) -> str:
    """What a report was drawn from, in words: 'flight logs', 'Flight Recorder dumps' or both."""
    sources = report.sources or {"flight_log": True}
    names = (["flight logs"] if sources.get("flight_log") else []) + \
        (["Flight Recorder dumps"] if "flight_recorder" in sources else [])
    return " and ".join(names)
