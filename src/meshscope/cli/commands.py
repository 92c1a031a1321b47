"""The bodies of the ``meshscope`` subcommands (the parser is in `cli`).

Each command validates everything before it writes anything; bad input raises `UsageError`, which
`cli.main` prints as one line with exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ..core.errors import UsageError
from ..core.faults import RUN_LEVEL
from ..core.mesh import Layout
from ..core.overrides import overrides_of
from ..core.result import RunResult, SuiteResult
from ..core.rundir import RunDir, check_timeout


def cmd_layout(args) -> int:
    layout = Layout(args.world, tp=args.tp, cp=args.cp, ep=args.ep, etp=args.etp, pp=args.pp, order=args.order)
    if args.json:
        print(json.dumps(layout.to_json()))
        return 0
    from ..report.terminal import print_layout

    print_layout(layout)
    return 0


def cmd_list(args) -> int:
    from .. import experiments  # imports torch: only the commands that name an experiment pay for it

    for name in experiments.names():
        print(f"{name:16s} {experiments.get(name).description}")
    return 0


def cmd_predict(args) -> int:
    from .. import experiments

    exp = experiments.get(args.experiment)
    cfg = exp.config(overrides_of(args))
    events = exp.predict(cfg)
    from ..core.events import counts

    world = cfg.layout.world
    doc = {"experiment": exp.name, "config": _asdict(cfg),
           "per_rank": [{"rank": r, "counts": counts(e for e in events if e.rank == r),
                         "events": [e.to_json() for e in events if e.rank == r]} for r in range(world)]}
    if args.json:
        print(json.dumps(doc))
        return 0
    from ..report.terminal import print_prediction

    print_prediction(exp, cfg, events)
    return 0


def _inject(exp, kind: str | None, overrides: dict) -> str | None:
    """Validate --inject; fold an experiment-level fault into the overrides; return a run-level one."""
    if kind is None:
        return None
    valid = [*RUN_LEVEL, *exp.faults]
    if kind not in valid:
        raise UsageError(f"--inject {kind!r} is not available for {exp.name}; valid: {', '.join(valid)}")
    if kind in RUN_LEVEL:
        return kind
    overrides.update(exp.faults[kind])
    return None


def cmd_run(args) -> int:
    from .. import experiments

    exp = experiments.get(args.experiment)
    overrides = overrides_of(args)
    run_level = _inject(exp, args.inject, overrides)
    cfg = exp.config(overrides)
    layout = cfg.layout
    check_timeout(args.timeout)
    if args.profile < 0:
        raise UsageError(f"--profile {args.profile} must be a number of steps >= 1")
    spec = {"backend": args.backend, "timeout": args.timeout, "inject": run_level, "profile": args.profile,
            "experiments": [{"name": exp.name, "overrides": overrides, "layout": layout.brief()}]}
    from ..run.launch import in_torchrun

    if in_torchrun():
        return _run_as_rank(args, spec)
    _check_backend(args.backend, layout.world)
    run_dir = args.out or Path("runs") / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    doc = launch_spec(run_dir, spec, layout.world, args.timeout)
    result = RunResult.from_json(doc) if doc is not None else None
    if result is not None:
        _write_figures(result, run_dir)
    report = _auto_doctor(run_dir) if result is None or not result.passed else None
    if args.json:  # one document, on failure too, with the doctor's findings when the run failed
        out = doc if doc is not None else {"experiment": exp.name, "passed": False, "error": first_failure_line(run_dir),
                                           "run_dir": str(run_dir)}
        print(json.dumps(out | ({"doctor": report} if report is not None else {})))
    elif result is not None:
        from ..report.terminal import print_result

        print_result(result, run_dir)
    return 0 if result is not None and result.passed else 1


def launch_spec(run_dir: Path, spec: dict, world: int, timeout: float) -> dict | None:
    """Write the spec, launch the ranks, return rank 0's result (None after printing why it failed)."""
    from ..run.launch import launch

    RunDir(run_dir).start(spec)
    outcome = launch(run_dir, world, timeout, on_progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    if outcome.returncode != 0 or not (run_dir / "result.json").exists():
        (run_dir / "failure.txt").write_text(outcome.error or "no result written")
        print(f"meshscope: run failed: {outcome.error or 'no result written'} (logs: {run_dir})", file=sys.stderr)
        return None
    return json.loads((run_dir / "result.json").read_text())


def first_failure_line(run_dir: Path) -> str:
    path = run_dir / "failure.txt"
    return path.read_text() if path.exists() else "no result written"


def _auto_doctor(run_dir: Path) -> dict | None:
    """After a failed run, say what the flight logs show (stderr, so --json stays one document) and
    return the doctor's document (None when it could not diagnose) for the --json output."""
    from ..doctor import diagnose, progress

    try:
        report = diagnose(run_dir)
    except Exception as exc:  # noqa: BLE001 - the run already failed; the diagnosis is a bonus
        print(f"meshscope doctor: could not diagnose {run_dir}: {type(exc).__name__}: {exc}".splitlines()[0],
              file=sys.stderr)
        return None
    for f in report.findings:
        print(f"meshscope doctor: {f.line()}", file=sys.stderr)
    if not report.findings and (line := progress(report)):  # nothing pending: where each rank last was
        print(f"meshscope doctor: no collective left pending; {line}", file=sys.stderr)
    return report.to_json()


def _failed_launch(args, what: str, run_dir: Path, report: dict | None = None) -> int:
    """A launch that left no result: with --json stdout still carries one document saying so."""
    if args.json:
        print(json.dumps({"kind": what, "passed": False, "error": first_failure_line(run_dir), "run_dir": str(run_dir)}
                         | ({"doctor": report} if report is not None else {})))
    return 1


def cmd_suite(args) -> int:
    from ..suite.plan import SUITE, SuiteOptions, world_of

    if args.list:
        for e in SUITE:
            print(f"{e.label:24s} {e.experiment} {json.dumps(e.overrides) if e.overrides else ''}")
        return 0
    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip()) if args.configs else None
    options = SuiteOptions(**({"configs": configs} if configs is not None else {}), rounds=args.rounds,
                           iters=args.iters, warmup=args.warmup, steps_per_sample=args.steps_per_sample,
                           cv_threshold=args.cv_threshold, profile=args.profile, profile_steps=args.profile_steps,
                           world=args.world, sweep=args.sweep, cuda_graph=args.cuda_graph)
    world = world_of(options)  # validates everything before anything is written
    check_timeout(args.timeout)
    _check_backend(args.backend, world)
    _check_cuda_graph(args.cuda_graph, args.backend)
    if args.profile and args.backend != "nccl":
        print("meshscope: note: --profile on gloo records CPU traces only; NCCL kernel counts need --backend nccl",
              file=sys.stderr)
    run_dir = args.out or Path("runs") / f"suite-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    spec = {"kind": "suite", "backend": args.backend, "timeout": args.timeout,
            "suite": {**options.__dict__, "configs": list(options.configs)}}
    doc = launch_spec(run_dir, spec, world, args.timeout)
    if doc is None:
        return _failed_launch(args, "suite", run_dir, _auto_doctor(run_dir))
    from ..report.suite import print_terminal, write_all

    suite = SuiteResult.from_json(doc)
    write_all(suite, run_dir)
    if args.json:
        print(json.dumps(doc))
    else:
        print_terminal(suite)
        print(f"run directory: {run_dir} (report.md, figures/, records/, result.json)")
    return 0 if suite.passed else 1


def cmd_report(args) -> int:
    if RunDir(args.run_dir).kind() == "trace":  # before the suite's imports, which import torch (1.4 s)
        from .trace_command import report_trace

        return report_trace(args.run_dir)
    from ..report.suite import print_terminal, write_all
    from ..suite.verdicts import summary

    path = args.run_dir / "result.json"
    if not path.is_file():
        raise UsageError(f"{path} does not exist; give the directory of a finished meshscope run")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    expected = ("results", "timing", "environment") if doc.get("kind") == "suite" else ("experiment", "passed", "checks")
    missing = [k for k in expected if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise UsageError(f"{path} is not a meshscope result (no {missing[0]!r})")
    if doc.get("kind") != "suite":
        from ..report.terminal import print_result

        result = RunResult.from_json(doc)
        _write_figures(result, args.run_dir)
        print_result(result, args.run_dir)
        return 0 if result.passed else 1
    suite = SuiteResult.from_json(doc)
    suite.summary = summary(suite)  # derived: recomputed so that the re-render matches the tables
    write_all(suite, args.run_dir)
    print_terminal(suite)
    return 0 if suite.passed else 1


def cmd_doctor(args) -> int:
    from ..doctor import diagnose

    if not args.run_dir.is_dir() and not args.run_dir.parent.is_dir():
        raise UsageError(f"{args.run_dir} does not exist (a run or trace directory, or a directory or prefix "
                         f"of Flight Recorder dumps)")
    report = diagnose(args.run_dir)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        from ..doctor import render

        print("\n".join(render(report)))
    return 0 if report.healthy else 1


def _run_as_rank(args, spec) -> int:
    """Inside a user's torchrun job: this process is one rank; rank 0 prints the result."""
    from ..run.worker import execute
    from .worker import program_of

    run_dir = args.out or Path("runs") / f"{args.experiment}-{os.environ.get('TORCHELASTIC_RUN_ID', 'torchrun')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    code = execute(run_dir, spec, program_of(spec))
    if code != 0 or os.environ.get("RANK", "0") != "0":
        return code
    doc = json.loads((run_dir / "result.json").read_text())
    result = RunResult.from_json(doc)
    _write_figures(result, run_dir)
    if args.json:
        print(json.dumps(doc))
    else:
        from ..report.terminal import print_result

        print_result(result, run_dir)
    return 0 if result.passed else 1


def _write_figures(result: RunResult, run_dir: Path) -> None:
    """A run's files derived from its result.json (the PP timeline under figures/), drawn here once
    rather than by the ranks, so that `meshscope report` redraws them the same way."""
    from ..report.timelines import write_run

    write_run(result, run_dir)


def _check_backend(backend: str, world: int) -> None:
    if backend == "nccl":
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < world:
            raise UsageError(f"--backend nccl needs {world} GPUs (one per rank); this machine has {n}")


def _asdict(cfg) -> dict:
    from dataclasses import asdict

    return asdict(cfg)


def _check_cuda_graph(on: bool, backend: str) -> None:
    if on and backend != "nccl":
        raise UsageError(f"--cuda-graph replays CUDA graphs and needs --backend nccl, not {backend}")


def cmd_sweep(args) -> int:
    from ..timing.sweep import SweepConfig, parse_sizes, render

    given = {"ops": tuple(args.ops.split(",")) if args.ops else None,
             "sizes": parse_sizes(args.sizes) if args.sizes else None}
    cfg = SweepConfig(world=args.world, tp=args.tp, cp=args.cp, pp=args.pp, ep=args.ep, etp=args.etp, axis=args.axis,
                      iters=args.iters, warmup=args.warmup, back_to_back=args.back_to_back, cuda_graph=args.cuda_graph,
                      **{k: v for k, v in given.items() if v is not None})
    cfg.validate()
    check_timeout(args.timeout)
    _check_cuda_graph(args.cuda_graph, args.backend)
    from ..run.launch import in_torchrun

    if in_torchrun():  # every rank would launch a world of its own
        raise UsageError("meshscope sweep launches its own ranks; run it directly, not under torchrun")
    _check_backend(args.backend, cfg.world)
    run_dir = args.out or Path("runs") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    spec = {"kind": "sweep", "backend": args.backend, "timeout": args.timeout, "sweep": cfg.to_json()}
    doc = launch_spec(run_dir, spec, cfg.world, args.timeout)
    if doc is None:
        return _failed_launch(args, "sweep", run_dir)
    (run_dir / "sweep.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc) if args.json else render(doc))
    return 0


def cmd_place(args) -> int:
    from .place_command import cmd_place as run

    return run(args)


def cmd_trace(args) -> int:
    from .trace_command import cmd_trace as run

    return run(args)


def cmd_diff(args) -> int:
    from .trace_command import cmd_diff as run

    return run(args)


def cmd_budget(args) -> int:
    from .budget_command import cmd_budget as run

    return run(args)


def cmd_check(args) -> int:
    from .budget_command import cmd_check as run

    return run(args)


def cmd_forecast(args) -> int:
    from .forecast_command import cmd_forecast as run

    return run(args)


COMMANDS = {"layout": cmd_layout, "list": cmd_list, "predict": cmd_predict, "run": cmd_run, "suite": cmd_suite,
            "report": cmd_report, "doctor": cmd_doctor, "sweep": cmd_sweep, "place": cmd_place, "trace": cmd_trace,
            "diff": cmd_diff,
            "budget": cmd_budget, "check": cmd_check, "forecast": cmd_forecast}
