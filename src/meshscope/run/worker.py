"""One rank of a run: what ``python -m meshscope.cli.worker RUN_DIR`` (started by torchrun) does.

Reads ``RUN_DIR/spec.json`` (written by the CLI before launch), runs its program (by default each
experiment in it; the suite and the sweep bring their own, `Program`), gathers
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
from typing import Callable

from .. import experiments
from ..capture.flightlog import FlightLog
from ..timing.profiling import profile_config
from ..verify.result import build_result
from ..core.rundir import RunDir, write_atomic
from .runtime import RankContext


def write_json(path: Path, doc) -> None:
    """Write atomically: a reader never sees half a file."""
    write_atomic(path, json.dumps(doc, indent=1))


def run_experiments(ctx: RankContext, spec: dict) -> list[dict] | None:
    """The ``run`` program: every experiment of the spec, verified; rank 0 returns their results."""
    results = []
    for i, item in enumerate(spec["experiments"]):
        exp = experiments.get(item["name"])
        overrides = item.get("overrides", {})
        cfg = exp.config(overrides)
        ctx.progress(f"{exp.name} ({i + 1}/{len(spec['experiments'])}): running")  # also a flight-log mark
        out = exp.run_rank(ctx, cfg)
        outs = ctx.gather(out)
        kernels = None
        if spec.get("profile"):
            ctx.progress(f"{exp.name}: profiling {spec['profile']} steps")
            kernels = profile_config(ctx, exp, cfg, exp.name, spec["profile"], warmup=3)
        if ctx.rank == 0:
            result = build_result(exp, cfg, ctx.backend, outs, kernels, label=exp.label(overrides))
            ctx.progress(f"{exp.name}: {'passed' if result.passed else 'FAILED'}")
            results.append(result.to_json())
    return results if ctx.rank == 0 else None


Program = Callable[[RankContext, dict], "list[dict] | None"]
"""A rank-side program: (this rank's context, the spec) -> rank 0's result documents, None elsewhere."""


def execute(run_dir: Path, spec: dict, program: Program = run_experiments) -> int:
    """Run `program` on `spec` as this rank (torchrun's environment), keeping a flight log; rank 0
    writes result.json.

    On failure the rank records ``errors/rank<R>.json`` and returns 1.
    """
    ctx = None
    ok = False
    try:
        ctx = RankContext.start(spec["backend"], spec["timeout"], run_dir)
        ctx.flight = FlightLog(run_dir, ctx.rank)
        ctx.inject = spec.get("inject")
        try:
            with ctx.flight.capture():
                results = program(ctx, spec)
        finally:
            ctx.flight.close()
        if results is not None:
            write_json(RunDir(run_dir).result, results[0] if len(results) == 1 else {"results": results})
        ok = True
        return 0
    except Exception as exc:  # noqa: BLE001 - every failure is reported, then the rank exits non-zero
        rank = int(os.environ.get("RANK", -1))
        path = RunDir(run_dir).errors(rank)
        path.parent.mkdir(exist_ok=True)
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        write_json(path,
                   {"rank": rank, "time": time.time(), "error": message, "traceback": traceback.format_exc()})
        print(f"rank {rank} failed: {message}", file=sys.stderr, flush=True)
        return 1
    finally:
        if ctx is not None:  # joins the communication threads now, not during interpreter teardown
            ctx.close(barrier=ok)  # a failed rank does not wait for peers that may never come

