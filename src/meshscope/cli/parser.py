"""The ``meshscope`` command line.

Stable interface (design brief): with ``--json`` stdout carries exactly one JSON document; progress,
logs and worker output go to stderr. Bad input is one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core.errors import UsageError
from ..core.faults import KINDS
from ..core.mesh import DEFAULT_ORDER
from ..core.overrides import OVERRIDES, SWITCHES
from ..place.links import INTER_DEFAULT, INTRA_DEFAULT
from ..predict.model_spec import DP_FLAVOURS, ModelSpec
from .place_command import MODEL_ONLY
from ..trace.launch import add_trace_options


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as every other bad input
        raise UsageError(message)


def _add_overrides(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overrides (where they apply to the experiment)")
    for flag, (dest, typ, help_) in OVERRIDES.items():
        g.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    for flag, (dest, help_) in SWITCHES.items():
        g.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_)


def _add_launch_options(p: argparse.ArgumentParser, timeout: float, default_out: str) -> None:
    """--backend, --timeout, --out and --json, for every command that launches ranks."""
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="gloo on CPU (default) or nccl, one rank per GPU")
    p.add_argument("--timeout", type=float, default=timeout, help="seconds a collective may take (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help=f"run directory (default {default_out})")
    p.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")


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
    _add_launch_options(run, 60.0, "runs/<experiment>-<time>")
    run.add_argument("--profile", type=int, nargs="?", const=5, default=0, metavar="STEPS",
                     help="after verifying, profile STEPS training steps (default 5): NCCL kernel counts vs prediction")
    run.add_argument("--inject", default=None, metavar="KIND",
                     help="plant a fault on purpose: " + ", ".join(KINDS))

    suite = sub.add_parser("suite", help="every configuration of the chapter (docs/chapter.md) in one launch: "
                                         "verified, timed, compared")
    suite.add_argument("--configs", default=None, help="comma-separated subset (default: all; see `meshscope suite --list`)")
    suite.add_argument("--list", action="store_true", help="list the suite's configurations and exit")
    suite.add_argument("--rounds", type=int, default=2, help="timing rounds, order reversed every other round (default %(default)s)")
    suite.add_argument("--iters", type=int, default=20, help="timed steps per config and round (default %(default)s)")
    suite.add_argument("--warmup", type=int, default=3, help="untimed steps before each timed series (default %(default)s)")
    suite.add_argument("--steps-per-sample", type=int, default=1,
                       help="back-to-back steps per timed sample; 1 = per-step timing (default %(default)s)")
    suite.add_argument("--cuda-graph", action="store_true",
                       help="time each sample as one replay of a CUDA graph of its steps (no launch jitter; nccl)")
    suite.add_argument("--cv-threshold", type=float, default=0.05, help="PERF_UNSTABLE above this CV (default %(default)s)")
    suite.add_argument("--profile", action="store_true", help="torch.profiler trace per rank and config (NCCL kernel counts)")
    suite.add_argument("--profile-steps", type=int, default=5, help="steps per profiled trace (default %(default)s)")
    suite.add_argument("--world", type=int, default=None, help="run every config on this many ranks (default: its own, 4)")
    suite.add_argument("--sweep", default=None, metavar="SWEEP_JSON",
                       help="a saved `meshscope sweep` result: predicted vs measured communication time (with --profile)")
    _add_launch_options(suite, 120.0, "runs/suite-<time>")

    rep = sub.add_parser("report", help="re-render a run directory's tables, report.md and figures")
    rep.add_argument("run_dir", type=Path)

    doc = sub.add_parser("doctor", help="diagnose a run or trace directory's flight logs, or PyTorch Flight "
                                        "Recorder dumps (a directory or a prefix such as /tmp/nccl_trace_rank_)")
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
    sw.add_argument("--cuda-graph", action="store_true",
                    help="time each sample as one replay of a CUDA graph of its calls (nccl-tests -G; nccl)")
    _add_launch_options(sw, 120.0, "runs/sweep-<time>; gets sweep.json")

    tr = sub.add_parser("trace", help="trace an unmodified torchrun job: every collective of every rank, per step",
                        usage="meshscope trace [options] -- SCRIPT [ARGS...]  (or -- -m MODULE [ARGS...])")
    add_trace_options(tr)
    tr.add_argument("--out", type=Path, default=None, help="run directory (default traces/<script>-<time>)")
    tr.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")

    bu = sub.add_parser("budget", help="fit a communication budget: a job's steady-step calls per rank class as "
                                       "formulas in the --vary values (docs/budget.md)",
                        usage="meshscope budget [trace options] --budget FILE [--out DIR] [--vary NAME=V1,V2,...]... "
                              "-- SCRIPT [ARGS...]  ({NAME} placeholders in ARGS and option values)")
    bu.add_argument("--budget", type=Path, required=True, help="the budget file to write (TOML)")
    bu.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2",
                    help="trace the job at each value (several make a grid); {NAME} in ARGS and option values")
    bu.add_argument("--out", type=Path, default=None, help="the points' traces, one subdirectory each "
                                                           "(default traces/budget-<time>)")
    ck = sub.add_parser("check", help="re-trace a job and hold it to its budget (exit 0 holds, 1 violated, 3 the "
                                      "re-trace did not pass)",
                        usage="meshscope check FILE [trace options] [--json] [--update] [-- SCRIPT ARGS...]")
    ck.add_argument("file", type=Path, help="the budget file")
    ck.add_argument("--update", action="store_true", help="re-trace every point, fit the budget anew, write it, "
                                                          "and say what moved")
    ck.add_argument("--out", type=Path, default=None, help="the re-traces (default traces/check-<time>)")
    ck.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")

    fc = sub.add_parser("forecast", help="a job's step time, exposed communication per axis and peak memory per "
                                         "rank class on a named cluster (docs/forecast.md)",
                        usage="meshscope forecast --fake-world N --cluster SPEC [trace options] [--tokens T] [--json] "
                              "-- SCRIPT [ARGS...]  (or --from-trace DIR)")
    add_trace_options(fc)
    fc.add_argument("--cluster", required=True, metavar="SPEC",
                    help="h100-sxm, h200, a100-sxm, or a JSON file of the same fields (docs/forecast.md)")
    fc.add_argument("--gpus-per-node", type=int, default=None,
                    help="ranks per node (rank r on node r // G; default: the cluster's)")
    fc.add_argument("--sweep", type=Path, default=None,
                    help="a meshscope sweep run directory or sweep.json: its intra-node fit replaces the spec's NVLink")
    fc.add_argument("--tokens", type=int, default=None,
                    help="tokens the whole job trains on per step (global batch x sequence): gives tokens/s per GPU")
    fc.add_argument("--tf32", action="store_true", help="fp32 matmuls run as TF32 (the job allows it)")
    fc.add_argument("--real-tensors", action="store_true",
                    help="trace with tensors that hold data (routing that sizes calls from values, MoE): slower, and "
                         "each traced rank's model must fit this machine (default: fake tensors)")
    fc.add_argument("--from-trace", type=Path, default=None, metavar="DIR",
                    help="forecast a trace already made with --fake-world N --fake-tensors --work")
    fc.add_argument("--out", type=Path, default=None, help="run directory of the trace (default traces/<script>-<time>)")
    fc.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")

    df = sub.add_parser("diff", help="compare two traces (or a trace and a run): per step, axis and op, and each rank's first divergent call")
    df.add_argument("dir_a", type=Path)
    df.add_argument("dir_b", type=Path)
    df.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")

    pl = sub.add_parser("place", help="rank the placements of the axes on nodes by predicted communication time "
                                      "(with --from-trace DIR --cluster SPEC: by the forecast's step; docs/place.md)",
                        description="Rank the placements of the parallel axes on nodes (axis orders, leftmost fastest). "
                                    "Alone: the analytic model's per-axis volumes on alpha-beta links. --from-trace DIR: "
                                    "a trace's volumes on those links. --from-trace DIR --cluster SPEC: the traced job's "
                                    "step as meshscope forecast puts it on the cluster, under each placement (the trace "
                                    "needs work logs: meshscope trace --fake-world N --fake-tensors --work). "
                                    "--compare-trace DIR: the model beside a trace. See docs/place.md.")
    pl.add_argument("--world", type=int, default=None, help="ranks (required unless a trace gives them)")
    pl.add_argument("--gpus-per-node", type=int, default=None,
                    help="NVLink domain size (default 8, or with --cluster the cluster's)")
    for axis in ("tp", "cp", "pp", "ep", "etp"):
        pl.add_argument(f"--{axis}", type=int, default=None, help="(default 1, or the trace's)")
    spec = ModelSpec()
    for flag, dest in (("--layers", "layers"), ("--hidden", "hidden"), ("--ffn", "ffn"), ("--seq", "seq_len"),
                       ("--micro-batch", "micro_batch"), ("--heads", "heads"), ("--experts", "experts"),
                       ("--topk", "topk"), ("--microbatches", "microbatches"), ("--vocab", "vocab"),
                       ("--position-rows", "position_rows"), ("--norm-params", "norm_params")):
        pl.add_argument(flag, dest=dest, type=int, default=getattr(spec, dest), help="(default %(default)s)")
    pl.add_argument("--dtype", default=spec.dtype, help="activation/gradient dtype (default %(default)s)")
    pl.add_argument("--sp", dest="sequence_parallel", action="store_true", help="sequence parallel TP (AG + RS)")
    pl.add_argument("--tied-embeddings", action="store_true", help="the output layer shares the token embedding")
    pl.add_argument("--mlp-bias", action="store_true", help="the MLP's W1 and W2 have biases")
    pl.add_argument("--separate-qkv", action="store_true", help="Q, K, V as three tensors (torch's test Transformer)")
    pl.add_argument("--data-parallel", default=spec.data_parallel, choices=DP_FLAVOURS,
                    help="gradient sync over dp (default %(default)s)")
    pl.add_argument("--bucket-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: DDP's, 1 MiB then 25)")
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
    pl.add_argument("--compare-trace", type=Path, default=None, metavar="DIR",
                    help="the model's per-axis calls and bytes beside a trace's steady step (its layout, these shapes)")
    pl.add_argument("--from-trace", type=Path, default=None, metavar="DIR",
                    help="rank placements by a trace's per-axis volumes instead of the model's")
    pl.add_argument("--cluster", default=None, metavar="SPEC",
                    help="with --from-trace (a trace made with --fake-world N --fake-tensors --work): rank by the "
                         "forecast's job step on this cluster (h100-sxm, h200, a100-sxm or a JSON file, as meshscope "
                         "forecast takes; --sweep replaces its intra-node link) instead of the alpha-beta links")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(model_only={a.dest: (a.option_strings[0], a.default) for a in pl._actions if a.dest in MODEL_ONLY})
    return p


JOB_COMMANDS = ("trace", "budget", "check", "forecast")
"""Commands that take a job after ``--``."""

OWN_FLAGS = {"budget": {"--budget": 1, "--vary": 1, "--out": 1}, "check": {"--update": 0, "--out": 1, "--json": 0}}
"""`budget` and `check`: their own flags (and how many values each takes); every other option before
``--`` is a trace option, kept as given for the budget's template."""


def split_job(argv: list[str]) -> tuple[list[str], list[str], list[str] | None]:
    """``trace [options] -- JOB...`` -> (meshscope's arguments, the job's, for `budget` and `check` the trace
    options' tokens); other commands unchanged."""
    if not argv or argv[0] not in JOB_COMMANDS:
        return argv, [], None
    command = argv[0]
    own = argv[: argv.index("--")] if "--" in argv else argv
    if "-h" in own or "--help" in own:
        return own, [], None
    if "--" not in argv and command != "check" and not (command == "forecast" and "--from-trace" in own):
        raise UsageError(f"meshscope {command} needs '--' before the job: meshscope {command} [options] -- SCRIPT "
                         f"[ARGS...]{' (or --from-trace DIR)' if command == 'forecast' else ''}")
    cut = argv.index("--") if "--" in argv else len(argv)
    job = argv[cut + 1:]
    if command in ("trace", "forecast"):
        return argv[:cut], job, None
    mine, tokens, i = [command], [], 1
    if command == "check" and cut > 1:  # the budget file comes first
        mine.append(argv[1])
        i = 2
    flags = OWN_FLAGS[command]
    while i < cut:
        token = argv[i]
        name = token.split("=", 1)[0]
        if name in flags:
            width = 0 if "=" in token else flags[name]
            mine += argv[i:i + 1 + width]
            i += 1 + width
        else:
            tokens.append(token)
            i += 1
    if "--out" in tokens:
        raise UsageError(f"meshscope {command}: --out names the directory of every point's trace")
    return mine, job, tokens if tokens or command == "budget" else None


def main(argv=None) -> int:
    try:
        mine, job, tokens = split_job(list(sys.argv[1:] if argv is None else argv))
        args = build_parser().parse_args(mine)
        args.job, args.trace_tokens = job, tokens
        from .commands import COMMANDS

        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"meshscope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("meshscope: interrupted", file=sys.stderr)
        return 130


# -- commands ------------------------------------------------------------------------------------


if __name__ == "__main__":
    sys.exit(main())
