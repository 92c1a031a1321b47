"""One rank of a run: ``python -m meshscope.worker RUN_DIR`` (started by torchrun).

Reads ``RUN_DIR/spec.json`` (written by the CLI before launch), runs each experiment in it, gathers
every rank's output to rank 0, which verifies and writes ``result.json``. A rank that fails writes
``errors/rank<R>.json`` (time, error, traceback) before exiting non-zero, so the launcher can name the
first failing rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from . import experiments
from .flightlog import FlightLog
from .runtime import RankContext
from .verify import build_result


def write_json(path: Path, doc) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def run_spec(ctx: RankContext, spec: dict) -> list[dict] | None:
    """Run every experiment of the spec; rank 0 returns their results."""
    if spec.get("kind") == "suite":
        from .environment import environment
        from .suite import SuiteOptions, run_suite_rank
        from .suite_report import summary

        doc = run_suite_rank(ctx, SuiteOptions(**{**spec["suite"], "configs": tuple(spec["suite"]["configs"])}))
        if ctx.rank != 0:
            return None
        doc["environment"] = environment(ctx.backend, ctx.world)
        doc["summary"] = summary(doc)
        return [doc]
    if spec.get("kind") == "sweep":  # a collective benchmark, not an experiment: no ledger to verify
        from .sweep import SweepConfig, run_sweep_rank

        doc = run_sweep_rank(ctx, SweepConfig.from_json(spec["sweep"]))
        return [doc] if ctx.rank == 0 else None
    results = []
    for i, item in enumerate(spec["experiments"]):
        exp = experiments.get(item["name"])
        cfg = exp.config(item.get("overrides", {}))
        ctx.progress(f"{exp.name} ({i + 1}/{len(spec['experiments'])}): running")  # also a flight-log mark
        out = exp.run_rank(ctx, cfg)
        outs = ctx.gather(out)
        kernels = None
        if spec.get("profile"):
            from .profiling import profile_config

            ctx.progress(f"{exp.name}: profiling {spec['profile']} steps")
            kernels = profile_config(ctx, exp, cfg, exp.name, spec["profile"], warmup=3)
        if ctx.rank == 0:
            results.append(build_result(exp, cfg, ctx.backend, outs, kernels))
            ctx.progress(f"{exp.name}: {'passed' if results[-1]['passed'] else 'FAILED'}")
    return results if ctx.rank == 0 else None


def execute(run_dir: Path, spec: dict) -> int:
    """Run `spec` as this rank (torchrun's environment), keeping a flight log; rank 0 writes result.json.

    On failure the rank records ``errors/rank<R>.json`` and returns 1.
    """
    ctx = None
    try:
        ctx = RankContext.start(spec["backend"], spec["timeout"], run_dir)
        ctx.flight = FlightLog(run_dir, ctx.rank)
        ctx.inject = spec.get("inject")
        try:
            with ctx.flight.capture():
                results = run_spec(ctx, spec)
        finally:
            ctx.flight.close()
        if results is not None:
            write_json(run_dir / "result.json", results[0] if len(results) == 1 else {"results": results})
        return 0
    except Exception as exc:  # noqa: BLE001 - every failure is reported, then the rank exits non-zero
        rank = int(os.environ.get("RANK", -1))
        (run_dir / "errors").mkdir(exist_ok=True)
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        write_json(run_dir / "errors" / f"rank{rank}.json",
                   {"rank": rank, "time": time.time(), "error": message, "traceback": traceback.format_exc()})
        print(f"rank {rank} failed: {message}", file=sys.stderr, flush=True)
        return 1
    finally:
        if ctx is not None:
            ctx.close()


if __name__ == "__main__":
    directory = Path(sys.argv[1])
    code = execute(directory, json.loads((directory / "spec.json").read_text()))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gloo's C++ threads have been seen to abort ("terminate called
    # without an active exception") in static destructors after a clean run; the work is done.
    os._exit(code)
