"""The body of `meshscope trace` (the parser is in `parser`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..report.trace import print_trace, verdict_lines, write_files
from ..trace.launch import options_of, trace


def cmd_trace(args) -> int:
    """`meshscope trace`: exit 0 passed, 1 failed or incomplete, 3 empty (`core.trace_result.EXIT_CODES`)."""
    options = options_of(args, args.job, args.out)
    result = trace(options)
    write_files(result, Path(result.run_dir), figures=False)
    if args.json:
        print(json.dumps(result.to_json()))
        for line in verdict_lines(result):  # stdout holds the one document; the verdict goes to stderr
            print(f"meshscope trace: {line}", file=sys.stderr)
    else:
        print_trace(result)
        if result.doctor is not None:
            from ..doctor import render

            print("\n".join(render(result.doctor)))
        print(f"run directory: {result.run_dir} (result.json, ledgers/, flight/, logs/, report.md, trace.json); "
              f"figures: meshscope report {result.run_dir}")
    return result.exit_code


def report_trace(run_dir) -> int:
    """`meshscope report TRACE_DIR`: the trace's result (assembled again for a hung or killed trace)
    re-rendered."""
    from ..trace.assemble import load

    result = load(run_dir)
    written = write_files(result, run_dir, figures=True)
    print_trace(result)
    print("written: " + ", ".join(written))
    return result.exit_code


def cmd_diff(args) -> int:
    """`meshscope diff A B`: exit 0 same, 1 differ, 3 not comparable (`trace.diff.EXIT_CODES`)."""
    from ..core.events import human_bytes
    from ..report.table import make_console, print_table
    from ..trace.diff import Verdict, diff

    result = diff(args.dir_a, args.dir_b)
    if args.json:
        print(json.dumps(result.to_json()))
        return result.exit_code
    console = make_console()
    kinds = f"{result.a.path} ({result.a.kind}) and {result.b.path} ({result.b.kind})"
    if result.verdict == Verdict.NOT_COMPARABLE:
        console.print(f"not comparable: {kinds}", highlight=False)
        for reason in result.reasons:
            console.print(f"  {reason}", highlight=False)
        return result.exit_code
    for side, ranks in result.not_traced.items():
        if ranks:
            console.print(f"not traced on {side.upper()}: ranks {ranks}; compared on the ranks both traced", highlight=False)
    one_sided = [m for m in result.axes if m.by is None]
    renamed = [m for m in result.axes if m.by == "members" and m.a != m.b]
    if renamed:
        console.print("axes matched by their groups: " + ", ".join(f"{m.a} (A) = {m.b} (B)" for m in renamed),
                      highlight=False)
    if one_sided:
        console.print("axes on one side only: " + ", ".join(f"{m.a or m.b} ({'A' if m.a else 'B'} only)"
                                                           for m in one_sided), highlight=False)
    assumed = result.assumed
    if assumed["fields"]:
        calls = ", ".join(f"{n} on {side.upper()}" for side, n in assumed["calls"].items() if n)
        console.print(f"not compared: {', '.join(assumed['fields'])} of the calls that assumed them ({calls}; a fake "
                      f"world cannot know what peers send, nor sizes computed from values it has not got), and the bytes of {len(assumed['totals'])} step/axis/op "
                      f"totals holding such calls")
    if result.same:
        console.print(f"same ledgers on ranks {result.ranks}: {kinds}", highlight=False)
        return result.exit_code
    print_table(console, f"differences per step, axis and op ({result.a.kind} A vs {result.b.kind} B, ranks "
                f"{result.ranks})", ["step", "axis", "op", "calls A", "calls B", "bytes A", "bytes B"],
                [[str(r["step"]), r["axis"], r["op"], str(r["count_a"]), str(r["count_b"]), human_bytes(r["bytes_a"]),
                  human_bytes(r["bytes_b"])] for r in result.rows], key=3)
    for rank, d in result.first_divergence.items():
        console.print(f"rank {rank}, call #{d['index']}: A {d['a']}; B {d['b']}", highlight=False)
    return result.exit_code
