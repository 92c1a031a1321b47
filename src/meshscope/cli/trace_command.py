"""The body of `meshscope trace` (the parser is in `parser`)."""

from __future__ import annotations

import json
import sys

from ..core.result import TraceResult
from ..report.trace import print_trace, write_files
from ..trace.launch import RENDEZVOUS_FLAGS, TraceOptions, trace


def cmd_trace(args) -> int:
    rendezvous = tuple(f"--{flag}={getattr(args, flag.replace('-', '_'))}" for flag in RENDEZVOUS_FLAGS
                       if getattr(args, flag.replace("-", "_")) is not None)
    options = TraceOptions(target=tuple(args.job), nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                           rendezvous=rendezvous, steps=args.steps, timeout=args.timeout,
                           step_optimizer=args.step_optimizer, out=args.out, fake_world=args.fake_world,
                           ranks=args.ranks, cheap=args.cheap, recorder=args.recorder,
                           flight_recorder=args.flight_recorder, fake_tensors=args.fake_tensors)
    run_dir, doc = trace(options)
    result = TraceResult.from_json(doc)
    write_files(result, run_dir)
    if args.json:
        print(json.dumps(doc))
    else:
        print_trace(result)
        if "doctor" in doc and doc["doctor"]:
            from ..doctor import render

            print("\n".join(render(doc["doctor"])) if "findings" in doc["doctor"] else doc["doctor"].get("error", ""))
        print(f"run directory: {run_dir} (result.json, ledgers/, flight/, report.md, trace.json)")
    if doc.get("error"):
        print(f"meshscope trace: the job failed: {doc['error']}", file=sys.stderr)
    return 0 if doc["passed"] else 1


def report_trace(run_dir) -> int:
    """`meshscope report TRACE_DIR`: assemble the directory again (a hung job's too) and re-render."""
    from ..trace.assemble import assemble

    result = assemble(run_dir)
    write_files(result, run_dir)
    print_trace(result)
    return 0 if result.passed else 1


def cmd_diff(args) -> int:
    """`meshscope diff A B`: exit 0 when the two ledgers are the same, 1 when they differ."""
    from ..core.events import human_bytes
    from ..report.table import make_console, print_table
    from ..trace.diff import diff

    doc = diff(args.dir_a, args.dir_b)
    if args.json:
        print(json.dumps(doc))
        return 0 if doc["same"] else 1
    console = make_console()
    assumed = doc["assumed"]
    if assumed["fields"]:
        calls = ", ".join(f"{n} on {side.upper()}" for side, n in assumed["calls"].items() if n)
        console.print(f"not compared: {', '.join(assumed['fields'])} of the calls that assumed them ({calls}; a fake "
                      f"world cannot know what peers send), and the bytes of {len(assumed['totals'])} step/axis/op "
                      f"totals holding such calls")
    if doc["same"]:
        console.print(f"same ledgers on ranks {doc['ranks']}: {doc['a']} ({doc['kinds'][0]}) and {doc['b']} ({doc['kinds'][1]})")
        return 0
    print_table(console, f"differences per step, axis and op ({doc['kinds'][0]} A vs {doc['kinds'][1]} B, ranks "
                f"{doc['ranks']})", ["step", "axis", "op", "calls A", "calls B", "bytes A", "bytes B"],
                [[str(r["step"]), r["axis"], r["op"], str(r["count_a"]), str(r["count_b"]), human_bytes(r["bytes_a"]),
                  human_bytes(r["bytes_b"])] for r in doc["rows"]], key=3)
    for rank, d in doc["first_divergence"].items():
        console.print(f"rank {rank}, call #{d['index']}: A {d['a']}; B {d['b']}")
    return 1
