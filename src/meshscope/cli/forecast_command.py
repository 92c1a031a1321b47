"""``meshscope forecast``: trace the job in a fake world of its real size with fake tensors, counting its work
(or read such a trace, ``--from-trace``), and put its step on the cluster ``--cluster`` names."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ..core.errors import UsageError


def cmd_forecast(args) -> int:
    from ..forecast.inputs import read
    from ..forecast.step import forecast
    from ..core.rundir import RunDir
    from ..report.forecast import plot, render

    cluster = cluster_of(args)
    if args.tokens is not None and args.tokens < 1:
        raise UsageError(f"--tokens {args.tokens} must be a positive number of tokens per step")
    if args.from_trace is not None:
        if args.job:
            raise UsageError("--from-trace reads a trace already made: leave out the job after '--'")
        run_dir = args.from_trace
    else:
        run_dir = _trace(args)
        if run_dir is None:
            return 1
    result = forecast(read(run_dir, "--from-trace" if args.from_trace is not None else "the trace"), cluster,
                      tokens=args.tokens, tf32=args.tf32)
    figure = plot(result, RunDir(run_dir).figures / f"forecast-{Path(cluster.name).stem}.png")
    if args.json:
        print(json.dumps({**result.to_json(), "figure": figure}))
    else:
        render(result)
        print(f"figure: {figure}")
    return 0


def cluster_of(args):
    from ..forecast.cluster import load_cluster

    cluster = load_cluster(args.cluster)
    if args.gpus_per_node is not None:
        if args.gpus_per_node < 1:
            raise UsageError(f"--gpus-per-node {args.gpus_per_node} must be a positive number of ranks")
        cluster = dataclasses.replace(cluster, network=dataclasses.replace(cluster.network,
                                                                           gpus_per_node=args.gpus_per_node))
    if args.sweep is not None:
        from ..place.links import link_from_sweep

        cluster = cluster.with_intra_link(link_from_sweep(args.sweep))
    return cluster


def _trace(args) -> Path | None:
    """Trace the job with fake tensors and its work counted; its run directory, or None (the verdict said why)."""
    from ..core.trace_result import Outcome
    from ..report.trace import print_trace, verdict_lines
    from ..trace.launch import options_of, trace

    if args.fake_world is None:
        raise UsageError("meshscope forecast traces the job in a fake world of its real size: give --fake-world N "
                         "(or --from-trace DIR)")
    real = args.real_tensors or bool(args.measure_on)  # a measured op runs for real
    if real and args.fake_tensors:
        raise UsageError(f"{'--measure-on' if args.measure_on else '--real-tensors'} and --fake-tensors: choose one "
                         f"(forecast uses fake tensors by default)")
    options = dataclasses.replace(options_of(args, args.job, args.out), fake_tensors=not real, work=True)
    result = trace(options)
    # a job that issued no collective (one GPU, or FSDP2 over a world of 1) still has a step: its compute
    if result.outcome not in (Outcome.PASSED, Outcome.EMPTY):
        print_trace(result)
        for line in verdict_lines(result):
            print(f"meshscope forecast: {line}", file=sys.stderr)
        print(f"meshscope forecast: the trace did not pass, so there is no step to forecast ({result.run_dir})",
              file=sys.stderr)
        return None
    return Path(result.run_dir)
