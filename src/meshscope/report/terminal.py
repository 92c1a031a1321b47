"""Terminal rendering of layouts, predictions and results (rich tables on stdout, built by `table`).

Each printer takes the console to print on (default: stdout's, `table.make_console`), so that what
it shows at a given width can be rendered and read back.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ..core.events import OPS, counts, human_bytes
from ..core.mesh import COORD_AXES, GROUP_NAMES, Layout
from ..core.result import RunResult
from .table import make_console, print_table

MAX_ROWS = 64
"""Rows of the rank table printed before eliding (the JSON has all)."""

CONSOLE = make_console()
"""stdout's console, the default of every printer."""


def print_layout(layout: Layout, console: Console | None = None) -> None:
    console = console or CONSOLE
    sizes = layout.sizes
    console.print(f"world {layout.world}, order {layout.order} (leftmost fastest): "
                  + ", ".join(f"{a} {sizes[a]}" for a in sizes))
    shown = [a for a in COORD_AXES if sizes[a] > 1] or ["tp"]
    rows = [[str(r), *(str(layout.coords(r)[a]) for a in shown)] for r in range(min(layout.world, MAX_ROWS))]
    print_table(console, "rank coordinates", ["rank", *shown], rows)
    if layout.world > MAX_ROWS:
        console.print(f"... {layout.world - MAX_ROWS} more ranks (use --json for all)")
    dense = [a for a in ("tp", "cp", "dp", "pp") if sizes[a] > 1]
    if len(dense) == 2 and layout.world <= MAX_ROWS:
        fast, slow = sorted(dense, key=lambda a: layout.groups(a)[0][1] - layout.groups(a)[0][0])
        rows = [[f"{slow}_rank={layout.coords(row[0])[slow]}", *(f"rank{r}" for r in row)] for row in layout.groups(fast)]
        print_table(console, f"{slow} x {fast} matrix", ["", *(f"{fast}_rank={i}" for i in range(sizes[fast]))], rows)
    for name in GROUP_NAMES:
        groups = layout.groups(name)
        if len(groups[0]) < 2:
            continue
        canon = layout.canonical(name)
        alias = f" (same as {canon})" if canon != name else ""
        text = ", ".join(str(g) for g in groups[:16]) + (f", ... ({len(groups)} groups)" if len(groups) > 16 else "")
        console.print(f"{name:>6} groups{alias}: {text}")
    console.print(f"creation order: {len(layout.creation_order())} new_group calls, identical on every rank")


def print_prediction(exp, cfg, events, console: Console | None = None) -> None:
    """Rank 0's predicted collectives, axis and sequence number first: together they name a row, so a
    table too wide for the terminal continues in parts that repeat them."""
    console = console or CONSOLE
    changed = exp.changed(cfg)
    console.print(f"{exp.name}: {exp.description}" + (f"; changed: {', '.join(changed)}" if changed else ""))
    rows = []
    for e in sorted((e for e in events if e.rank == 0), key=lambda e: (e.axis, e.seq)):
        extra = (f"{list(e.input_splits)} -> {list(e.output_splits)}" if e.input_splits is not None
                 else (f"peer {e.peer}" if e.peer is not None else ""))
        rows.append([e.axis, str(e.seq), e.op, str(list(e.group)), e.phase, human_bytes(e.bytes_in),
                     human_bytes(e.bytes_out), e.region, "" if e.microbatch is None else str(e.microbatch), extra])
    print_table(console, "predicted collectives per step, rank 0 (--json for every rank)",
                ["axis", "seq", "op", "group", "phase", "in", "out", "region", "mb", "splits / peer"], rows,
                key=2, whole=("group",))
    print_counts({"predicted": events}, cfg.layout.world, console)


def print_counts(ledgers: dict, world: int, console: Console | None = None) -> None:
    """Per-rank op counts of one or more ledgers side by side."""
    ops = [op for op in OPS if any(e.op == op for evs in ledgers.values() for e in evs)]
    rows = []
    for r in range(world):
        row = [str(r)]
        for evs in ledgers.values():
            c = counts(e for e in evs if e.rank == r)
            row += [str(c.get(op, 0)) for op in ops]
        rows.append(row)
    print_table(console or CONSOLE, "collectives per rank per step",
                ["rank", *(f"{name} {op}" for name in ledgers for op in ops)], rows)


def print_result(result: RunResult, run_dir, console: Console | None = None) -> None:
    console = console or CONSOLE
    status = ("PASSED", "green") if result.passed else ("FAILED", "red")
    console.print(Text.assemble(f"{result.experiment} on {result.backend}, world {result.world}: ", status))
    print_table(console, "checks", ["check", "ok", "detail"],
                [[c.name, "yes" if c.passed else Text("NO", style="red"), c.detail] for c in result.checks])
    per_rank = result.per_rank()
    ops = [op for op in OPS if any(op in r["predicted"] or op in r["captured"] for r in per_rank)]
    print_table(console, "collectives per rank per step", ["rank", *(f"{op} pred/capt" for op in ops)],
                [[str(r["rank"]), *(f"{r['predicted'].get(op, 0)}/{r['captured'].get(op, 0)}" for op in ops)]
                 for r in per_rank])
    if result.numerics:
        console.print("numerics: " + ", ".join(f"{k} {v:.3g}" for k, v in result.numerics.items()))
    from .timelines import files_of  # imports torch (the pipeline timeline); layout and the rest need none

    if files := files_of(result):
        console.print(f"timeline: {', '.join(files)} (in the run directory)")
    console.print(f"run directory: {run_dir}")
