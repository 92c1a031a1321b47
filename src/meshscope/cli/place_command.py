"""``meshscope place``: rank axis placements from the analytic model or a trace's volumes, or by the forecast of a
trace's step on a cluster (``--from-trace DIR --cluster SPEC``), or hold the model against a trace
(``--compare-trace``)."""

from __future__ import annotations

import json
import sys

from ..core.errors import UsageError

AXES = ("tp", "cp", "pp", "ep", "etp")
"""The axis sizes place takes as flags (dp and edp are what they leave)."""
MODEL_ONLY = ("layers", "hidden", "ffn", "seq_len", "micro_batch", "heads", "experts", "topk", "microbatches", "vocab",
              "position_rows", "norm_params", "dtype", "sequence_parallel", "tied_embeddings", "mlp_bias",
              "separate_qkv", "data_parallel", "bucket_mb", "stage_layers", "layer_ms", "intra_latency", "intra_bw",
              "inter_latency", "inter_bw")
"""place's options that only the analytic model and its alpha-beta links read: ``--cluster`` forecasts the traced
job's own shapes on the cluster's links, and refuses them. The parser keeps each one's flag and default
(``args.model_only``)."""


def cmd_place(args) -> int:
    if args.cluster is not None:
        return _place_by_forecast(args)
    from ..place.advisor import rank_placements
    from ..place.links import LinkClass, link_from_sweep
    from ..place.report import plot, render, to_json
    from ..predict.model_spec import ModelSpec, parse_stage_layers

    spec = ModelSpec(**{k: getattr(args, k) for k in (
        "layers", "hidden", "ffn", "seq_len", "micro_batch", "heads", "experts", "topk", "microbatches", "dtype",
        "sequence_parallel", "vocab", "tied_embeddings", "position_rows", "norm_params", "mlp_bias", "separate_qkv",
        "data_parallel", "bucket_mb")}, stage_layers=parse_stage_layers(args.stage_layers))
    trace, world, sizes = _place_layout(args)
    if args.compare_trace:
        from ..place.compare import compare_trace
        from ..report.place_compare import render as render_comparison
        from ..report.place_compare import to_json as comparison_json

        comparison = compare_trace(trace, spec)
        print(json.dumps(comparison_json(comparison)) if args.json else render_comparison(comparison))
        return 0
    intra = (link_from_sweep(args.sweep) if args.sweep else
             LinkClass("intra-node", args.intra_latency * 1e-6, args.intra_bw * 1e9, "flags"))
    inter = LinkClass("inter-node", args.inter_latency * 1e-6, args.inter_bw * 1e9, "flags")
    if intra.bandwidth < inter.bandwidth:
        print(f"meshscope: note: intra-node link {intra.bandwidth / 1e9:.3g} GB/s ({intra.source}) is slower than "
              f"inter-node {inter.bandwidth / 1e9:.3g} GB/s; a CPU/gloo sweep does not describe NVLink", file=sys.stderr)
    traced = {}
    if trace is not None:
        steps = sorted({r.step for r in trace.ranks})
        traced = {"traced": trace.stages(), "source": f"the trace {trace.run_dir} (steady step {_csv(steps)}, ranks "
                                                      f"{_csv(r.rank for r in trace.ranks)})"}
        if trace.skipped_axes:
            print(f"meshscope: note: calls on {', '.join(trace.skipped_axes)} are left out (no axis a placement moves)",
                  file=sys.stderr)
    gpus_per_node = 8 if args.gpus_per_node is None else args.gpus_per_node
    ranking = rank_placements(world, gpus_per_node, spec, sizes, intra, inter, args.layer_ms * 1e-3, **traced)
    if args.plot:
        plot(ranking, args.plot)
    print(json.dumps(to_json(ranking)) if args.json else render(ranking, args.limit))
    return 0


def _place_by_forecast(args) -> int:
    """``--from-trace DIR --cluster SPEC``: every distinct placement of the trace's ranks, by the forecast's step."""
    from ..forecast.inputs import read
    from ..place.forecast_ranking import rank_by_forecast
    from ..place.traced import layout_of
    from ..report.place_forecast import render, to_json
    from .forecast_command import cluster_of

    if args.compare_trace:
        raise UsageError("--compare-trace and --cluster: --cluster ranks placements (with --from-trace DIR)")
    if args.from_trace is None:
        raise UsageError("--cluster ranks the placements of a traced job by its forecast: give --from-trace DIR (a trace "
                         "made with meshscope trace --fake-world N --fake-tensors --work)")
    if args.plot:
        raise UsageError("--plot draws the alpha-beta ranking: leave it out with --cluster")
    ignored = _model_flags_given(args)
    if ignored:
        raise UsageError(f"{', '.join(ignored)}: the analytic model's and its alpha-beta links' options; --cluster "
                         f"forecasts the traced job's own shapes on the cluster's links (leave them out, or drop --cluster)")
    cluster = cluster_of(args)  # --gpus-per-node and --sweep as meshscope forecast takes them
    job = read(args.from_trace)
    layout = layout_of(job.result, "--from-trace", args.from_trace)
    _check_given(args, layout, "--from-trace")
    ranking = rank_by_forecast(job, layout, cluster)
    print(json.dumps(to_json(ranking)) if args.json else render(ranking, args.limit))
    return 0


def _place_layout(args):
    """(the trace of --compare-trace / --from-trace or None, world, tp/cp/pp/ep/etp sizes): from the trace when one
    is given (flags that disagree with it are an error), else from --world and the axis flags."""
    from ..place.traced import load

    if args.compare_trace and args.from_trace:
        raise UsageError("--compare-trace and --from-trace: give one of them")
    flag, path = ("--compare-trace", args.compare_trace) if args.compare_trace else ("--from-trace", args.from_trace)
    if path is None:
        if args.world is None:
            raise UsageError("place needs --world (or --compare-trace DIR / --from-trace DIR, whose layout it takes)")
        return None, args.world, {a: getattr(args, a) or 1 for a in AXES}
    trace = load(path, flag)
    lay = trace.layout
    _check_given(args, lay, flag)
    return trace, lay.world, {a: getattr(lay, a) for a in AXES}


def _check_given(args, lay, flag: str) -> None:
    """--world and the axis sizes, where given, must be the trace's."""
    given = {"world": args.world, **{a: getattr(args, a) for a in AXES}}
    for name, value in given.items():
        if value is not None and value != getattr(lay, name):
            raise UsageError(f"--{name} {value} disagrees with the trace's layout ({name} {getattr(lay, name)}); "
                             f"leave it out: {flag} takes the layout from the trace")


def _model_flags_given(args) -> list[str]:
    """The options of `MODEL_ONLY` given other than at their defaults, as the user wrote them."""
    return [flag for dest, (flag, default) in args.model_only.items() if getattr(args, dest) != default]


def _csv(values) -> str:
    return ",".join(map(str, values))
