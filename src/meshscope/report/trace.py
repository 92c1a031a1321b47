"""What a traced job shows: the layout its groups imply, per step x axis x op the calls of each rank
(count, logical bytes in and out, phase), the modules that moved the most bytes, where the time went
(`report.time`), and the checks; ``report.md``, a Chrome trace (``trace.json``: one row per rank, one
slice per call from issue to completion and one per wait, on the common clock) and PNGs of the bytes
per axis per step, per module, and of the waits each rank caused."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from rich.console import Console

from ..core.events import human_bytes
from ..core.result import CheckStatus
from ..core.trace_result import Outcome, TraceResult
from .table import make_console, print_table
from .time import caused_figure, shifts, time_lines, time_rows, wait_slices

TOP_MODULES = 10

ASSUMED = "*"
"""Marks a figure that holds assumed values (`CommEvent.assumed`: a fake world's all-to-all sizes, the bytes
of object collectives sized from objects of ranks it had not traced, sizes computed from a value
``--fake-tensors`` answered without data)."""

LEGEND = (f"{ASSUMED} assumed: a fake world cannot know what its peers send: what an all-to-all receives (nor uneven "
          "splits computed from it), the objects of an object collective from ranks not traced before (this rank's "
          "own stood in), nor, with --fake-tensors, a size computed from a value read without data (the ledger's "
          "`assumed` field names them)")
"""The legend under a table with an `ASSUMED` mark."""


def step_rows(result: TraceResult) -> list[list[str]]:
    """step, axis, op, phase, count, bytes in, bytes out, ranks: rank 0's figures (`ASSUMED` on those that hold
    assumed bytes), and which ranks issued the same."""
    per_rank: dict[int, dict] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    assumed: dict[tuple, set] = defaultdict(set)
    for e in result.events:
        key = (e.step or 0, e.axis, e.op, e.phase)
        slot = per_rank[e.rank][key]
        slot[0] += 1
        slot[1] += e.bytes_in
        slot[2] += e.bytes_out
        assumed[key].update(e.assumed)
    if not per_rank:
        return []
    first = min(per_rank)
    rows = []
    for key, (n, b_in, b_out) in sorted(per_rank[first].items()):
        alike = [r for r, d in sorted(per_rank.items()) if d.get(key) == [n, b_in, b_out]]
        ranks = "all" if len(alike) == len(per_rank) else ",".join(map(str, alike))
        step, axis, op, phase = key
        mark = {f: ASSUMED if f in assumed[key] else "" for f in ("bytes_in", "bytes_out")}
        rows.append([str(step), axis, op, phase, str(n), human_bytes(b_in) + mark["bytes_in"],
                     human_bytes(b_out) + mark["bytes_out"], ranks])
    return rows


def has_assumed(result: TraceResult) -> bool:
    return any(e.assumed for e in result.events)


def top_modules(result: TraceResult) -> list[tuple[str, int, int]]:
    """(module, calls, logical bytes) of the `TOP_MODULES` modules that moved the most, all ranks."""
    total: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in result.events:
        slot = total[e.region or f"({e.phase}, no module)"]
        slot[0] += 1
        slot[1] += max(e.bytes_in, e.bytes_out)
    return [(name, n, b) for name, (n, b) in sorted(total.items(), key=lambda kv: -kv[1][1])[:TOP_MODULES]]


def module_rows(result: TraceResult) -> list[list[str]]:
    return [[name, str(n), human_bytes(b)] for name, n, b in top_modules(result)]


LAYOUT_GROUP_MEMBERS = 8
"""Members of an axis's example group shown before ``...`` (every group is in result.json)."""

LAYOUT_LINES = 30
"""The most lines the layout block takes, at any world."""

STATUS_WORDS = {CheckStatus.PASSED: "yes", CheckStatus.FAILED: "NO", CheckStatus.NOT_CHECKED: "not checked"}


def layout_lines(result: TraceResult) -> list[str]:
    """The layout and, per axis, how many groups of what size with one example: one line per axis
    whatever the world (1,024 ranks make hundreds of groups; result.json keeps them all)."""
    lines = [f"layout: {result.layout['text']}"]
    for axis, groups in result.axes.items():
        sizes = sorted({len(g) for g in groups})
        size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        first = groups[0]
        shown = first if len(first) <= LAYOUT_GROUP_MEMBERS else [*first[:LAYOUT_GROUP_MEMBERS - 1], "...", first[-1]]
        example = "[" + ", ".join(map(str, shown)) + "]"
        lines.append(f"  {axis}: {len(groups)} group{'s' if len(groups) != 1 else ''} of {size}, e.g. {example}")
    if len(lines) > LAYOUT_LINES:
        lines = [*lines[:LAYOUT_LINES - 1], f"  ... and {len(lines) - LAYOUT_LINES + 1} more axes (result.json)"]
    return lines


def check_rows(result: TraceResult) -> list[list[str]]:
    return [[c.name, STATUS_WORDS[c.status], c.detail] for c in result.checks]


def verdict_lines(result: TraceResult) -> list[str]:
    """The last lines of the console: the outcome in one line, the checks that did not run, and for a job
    that did not pass what its explaining rank printed last (its exit code and where its log is)."""
    ranks = len(result.ranks)
    head = result.outcome.value.upper()
    line = f"{head}: {len(result.events)} calls on {ranks} rank{'s' if ranks != 1 else ''}"
    if result.outcome == Outcome.EMPTY:
        line += ": every rank ended without issuing a collective, so there is nothing to check"
    elif result.error is not None:
        line += f"; {result.error.line()}"
    elif result.outcome == Outcome.FAILED:
        failed = [c.name for c in result.checks if c.failed]
        line += f"; check{'s' if len(failed) != 1 else ''} failed: {', '.join(failed)}"
    skipped = [c.name for c in result.checks if c.status == CheckStatus.NOT_CHECKED]
    if skipped and result.events:
        line += f" (not checked: {', '.join(skipped)})"
    lines = [line]
    said = result.last_lines
    if said is not None:
        code = f"exited with code {said.exit_code}" if said.exit_code is not None else "left no exit code"
        lines.append(f"rank {said.rank} {code}; the last {len(said.lines)} of the {said.total} lines it printed "
                     f"({said.log}):")
        lines += [f"  | {text}" for text in said.lines]
    return lines


def print_trace(result: TraceResult, console: Console | None = None) -> None:
    console = console or make_console()
    for line in layout_lines(result):
        console.print(line, highlight=False)
    first = min((r.rank for r in result.ranks), default=0)
    print_table(console, f"calls per step (rank {first}; ranks: those that issued the same)",
                ["step", "axis", "op", "phase", "count", "in", "out", "ranks"], step_rows(result), key=4)
    if has_assumed(result):
        console.print(LEGEND)
    if result.events:
        print_table(console, "top modules by bytes (all ranks)", ["module", "calls", "bytes"], module_rows(result))
    head, rows = time_rows(result)
    if rows:
        print_table(console, "time per rank and steady step", head, rows)
    for line in time_lines(result):
        console.print(line, highlight=False)
    print_table(console, "checks", ["check", "ok", "detail"], check_rows(result))
    for r in result.ranks:
        if not r.ended:
            console.print(f"rank {r.rank}: {r.status}: {r.error}", highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    for line in verdict_lines(result):
        console.print(line, highlight=False)


def chrome_trace(result: TraceResult) -> dict:
    """Chrome trace event format on the common clock (rank 0's; `report.time.shifts`): pid = rank, one
    complete slice per call from its issue to its completion (where unseen: to the next call on its
    group), and one per wait (`report.time.wait_slices`)."""
    shift = shifts(result)
    events = []
    for e in result.events:
        if e.t_issue is None:
            continue
        end = e.t_complete if e.t_complete is not None else e.t_done
        dur = max((end or e.t_issue) - e.t_issue, 1e-6)
        events.append({"name": f"{e.op} {e.axis}", "cat": e.phase, "ph": "X", "pid": e.rank, "tid": e.axis,
                       "ts": (e.t_issue + shift.get(e.rank, 0.0)) * 1e6, "dur": dur * 1e6,
                       "args": {"group": list(e.group), "bytes_in": e.bytes_in, "bytes_out": e.bytes_out,
                                "step": e.step, "region": e.region, "dtype": e.dtype}})
    return {"traceEvents": events + wait_slices(result, shift), "displayTimeUnit": "ms"}


def write_files(result: TraceResult, run_dir: Path, figures: bool) -> list[str]:
    """report.md and trace.json; with `figures`, figures/ too (bytes per axis and per module, waits caused).

    `meshscope trace` leaves the figures to `meshscope report DIR`: drawing them cost 0.9 s of a trace
    (matplotlib's import and the bytes chart; `report/trace.py` at 41b9273, on the project's 2-core box),
    as much as a small job's whole run."""
    run_dir = Path(run_dir)
    (run_dir / "trace.json").write_text(json.dumps(chrome_trace(result)))
    lines = ["# meshscope trace", "", f"command: `{' '.join(result.command)}`", "",
             *layout_lines(result), ""]
    for title, head, rows in (("calls per step", ["step", "axis", "op", "phase", "count", "in", "out", "ranks"],
                               step_rows(result)),
                              ("top modules by bytes", ["module", "calls", "bytes"], module_rows(result)),
                              ("checks", ["check", "ok", "detail"], check_rows(result))):
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows] + [""]
        if title == "calls per step" and has_assumed(result):
            lines += [LEGEND.replace(ASSUMED, "\\" + ASSUMED, 1), ""]
        if title == "top modules by bytes":
            lines += _time_md(result)
    lines += [f"note: {n}" for n in result.notes] + ["", *verdict_lines(result)]
    (run_dir / "report.md").write_text("\n".join(lines) + "\n")
    written = [str(run_dir / "report.md"), str(run_dir / "trace.json")]
    if not figures:
        return written
    if result.events:
        written.append(_bytes_figure(result, run_dir / "figures" / "bytes_per_axis.png"))
        written.append(_modules_figure(result, run_dir / "figures" / "bytes_per_module.png"))
    if caused := caused_figure(result, run_dir / "figures" / "waits_caused.png"):
        written.append(caused)
    return written


def _time_md(result: TraceResult) -> list[str]:
    """report.md's time section (none for a trace without one)."""
    if result.time is None:
        return []
    lines = ["## time", ""]
    head, rows = time_rows(result)
    if rows:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows] + [""]
    return lines + time_lines(result) + [""]


def _md_cell(text: str) -> str:
    """A table cell in markdown: its bars and `ASSUMED` marks escaped."""
    return text.replace("|", "\\|").replace(ASSUMED, "\\" + ASSUMED)


def _modules_figure(result: TraceResult, path: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = top_modules(result)[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(rows) + 1.2))
    ax.barh([name for name, _, _ in rows], [b / 2**20 for _, _, b in rows])
    ax.set_xlabel("MiB moved, all ranks, all steps")
    ax.set_title(f"top {len(rows)} modules by logical bytes")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def bytes_figure(result: TraceResult):
    """Rank 0's logical bytes per axis per step, stacked: one colour per axis (tab20's 20 colours, so a
    Megatron job's 16 axes stay apart) and the legend in a column of its own beside the plot, inside
    the image whatever the number of axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rank = min(e.rank for e in result.events)
    by: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for e in result.events:
        if e.rank == rank:
            by[e.axis][e.step or 0] += max(e.bytes_in, e.bytes_out)
    steps = sorted({s for d in by.values() for s in d})
    colours = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(8.5, 3.5), layout="constrained")
    bottom = [0] * len(steps)
    for i, (axis, d) in enumerate(sorted(by.items())):
        vals = [d.get(s, 0) / 2**20 for s in steps]
        ax.bar([str(s) for s in steps], vals, bottom=bottom, label=axis, color=colours[i % len(colours)])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xlabel("step")
    ax.set_ylabel(f"MiB moved by rank {rank}")
    ax.set_title("logical bytes per axis per step")
    fig.legend(loc="outside right upper", fontsize="small", ncols=1 + len(by) // 12)
    return fig


def _bytes_figure(result: TraceResult, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig = bytes_figure(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
