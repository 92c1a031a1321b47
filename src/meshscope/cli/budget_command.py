"""The bodies of `meshscope budget` and `meshscope check` (the parser is in `parser`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..core.errors import UsageError


def _out(args, what: str) -> Path:
    return args.out or Path("traces") / f"{what}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_budget(args) -> int:
    from ..budget.make import make
    from ..budget.template import Vary

    if not args.job:
        raise UsageError("meshscope budget needs the job after '--': meshscope budget [options] --budget FILE -- "
                         "SCRIPT [ARGS...]")
    varies = [Vary.parse(v) for v in args.vary]
    budget = make(list(args.trace_tokens or []), list(args.job), varies, _out(args, "budget"), args.budget)
    fitted = sum(not e.verified for e in budget.entries)
    print(f"{args.budget}: {len(budget.entries)} entries over {len(budget.classes)} rank classes from "
          f"{len(budget.points)} points" + (f"; {fitted} fitted, not verified (more points verify them)" if fitted
                                            else "; every formula verified"))
    if budget.pinned:
        print("pinned (the budget serves only these): " + ", ".join(f"{k} = {v}" for k, v in budget.pinned.items()))
    return 0


def cmd_check(args) -> int:
    from ..budget.make import check
    from ..core.trace_result import Outcome
    from ..report.table import make_console, print_table

    result = check(args.file, args.trace_tokens, args.job or None, _out(args, "check"), update=args.update)
    for line in result.warnings:
        print(f"meshscope check: warning: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json()))
        return result.exit_code
    console = make_console()
    for p in result.points:
        if p.outcome != Outcome.PASSED:
            console.print(f"{p.name}: the re-trace is {p.outcome} ({p.run_dir}): a budget holds only a passed trace",
                          highlight=False)
        elif p.violations:
            print_table(console, f"{p.name}: what moved ({p.run_dir})", ["entry", "part", "field", "expected", "got",
                                                                         "first call"],
                        [[v.entry, str(v.part), v.field, v.expected, v.got, v.first_call] for v in p.violations], key=0)
        else:
            console.print(f"{p.name}: every entry holds ({p.run_dir})", highlight=False)
    console.print(f"{result.verdict.upper().replace('_', ' ')}: {args.file}", highlight=False)
    return result.exit_code
