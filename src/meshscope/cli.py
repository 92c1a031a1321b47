"""The ``meshscope`` command line.

Stable interface (design brief): with ``--json`` stdout carries exactly one JSON document; progress,
logs and worker output go to stderr. Bad input is one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import experiments, rundir
from .errors import UsageError
from .faults import KINDS, RUN_LEVEL
from .mesh import DEFAULT_ORDER, Layout
from .overrides import CLI_DESTS, OVERRIDES, SWITCHES
from .model_spec import ModelSpec, parse_stage_layers
from .place import INTER_DEFAULT, INTRA_DEFAULT



class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as every other bad input
        raise UsageError(message)


def _add_overrides(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overrides (where they apply to the experiment)")
    for flag, (dest, typ, help_) in OVERRIDES.items():
        g.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    for flag, (dest, help_) in SWITCHES.items():
        g.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_)


def _overrides(args) -> dict:
    return {d: getattr(args, d) for d in CLI_DESTS if getattr(args, d, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="meshscope", description="Predict, run, verify and explain the communication of N-D parallel training.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    lay = sub.add_parser("layout", help="rank coordinates and process groups of a layout")
    lay.add_argument("--world", type=int, required=True)
    for axis in ("tp", "cp", "pp", "ep", "etp"):
        lay.add_argument(f"--{axis}", type=int, default=1)
    lay.add_argument("--order", default=DEFAULT_ORDER, help="axis order, leftmost fastest (default %(default)s)")
    lay.add_argument("--json", action="store_true")

    pred = sub.add_parser("predict", help="the collectives every rank must issue per step")
    pred.add_argument("experiment")
    _add_overrides(pred)
    pred.add_argument("--json", action="store_true")

    run = sub.add_parser("run", help="run an experiment on torch.distributed, capture and verify it")
    run.add_argument("experiment")
    _add_overrides(run)
    run.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may take (default %(default)s)")
    run.add_argument("--out", type=Path, default=None, help="run directory (default runs/<experiment>-<time>)")
    run.add_argument("--profile", type=int, nargs="?", const=5, default=0, metavar="STEPS",
                     help="after verifying, profile STEPS training steps (default 5): NCCL kernel counts vs prediction")
    run.add_argument("--inject", default=None, metavar="KIND",
                     help="plant a fault on purpose: " + ", ".join(KINDS))
    run.add_argument("--json", action="store_true")

    suite = sub.add_parser("suite", help="every seed configuration in one launch: verified, timed, compared")
    suite.add_argument("--configs", default=None, help="comma-separated subset (default: all; see `meshscope suite --list`)")
    suite.add_argument("--list", action="store_true", help="list the suite's configurations and exit")
    suite.add_argument("--rounds", type=int, default=2, help="timing rounds, order reversed every other round (default %(default)s)")
    suite.add_argument("--iters", type=int, default=20, help="timed steps per config and round (default %(default)s)")
    suite.add_argument("--warmup", type=int, default=3, help="untimed steps before each timed series (default %(default)s)")
    suite.add_argument("--steps-per-sample", type=int, default=1,
                       help="back-to-back steps per timed sample; 1 = per-step timing (default %(default)s)")
    suite.add_argument("--cv-threshold", type=float, default=0.05, help="PERF_UNSTABLE above this CV (default %(default)s)")
    suite.add_argument("--profile", action="store_true", help="torch.profiler trace per rank and config (NCCL kernel counts)")
    suite.add_argument("--profile-steps", type=int, default=5, help="steps per profiled trace (default %(default)s)")
    suite.add_argument("--world", type=int, default=None, help="run every config on this many ranks (default: its own, 4)")
    suite.add_argument("--sweep", default=None, metavar="SWEEP_JSON",
                       help="a saved `meshscope sweep` result: predicted vs measured communication time (with --profile)")
    suite.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    suite.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may take (default %(default)s)")
    suite.add_argument("--out", type=Path, default=None, help="run directory (default runs/suite-<time>)")
    suite.add_argument("--json", action="store_true")

    rep = sub.add_parser("report", help="re-render a suite run directory's tables, report.md and figures")
    rep.add_argument("run_dir", type=Path)

    doc = sub.add_parser("doctor", help="diagnose a run directory's flight logs")
    doc.add_argument("run_dir", type=Path)
    doc.add_argument("--json", action="store_true")

    sub.add_parser("list", help="the named experiments")

    sw = sub.add_parser("sweep", help="collective time and bus bandwidth over message sizes; alpha-beta fit")
    sw.add_argument("--world", type=int, default=2)
    for axis in ("tp", "cp", "pp", "ep", "etp"):
        sw.add_argument(f"--{axis}", type=int, default=1)
    sw.add_argument("--axis", default="world", help="group to sweep on: world or a mesh group name (default world)")
    sw.add_argument("--ops", default=None, help="comma list (default all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv)")
    sw.add_argument("--sizes", default=None, help="comma list of bytes, e.g. 1K,64K,1M (default 1K..64M doubling)")
    sw.add_argument("--iters", type=int, default=20, help="timed iterations per size (default %(default)s)")
    sw.add_argument("--warmup", type=int, default=5, help="discarded iterations per size (default %(default)s)")
    sw.add_argument("--back-to-back", type=int, default=1,
                    help="collectives per timed sample, time / count, as nccl-tests' loop (default %(default)s)")
    sw.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    sw.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may take (default %(default)s)")
    sw.add_argument("--out", type=Path, default=None, help="run directory, gets sweep.json (default runs/sweep-<time>)")
    sw.add_argument("--json", action="store_true")

    pl = sub.add_parser("place", help="rank the placements of the axes on nodes by predicted communication time")
    pl.add_argument("--world", type=int, required=True)
    pl.add_argument("--gpus-per-node", type=int, default=8, help="NVLink domain size (default %(default)s)")
    for axis in ("tp", "cp", "pp", "ep", "etp"):
        pl.add_argument(f"--{axis}", type=int, default=1)
    spec = ModelSpec()
    for flag, dest in (("--layers", "layers"), ("--hidden", "hidden"), ("--ffn", "ffn"), ("--seq", "seq_len"),
                       ("--micro-batch", "micro_batch"), ("--heads", "heads"), ("--experts", "experts"),
                       ("--topk", "topk"), ("--microbatches", "microbatches")):
        pl.add_argument(flag, dest=dest, type=int, default=getattr(spec, dest), help="(default %(default)s)")
    pl.add_argument("--dtype", default=spec.dtype, help="activation/gradient dtype (default %(default)s)")
    pl.add_argument("--sp", dest="sequence_parallel", action="store_true", help="sequence parallel TP (AG + RS)")
    pl.add_argument("--stage-layers", default="",
                    help="layers of each pipeline stage, e.g. 6,2 (default: an even split)")
    pl.add_argument("--layer-ms", type=float, default=0.0,
                    help="compute ms of one layer forward+backward per microbatch (default 0: communication only)")
    pl.add_argument("--intra-latency", type=float, default=INTRA_DEFAULT.latency_s * 1e6, help="us per call (default %(default)s)")
    pl.add_argument("--intra-bw", type=float, default=INTRA_DEFAULT.bandwidth / 1e9, help="GB/s bus bandwidth (default %(default)s)")
    pl.add_argument("--inter-latency", type=float, default=INTER_DEFAULT.latency_s * 1e6, help="us per call (default %(default)s)")
    pl.add_argument("--inter-bw", type=float, default=INTER_DEFAULT.bandwidth / 1e9, help="GB/s per GPU (default %(default)s)")
    pl.add_argument("--sweep", type=Path, default=None, help="take the intra-node link from a `meshscope sweep` sweep.json")
    pl.add_argument("--limit", type=int, default=20, help="placements shown in the text output (default %(default)s)")
    pl.add_argument("--plot", type=Path, default=None, help="write a PNG of the ranking here")
    pl.add_argument("--json", action="store_true")
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"meshscope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("meshscope: interrupted", file=sys.stderr)
        return 130


# -- commands ------------------------------------------------------------------------------------
def cmd_layout(args) -> int:
    layout = Layout(args.world, tp=args.tp, cp=args.cp, ep=args.ep, etp=args.etp, pp=args.pp, order=args.order)
    if args.json:
        print(json.dumps(layout.to_json()))
        return 0
    from .report import print_layout

    print_layout(layout)
    return 0


def cmd_list(args) -> int:
    for name in experiments.names():
        print(f"{name:16s} {experiments.get(name).description}")
    return 0


def cmd_predict(args) -> int:
    exp = experiments.get(args.experiment)
    cfg = exp.config(_overrides(args))
    events = exp.predict(cfg)
    from .events import counts

    world = exp.layout(cfg).world
    doc = {"experiment": exp.name, "config": _asdict(cfg),
           "per_rank": [{"rank": r, "counts": counts(e for e in events if e.rank == r),
                         "events": [e.to_json() for e in events if e.rank == r]} for r in range(world)]}
    if args.json:
        print(json.dumps(doc))
        return 0
    from .report import print_prediction

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
    exp = experiments.get(args.experiment)
    overrides = _overrides(args)
    run_level = _inject(exp, args.inject, overrides)
    cfg = exp.config(overrides)
    layout = exp.layout(cfg)
    rundir.check_timeout(args.timeout)
    if args.profile < 0:
        raise UsageError(f"--profile {args.profile} must be a number of steps >= 1")
    spec = {"backend": args.backend, "timeout": args.timeout, "inject": run_level, "profile": args.profile,
            "experiments": [{"name": exp.name, "overrides": overrides}]}
    from .launch import in_torchrun

    if in_torchrun():
        return _run_as_rank(args, spec)
    _check_backend(args.backend, layout.world)
    run_dir = args.out or Path("runs") / f"{exp.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    result = launch_spec(run_dir, spec, layout.world, args.timeout)
    if result is None or not result["passed"]:
        _auto_doctor(run_dir)
    if result is None:
        if args.json:  # stdout still carries one document
            print(json.dumps({"experiment": exp.name, "passed": False, "error": first_failure_line(run_dir),
                              "run_dir": str(run_dir)}))
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        from .report import print_result

        print_result(result, run_dir)
    return 0 if result["passed"] else 1


def launch_spec(run_dir: Path, spec: dict, world: int, timeout: float) -> dict | None:
    """Write the spec, launch the ranks, return rank 0's result (None after printing why it failed)."""
    from .launch import launch

    rundir.start(run_dir, spec)
    outcome = launch(run_dir, world, timeout, on_progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    if outcome.returncode != 0 or not (run_dir / "result.json").exists():
        (run_dir / "failure.txt").write_text(outcome.error or "no result written")
        print(f"meshscope: run failed: {outcome.error or 'no result written'} (logs: {run_dir})", file=sys.stderr)
        return None
    return json.loads((run_dir / "result.json").read_text())


def first_failure_line(run_dir: Path) -> str:
    path = run_dir / "failure.txt"
    return path.read_text() if path.exists() else "no result written"


def _auto_doctor(run_dir: Path) -> None:
    """After a failed run, say what the flight logs show (stderr, so --json stays one document)."""
    from .doctor import diagnose

    try:
        report = diagnose(run_dir)
    except Exception as exc:  # noqa: BLE001 - the run already failed; the diagnosis is a bonus
        print(f"meshscope doctor: could not diagnose {run_dir}: {type(exc).__name__}: {exc}".splitlines()[0],
              file=sys.stderr)
        return
    for f in report["findings"]:
        print(f"meshscope doctor: {f['summary']}", file=sys.stderr)


def cmd_suite(args) -> int:
    from .suite import SUITE, SuiteOptions, world_of

    if args.list:
        for e in SUITE:
            print(f"{e.label:24s} {e.experiment} {json.dumps(e.overrides) if e.overrides else ''}")
        return 0
    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip()) if args.configs else None
    options = SuiteOptions(**({"configs": configs} if configs is not None else {}), rounds=args.rounds,
                           iters=args.iters, warmup=args.warmup, steps_per_sample=args.steps_per_sample,
                           cv_threshold=args.cv_threshold, profile=args.profile, profile_steps=args.profile_steps,
                           world=args.world, sweep=args.sweep)
    world = world_of(options)  # validates everything before anything is written
    rundir.check_timeout(args.timeout)
    _check_backend(args.backend, world)
    if args.profile and args.backend != "nccl":
        print("meshscope: note: --profile on gloo records CPU traces only; NCCL kernel counts need --backend nccl",
              file=sys.stderr)
    run_dir = args.out or Path("runs") / f"suite-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    spec = {"kind": "suite", "backend": args.backend, "timeout": args.timeout,
            "suite": {**options.__dict__, "configs": list(options.configs)}}
    doc = launch_spec(run_dir, spec, world, args.timeout)
    if doc is None:
        _auto_doctor(run_dir)
        return 1
    from .suite_report import print_terminal, write_all

    write_all(doc, run_dir)
    if args.json:
        print(json.dumps(doc))
    else:
        print_terminal(doc)
        print(f"run directory: {run_dir} (report.md, figures/, records/, result.json)")
    return 0 if doc["summary"]["passed"] else 1


def cmd_report(args) -> int:
    from .suite_report import print_terminal, summary, write_all

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
        from .report import print_result

        print_result(doc, args.run_dir)
        return 0 if doc["passed"] else 1
    doc["summary"] = summary(doc)  # derived: recomputed so that the re-render matches the tables
    write_all(doc, args.run_dir)
    print_terminal(doc)
    return 0 if doc["summary"]["passed"] else 1


def cmd_doctor(args) -> int:
    from .doctor import diagnose

    if not args.run_dir.is_dir():
        what = "is not a directory" if args.run_dir.exists() else "does not exist"
        raise UsageError(f"run directory {args.run_dir} {what}")
    report = diagnose(args.run_dir)
    if args.json:
        print(json.dumps(report))
    else:
        from .doctor import render

        print("\n".join(render(report)))
    return 0 if report["healthy"] else 1


def _run_as_rank(args, spec) -> int:
    """Inside a user's torchrun job: this process is one rank; rank 0 prints the result."""
    from .worker import execute

    run_dir = args.out or Path("runs") / f"{args.experiment}-{os.environ.get('TORCHELASTIC_RUN_ID', 'torchrun')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    code = execute(run_dir, spec)
    if code != 0 or os.environ.get("RANK", "0") != "0":
        return code
    result = json.loads((run_dir / "result.json").read_text())
    if args.json:
        print(json.dumps(result))
    else:
        from .report import print_result

        print_result(result, run_dir)
    return 0 if result["passed"] else 1


def _check_backend(backend: str, world: int) -> None:
    if backend == "nccl":
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < world:
            raise UsageError(f"--backend nccl needs {world} GPUs (one per rank); this machine has {n}")


def _asdict(cfg) -> dict:
    from dataclasses import asdict

    return asdict(cfg)


def cmd_sweep(args) -> int:
    from .sweep import SweepConfig, parse_sizes, render

    given = {"ops": tuple(args.ops.split(",")) if args.ops else None,
             "sizes": parse_sizes(args.sizes) if args.sizes else None}
    cfg = SweepConfig(world=args.world, tp=args.tp, cp=args.cp, pp=args.pp, ep=args.ep, etp=args.etp, axis=args.axis,
                      iters=args.iters, warmup=args.warmup, back_to_back=args.back_to_back, **{k: v for k, v in given.items() if v is not None})
    cfg.validate()
    rundir.check_timeout(args.timeout)
    from .launch import in_torchrun

    if in_torchrun():  # every rank would launch a world of its own
        raise UsageError("meshscope sweep launches its own ranks; run it directly, not under torchrun")
    _check_backend(args.backend, cfg.world)
    run_dir = args.out or Path("runs") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    spec = {"kind": "sweep", "backend": args.backend, "timeout": args.timeout, "sweep": cfg.to_json()}
    doc = launch_spec(run_dir, spec, cfg.world, args.timeout)
    if doc is None:
        return 1
    (run_dir / "sweep.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc) if args.json else render(doc))
    return 0


def cmd_place(args) -> int:
    from .place import LinkClass, link_from_sweep, rank_placements
    from .place_report import plot, render, to_json

    spec = ModelSpec(**{k: getattr(args, k) for k in ("layers", "hidden", "ffn", "seq_len", "micro_batch", "heads",
                                                       "experts", "topk", "microbatches", "dtype", "sequence_parallel")},
                     stage_layers=parse_stage_layers(args.stage_layers))
    intra = (link_from_sweep(args.sweep) if args.sweep else
             LinkClass("intra-node", args.intra_latency * 1e-6, args.intra_bw * 1e9, "flags"))
    inter = LinkClass("inter-node", args.inter_latency * 1e-6, args.inter_bw * 1e9, "flags")
    if intra.bandwidth < inter.bandwidth:
        print(f"meshscope: note: intra-node link {intra.bandwidth / 1e9:.3g} GB/s ({intra.source}) is slower than "
              f"inter-node {inter.bandwidth / 1e9:.3g} GB/s; a CPU/gloo sweep does not describe NVLink", file=sys.stderr)
    sizes = {a: getattr(args, a) for a in ("tp", "cp", "pp", "ep", "etp")}
    ranking = rank_placements(args.world, args.gpus_per_node, spec, sizes, intra, inter, args.layer_ms * 1e-3)
    if args.plot:
        plot(ranking, args.plot)
    print(json.dumps(to_json(ranking)) if args.json else render(ranking, args.limit))
    return 0


COMMANDS = {"place": cmd_place, "layout": cmd_layout, "predict": cmd_predict, "run": cmd_run, "list": cmd_list, "sweep": cmd_sweep,
            "doctor": cmd_doctor, "suite": cmd_suite, "report": cmd_report}


if __name__ == "__main__":
    sys.exit(main())
