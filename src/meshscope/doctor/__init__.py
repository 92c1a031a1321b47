"""`meshscope doctor RUN_DIR`: turn flight logs into named root causes.

The chapter's production-diagnosis and common-mistakes tables are the checklist (docs/chapter.md,
"Faults the doctor names"). Every diagnosis names the mesh axis and ranks of the group, the first
divergent entry, and the cause in plain words, so that a hang is placed on its dimension rather than
on a global rank.

Evidence (`evidence`): ``flight/rank<R>.jsonl`` (group creations and every collective, issued and
completed), ``errors/rank<R>.json``, ``spec.json`` (to rebuild the layout) and, if the run got that
far, ``result.json`` (the predicted and captured ledgers of one step). A traced job adds
``groups/rank<R>.jsonl`` (every ``new_group`` call, member or not, and whether it returned) and
``ranks/rank<R>.json`` (how each rank ended, with its error). PyTorch Flight Recorder dumps
(`fr_files`, `fr_records`, `fr_job`, `fr_findings`): a directory or prefix of them alone, or a trace
directory's ``fr/`` beside its flight logs; each finding says which it rests on (``evidence``: flight
log, flight recorder, or both).

Diagnoses:
  group-order     ranks created process groups in different orders                  (`collective`)
  group-members   ranks created a group with different members (or sizes)             (`collective`)
  missing         some ranks never issued collective #k of a group the others wait in (`collective`)
  ddp-unused      a backward in which some ranks issued fewer gradient all-reduces: DDP's unused parameters
  mismatch        ranks issued collective #k of a group with different op, dtype, size or splits
  p2p             a send without its recv, a size mismatch, or both ends sending/receiving first (`p2p`)
  pp-no-grad      a pipeline stage received activations but never sent their gradients back (`p2p`)
  dp-wrong-group  a gradient averaged over ranks that hold different shards          (`prediction`)
  pruned-a2a      fewer all_to_all than predicted because the tokens needed no gradient (`prediction`)

One fault cascades: ranks blocked by it leave their peers waiting in other groups. Findings are
ordered by when their first divergent entry was issued -- a wait for ranks that were blocked in
another call is dated by that call, since it follows from it -- and the earliest is reported as the
likely root cause, the others as what followed from it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path

from ..core.errors import UsageError
from ..capture.flightlog import read
from ..core.mesh import Layout
from ..core.result import RunResult, SuiteResult
from .collective import collectives, group_order
from .evidence import P2P, Finding, load
from .fr_findings import diagnose_job
from .fr_job import FrJob, load_job
from .p2p import p2p, pp_no_grad
from .prediction import dp_wrong_group, pruned_a2a

__all__ = ["Finding", "diagnose", "load", "render"]


def _results(run_dir: Path) -> list[RunResult]:
    """The verified runs in the directory's result.json: one for ``run``, one per configuration for a
    suite; none when the run never got that far."""
    path = run_dir / "result.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    if doc.get("kind") == "trace":  # a traced job has no prediction; its calls are in the flight logs
        return []
    if doc.get("kind") == "suite":
        return list(SuiteResult.from_json(doc).results.values())
    return [RunResult.from_json(d) for d in doc.get("results", [doc])]


def _first_experiment(run_dir: Path):
    """(experiment, config, layout) of a ``run`` directory's first experiment, from spec.json; None
    for a suite or sweep directory (many layouts) or an unreadable spec."""
    try:
        spec = json.loads((run_dir / "spec.json").read_text())
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


def _flight_log_findings(run_dir: Path, ranks) -> tuple[list[Finding], list[dict]]:
    """Findings and rank errors of meshscope's own evidence in a run or trace directory."""
    results = _results(run_dir)
    first = _first_experiment(run_dir)
    layout = first[2] if first else None
    errors = []
    for path in sorted((run_dir / "errors").glob("rank*.json")):
        err = json.loads(path.read_text())
        errors.append({"rank": err["rank"], "error": err["error"]})
    for path in sorted((run_dir / "ranks").glob("rank*.json")):  # a traced job: how each rank ended
        end = json.loads(path.read_text())
        if end.get("status") == "error" and end.get("error"):
            errors.append({"rank": end["rank"], "error": end["error"]})
    findings = group_order(ranks)  # with groups created differently, every later entry is suspect
    if not findings:
        no_grad = pp_no_grad(ranks)
        explained = {tuple(f.group) for f in no_grad}  # its upstream's unanswered recv is the same fault
        findings = (collectives(ranks, _plan(first, results)) + no_grad
                    + [f for f in p2p(ranks, {e["rank"]: e["error"] for e in errors}) if tuple(f.group) not in explained])
    findings += dp_wrong_group(ranks, layout) + [f for r in results for f in pruned_a2a(r)]
    return findings, errors


def _merge(logged: list[Finding], recorded: list[Finding]) -> list[Finding]:
    """Both sources' findings; one that both show (same kind, axis and group) is kept once, as ``both``."""
    seen = {(f.kind, f.axis, tuple(f.group)) for f in recorded}
    shared = {(f.kind, f.axis, tuple(f.group)) for f in logged} & seen
    return ([replace(f, evidence="both") if (f.kind, f.axis, tuple(f.group)) in shared else f for f in logged]
            + [f for f in recorded if (f.kind, f.axis, tuple(f.group)) not in shared])


def _trace_groups(run_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Group name -> (axis, ranks) as a trace's flight logs name its groups (`trace.rank` writes the
    name; meshscope's own runs do not, and give none)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in sorted((run_dir / "flight").glob("rank*.jsonl")):
        for line in read(path):
            if line["kind"] == "group" and "name" in line:
                out.setdefault(line["name"], (line["axis"], tuple(line["ranks"])))
    return out


def _sources(job: FrJob | None, logged: bool) -> dict:
    out: dict = {"flight_log": logged}
    if job is not None:
        out["flight_recorder"] = {"source": job.source, "version": job.version, "backend": job.backend,
                                  "ranks": sorted(job.dumps)}
    return out


def diagnose(run_dir: Path) -> dict:
    """The report of a run directory, a trace directory, or a directory or prefix of Flight Recorder
    dumps: its ranks, the rank errors, and the findings, earliest first (``root_cause`` marks the
    first); ``healthy`` when there is neither an error nor a finding."""
    run_dir = Path(run_dir)
    logged = (run_dir / "flight").is_dir()
    job = load_job(run_dir, _trace_groups(run_dir) if logged else None)
    if not logged and job is None:
        raise UsageError(f"{run_dir} has no flight logs (flight/rank*.jsonl) and no Flight Recorder dumps "
                         f"(files <prefix><rank>, or fr/ in a trace directory)")
    ranks = load(run_dir) if logged else {}
    findings, errors = _flight_log_findings(run_dir, ranks) if logged else ([], [])
    if job is not None:
        findings = _merge(findings, diagnose_job(job))
    findings.sort(key=lambda f: (f.t, f.derived))  # stable: equal keys keep the order they were looked for in
    all_ranks = sorted(set(ranks) | set(job.dumps if job else ()))
    return {"run_dir": str(run_dir), "ranks": all_ranks, "healthy": not findings and not errors,
            "findings": [{k: v for k, v in asdict(f).items() if k != "t"} | {"summary": f.line(), "root_cause": i == 0}
                         for i, f in enumerate(findings)],
            "errors": errors, "last_marks": {r: ranks[r].last_mark for r in sorted(ranks)},
            "sources": _sources(job, logged)}


def render(report: dict) -> list[str]:
    """The text report: the earliest finding marked as the likely root cause, the rest as what followed."""
    lines = [f"rank {e['rank']} failed: {e['error']}" for e in report["errors"]]
    for f in report["findings"]:
        lines.append(("likely root cause: " if f["root_cause"] else "  then: ") + f["summary"])
    if report["healthy"]:
        lines.append(f"no problem found in the {_evidence(report)} of ranks {report['ranks']}")
    elif line := progress(report):  # where each rank last reported progress: the only trace of a hang in timing
        lines.append(line)
    return lines


def progress(report: dict) -> str | None:
    """'last progress: rank R 'mark'; ...' from the report's last marks, None if no rank left one."""
    marks = "; ".join(f"rank {r} {m!r}" for r, m in report.get("last_marks", {}).items() if m)
    return f"last progress: {marks}" if marks else None


def _evidence(report: dict) -> str:
    """What a report was drawn from, in words: 'flight logs', 'Flight Recorder dumps' or both."""
    sources = report.get("sources", {"flight_log": True})
    names = (["flight logs"] if sources.get("flight_log") else []) + \
        (["Flight Recorder dumps"] if "flight_recorder" in sources else [])
    return " and ".join(names)
