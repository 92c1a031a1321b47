"""Terminal rendering of layouts, predictions and results (rich tables on stdout)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..core.events import OPS, counts, human_bytes
from ..core.mesh import COORD_AXES, GROUP_NAMES, Layout
from ..core.result import RunResult

MAX_ROWS = 64
"""Rows of the rank table printed before eliding (the JSON has all)."""

console = Console(highlight=False)


def print_layout(layout: Layout) -> None:
    sizes = layout.sizes
    console.print(f"world {layout.world}, order {layout.order} (leftmost fastest): "
                  + ", ".join(f"{a} {sizes[a]}" for a in sizes))
    shown = [a for a in COORD_AXES if sizes[a] > 1] or ["tp"]
    table = Table("rank", *shown, title="rank coordinates")
    for r in range(min(layout.world, MAX_ROWS)):
        c = layout.coords(r)
        table.add_row(str(r), *(str(c[a]) for a in shown))
    console.print(table)
    if layout.world > MAX_ROWS:
        console.print(f"... {layout.world - MAX_ROWS} more ranks (use --json for all)")
    dense = [a for a in ("tp", "cp", "dp", "pp") if sizes[a] > 1]
    if len(dense) == 2 and layout.world <= MAX_ROWS:
        fast, slow = sorted(dense, key=lambda a: layout.groups(a)[0][1] - layout.groups(a)[0][0])
        grid = Table("", *(f"{fast}_rank={i}" for i in range(sizes[fast])), title=f"{slow} x {fast} matrix")
        for row in layout.groups(fast):
            grid.add_row(f"{slow}_rank={layout.coords(row[0])[slow]}", *(f"rank{r}" for r in row))
        console.print(grid)
    for name in GROUP_NAMES:
        groups = layout.groups(name)
        if len(groups[0]) < 2:
            continue
        canon = layout.canonical(name)
        alias = f" (same as {canon})" if canon != name else ""
        text = ", ".join(str(g) for g in groups[:16]) + (f", ... ({len(groups)} groups)" if len(groups) > 16 else "")
        console.print(f"{name:>6} groups{alias}: {text}")
    console.print(f"creation order: {len(layout.creation_order())} new_group calls, identical on every rank")


def print_prediction(exp, cfg, events) -> None:
    changed = exp.changed(cfg)
    console.print(f"{exp.name}: {exp.description}" + (f"; changed: {', '.join(changed)}" if changed else ""))
    world = cfg.layout.world
    table = Table("seq", "op", "axis", "group", "phase", "region", "mb", "in", "out", "splits / peer",
                  title="predicted collectives per step, rank 0 (--json for every rank)")
    for e in sorted((e for e in events if e.rank == 0), key=lambda e: (e.axis, e.seq)):
        extra = (f"{list(e.input_splits)} -> {list(e.output_splits)}" if e.input_splits is not None
                 else (f"peer {e.peer}" if e.peer is not None else ""))
        table.add_row(str(e.seq), e.op, e.axis, str(list(e.group)), e.phase, e.region,
                      "" if e.microbatch is None else str(e.microbatch), human_bytes(e.bytes_in),
                      human_bytes(e.bytes_out), extra)
    console.print(table)
    print_counts({"predicted": events}, world)


def print_counts(ledgers: dict, world: int) -> None:
    """Per-rank op counts of one or more ledgers side by side."""
    ops = [op for op in OPS if any(e.op == op for evs in ledgers.values() for e in evs)]
    table = Table("rank", *(f"{name} {op}" for name in ledgers for op in ops), title="collectives per rank per step")
    for r in range(world):
        row = []
        for evs in ledgers.values():
            c = counts(e for e in evs if e.rank == r)
            row += [str(c.get(op, 0)) for op in ops]
        table.add_row(str(r), *row)
    console.print(table)


def print_result(result: RunResult, run_dir) -> None:
    status = "[green]PASSED[/]" if result.passed else "[red]FAILED[/]"
    console.print(f"{result.experiment} on {result.backend}, world {result.world}: {status}")
    table = Table("check", "ok", "detail", title="checks")
    for c in result.checks:
        table.add_row(c.name, "yes" if c.passed else "[red]NO[/]", c.detail)
    console.print(table)
    per_rank = result.per_rank()
    ops = [op for op in OPS if any(op in r["predicted"] or op in r["captured"] for r in per_rank)]
    table = Table("rank", *(f"{op} pred/capt" for op in ops), title="collectives per rank per step")
    for r in per_rank:
        table.add_row(str(r["rank"]), *(f"{r['predicted'].get(op, 0)}/{r['captured'].get(op, 0)}" for op in ops))
    console.print(table)
    if result.numerics:
        console.print("numerics: " + ", ".join(f"{k} {v:.3g}" for k, v in result.numerics.items()))
    console.print(f"run directory: {run_dir}")
