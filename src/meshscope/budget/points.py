"""Tracing a budget's points: the templates filled in, one trace per point, and what each point's
variables are.

A point's trace options are parsed by the same definition as `meshscope trace`'s
(`trace.launch.add_trace_options`), after the placeholders are filled in, so ``--fake-world
{world}`` is checked as any ``--fake-world`` is. Each trace goes into its own subdirectory of the
budget's ``--out`` (named by the point). A point's variables are its ``--vary`` values, ``world`` (the
ranks of the job) and the size of each axis the job named (the groups of an axis that all have one
size), as the job names them: ``tp``, ``dp_shard``, ``TENSOR_MODEL_PARALLEL_GROUP``'s ``tp``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import UsageError
from ..core.trace_result import TraceResult
from ..trace.launch import add_trace_options, options_of, trace
from .template import point_name, substitute


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as every other bad input
        raise UsageError(f"trace options: {message}")


def parse_trace_options(tokens: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="meshscope budget", add_help=False)
    add_trace_options(parser)
    return parser.parse_args(tokens)


def trace_point(trace_tokens: list[str], command: list[str], values: dict[str, int], out: Path,
                echo=None) -> TraceResult:
    """The trace of one point (`values` filled into both templates), in ``out/<point name>``."""
    args = parse_trace_options(substitute(trace_tokens, values))
    return trace(options_of(args, substitute(command, values), out / point_name(values)), echo)


def variables(result: TraceResult, values: dict[str, int]) -> dict[str, int]:
    """A point's variables: its ``--vary`` values, ``world`` and every axis's group size."""
    out = dict(values)
    for name, value in [("world", result.world)] + [(axis, len(groups[0])) for axis, groups in result.axes.items()
                                                    if len({len(g) for g in groups}) == 1]:
        if out.setdefault(name, value) != value:
            raise UsageError(f"--vary {name}={values[name]} but the trace's {name} is {value}: name the --vary "
                             f"otherwise, or let the job's own {name} be the variable")
    return out


def creation_order(result: TraceResult) -> tuple[str, ...]:
    """The kinds of group rank 0 created, in order, consecutive repeats once (a loop over an axis's groups
    is one kind): ``("mesh_tp", "mesh_dp")``."""
    out: list[str] = []
    for desc, ranks in result.created:
        desc = desc or f"group of {len(ranks)}"
        if not out or out[-1] != desc:
            out.append(desc)
    return tuple(out)
