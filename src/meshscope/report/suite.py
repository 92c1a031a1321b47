"""Everything the suite shows and leaves behind, rendered from its result document alone.

So that `meshscope report RUN_DIR` re-renders a finished run exactly: the terminal tables (the chapter's:
group layout, payload per collective, per-rank collective and NCCL kernel counts, numerics, the
performance table with CV and PERF_UNSTABLE, the PP timeline, the parameter-change comparisons, one
summary line), ``report.md``, the JSONL records per kind and the PNG figures.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..core.environment import header
from ..core.events import OPS, human_bytes
from ..core.result import SuiteResult
from ..suite.verdicts import CLOCKS, verdict_clock
from .table import make_console, print_table
from .timelines import write_timelines

KERNEL_FAMILIES = ("AllReduce", "AllGather", "ReduceScatter", "SendRecv", "Broadcast")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


# -- tables (shared by the terminal and report.md) -------------------------------------------------
def tables(doc: SuiteResult) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table, in the order the chapter presents them."""
    results, timing = doc.results, doc.timing
    out = []
    layouts = {}
    for label, r in results.items():
        key = (r.world, tuple(sorted((k, v) for k, v in r.config.items() if k in ("tp", "pp", "ep") and v)))
        layouts.setdefault(key, []).append(label)
    rows = []
    for (world, sizes), labels in layouts.items():
        groups, names = {}, results[labels[0]].axis_labels
        for e in results[labels[0]].captured:
            groups.setdefault(names.get(e.axis, e.axis), set()).add(e.group)
        rows.append([", ".join(labels), str(world),
                     "; ".join(f"{axis} {sorted(map(list, gs))}" for axis, gs in sorted(groups.items()))])
    out.append(("group layout (groups that carried traffic)", ["configs", "world", "groups"], rows))

    rows = []
    for label, r in results.items():
        seen = Counter()
        for e in r.captured:
            if e.rank == 0:
                seen[(e.axis, e.op, e.phase, e.bytes_in, e.bytes_out, e.input_splits)] += 1
        for (axis, op, ph, bi, bo, splits), n in seen.items():
            rows.append([label, r.axis_labels.get(axis, axis), op, ph, human_bytes(bi), human_bytes(bo), str(list(splits)) if splits else "", str(n)])
    out.append(("payload per collective, rank 0 (logical bytes, not wire bytes)",
                ["config", "axis", "op", "phase", "in", "out", "splits", "count"], rows))

    ops = [op for op in OPS if any(op in p["captured"] for r in results.values() for p in r.per_rank())]
    rows = []
    for label, r in results.items():
        per_rank = r.per_rank()
        same = all(p["captured"] == per_rank[0]["captured"] for p in per_rank)
        cells = [str(per_rank[0]["captured"].get(op, 0)) for op in ops]
        rows.append([label, *cells, "yes" if same else "no (see result.json)", "yes" if r.match else "NO"])
    out.append(("collectives per rank per step (captured; rank 0)", ["config", *ops, "all ranks equal", "== predicted"], rows))

    if any("check" in (r.kernels or {}) for r in results.values()):
        rows = []
        for label, r in results.items():
            if "check" in (r.kernels or {}):
                m = r.kernels["per_rank"][0]["measured"]
                e = r.kernels["per_rank"][0]["expected"]
                rows.append([label, *(f"{m.get(f, 0)}/{e.get(f, 0)}" for f in KERNEL_FAMILIES),
                             "yes" if r.kernels["check"]["passed"] else "NO"])
        out.append(("NCCL kernels per rank per step, rank 0 (measured/predicted)", ["config", *KERNEL_FAMILIES, "match"], rows))
        pct = lambda x: f"{x:+.0%}" if x is not None else "n/a"  # noqa: E731
        times = {label: c for label, r in results.items() if (c := (r.kernels or {}).get("comm_time"))}
        graph = any("measured_graph_critical_s" in c for c in times.values())
        rows = [[label, _ms(c["predicted_critical_s"]), _ms(c["measured_critical_s"]), pct(c["rel_err"]),
                 *([_ms(c["measured_graph_critical_s"]), pct(c["rel_err_graph"])] if "measured_graph_critical_s" in c
                   else ["n/a", "n/a"] if graph else [])]
                for label, c in times.items()]
        if rows:
            basis = next(iter(times.values())).get("predicted_as", "alpha-beta fits of wall time per call")
            out.append((f"communication time per step, critical rank: predicted from the sweep ({basis.split(' (')[0]}) "
                        "vs measured NCCL kernel time", ["config", "predicted", "measured (eager)", "error",
                                             *(["measured (graph replay)", "error"] if graph else [])], rows))

    rows = [[label, *(f"{r.numerics.get(k, float('nan')):.3g}" for k in ("max_abs_err_output", "max_abs_err_grad")),
             "yes" if r.passed else "NO"] for label, r in results.items()]
    out.append(("numerics vs the unsharded reference (tolerance 2e-5)", ["config", "max abs err output", "max abs err grad", "all checks"], rows))

    gpu = any("gpu" in t for t in timing.values())
    rows = []
    for label, t in sorted(timing.items()):
        h = t["host"]
        cells = [_ms(t["gpu"]["median"]), f"{t['gpu']['cv']:.1%}"] if gpu and "gpu" in t else []
        flag = "PERF_UNSTABLE" if t[verdict_clock(t)]["unstable"] else "stable"
        rows.append([label, *cells, _ms(h["median"]), _ms(h["p95"]), _ms(h["p99"]), f"{h['cv']:.1%}", str(h["n"]), flag])
    head = ["config", *(["critical GPU median", "GPU CV"] if gpu else []), "critical host median", "P95", "P99",
            "host CV", "steps", "verdict"]
    out.append((f"performance, critical rank = max over ranks per step ({doc.timing_method})", head, rows))
    methods = {label: t["method"] for label, t in sorted(timing.items()) if "method" in t}
    if len(set(methods.values())) > 1:
        out.append(("timing method per configuration", ["config", "method"], [[k, v] for k, v in methods.items()]))

    rows = []
    for label, r in results.items():
        tl = r.sections.get("timeline")
        if not tl:
            continue
        spans = tl["ranks"][0]["spans"]
        seq = "  ".join(f"{s['kind']}{s['microbatch']} {s['start_us']:.0f}us" for s in spans)
        rows.append([label, seq, f"{tl['bubble_fraction']:.2f}", f"{tl['bubble_theory']:.2f}"])
    if rows:
        out.append(("PP timeline, rank 0 (start of each F/B)", ["config", "sequence", "bubble measured", "bubble theory"], rows))

    rows = []
    for c in doc.comparisons:
        sa, sb = c["structure_a"], c["structure_b"]
        delta = _delta(sa, sb)
        rows.append([c["title"], delta, c["structure_source"], f"{c['timing_ratio']:.2f}x", c["timing_verdict"], c["timing_source"]])
    if rows:
        out.append(("parameter changes: structure vs timing", ["comparison", "structural delta (B vs A)", "structure from",
                                                                "timing B/A", "timing verdict", "timing from"], rows))
    return out


def _delta(a: dict, b: dict) -> str:
    """What changed from A to B in the ledger of one rank: per-op counts, payload per (axis, op), load."""
    parts = []
    if a.get("tokens_per_expert") != b.get("tokens_per_expert"):
        parts.append(f"tokens per expert {a.get('tokens_per_expert')} -> {b.get('tokens_per_expert')}")
    for op in OPS:
        x, y = a["counts_rank0"].get(op, 0), b["counts_rank0"].get(op, 0)
        if x != y:
            parts.append(f"{op} count {x} -> {y}" + (f" (x{y / x:g})" if x and y else ""))
    for key in sorted(set(a["max_payload_rank0"]) | set(b["max_payload_rank0"])):
        x, y = a["max_payload_rank0"].get(key), b["max_payload_rank0"].get(key)
        if x != y:
            ratio = f" (x{y / x:g})" if x and y else ""
            parts.append(f"{key} {human_bytes(x) if x else 'none'} -> {human_bytes(y) if y else 'none'}{ratio}")
    return "; ".join(parts) or "none"


def print_terminal(doc: SuiteResult, console: Console | None = None) -> None:
    """The suite's tables on the terminal; every table's first column is the configuration, which a
    table too wide for the terminal repeats in each of its parts (`table.print_table`)."""
    console = console or make_console()
    console.print(header(doc.environment))
    for title, head, rows in tables(doc):
        print_table(console, title, head, rows, title_justify="left")
    failed = [(label, c) for label, r in doc.results.items() for c in r.checks if not c.passed]
    for label, c in failed:
        console.print(Text.assemble(("FAILED", "red"), f" {label}: {c.name}: {c.detail}"))
    console.print(doc.summary["line"])


# -- files -----------------------------------------------------------------------------------------
def write_markdown(doc: SuiteResult, path: Path) -> None:
    lines = ["# meshscope suite", "", header(doc.environment), ""]
    for title, head, rows in tables(doc):
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        lines.append("")
    lines += ["## checks", ""]
    for label, r in doc.results.items():
        for c in r.checks:
            lines.append(f"- {label}: {'ok' if c.passed else 'FAILED'} {c.name}: {c.detail}")
    lines += ["", "## summary", "", doc.summary["line"], ""]
    path.write_text("\n".join(lines))


def write_records(doc: SuiteResult, run_dir: Path) -> None:
    """JSONL per kind: training (loss per config, rank, step), communication, timeline, invariants, traces."""
    rec = run_dir / "records"
    rec.mkdir(exist_ok=True)
    with open(rec / "training.jsonl", "w") as f:
        for label, r in doc.results.items():
            for rank, losses in r.sections.get("losses", {}).items():
                for step, loss in enumerate(losses or []):
                    f.write(json.dumps({"config": label, "rank": int(rank), "step": step, "loss": loss}) + "\n")
    with open(rec / "communication.jsonl", "w") as f:
        for label, r in doc.results.items():
            for e in r.captured:
                f.write(json.dumps({"config": label, **e.to_json()}) + "\n")
    with open(rec / "timeline.jsonl", "w") as f:
        for label, r in doc.results.items():
            for p in (r.sections.get("timeline") or {}).get("ranks", []):
                for s in p["spans"]:
                    f.write(json.dumps({"config": label, "rank": p["rank"], **s}) + "\n")
    with open(rec / "invariants.jsonl", "w") as f:
        for label, r in doc.results.items():
            for c in r.checks:
                f.write(json.dumps({"config": label, **c.to_json()}) + "\n")
    with open(rec / "device_traces.jsonl", "w") as f:
        for label, r in doc.results.items():
            for p in (r.kernels or {}).get("per_rank", []):
                f.write(json.dumps({"config": label, **p}) + "\n")


def write_figures(doc: SuiteResult, run_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir = run_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    written = write_timelines(run_dir, doc.results)  # each PP configuration's, named after its label
    # tokens_per_expert lists one row per EP group; the figure shows the first group's experts
    experts = {label: r.sections["experts"]["tokens_per_expert"][0] for label, r in doc.results.items()
               if r.sections.get("experts", {}).get("tokens_per_expert")}
    if experts:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        width = 0.8 / len(experts)
        for i, (label, tokens) in enumerate(experts.items()):
            ax.bar([x + i * width for x in range(len(tokens))], tokens, width, label=label)
        ax.set_xlabel("expert (first EP group)")
        ax.set_ylabel("tokens received per step")
        ax.set_title("expert load")
        ax.legend()
        fig.tight_layout()
        fig.savefig(fig_dir / "expert_load.png", dpi=120)
        plt.close(fig)
        written.append(str(fig_dir / "expert_load.png"))
    timing = doc.timing
    labels = sorted(timing)
    med = [timing[k][verdict_clock(timing[k])]["median"] * 1e3 for k in labels]
    p95 = [timing[k][verdict_clock(timing[k])]["p95"] * 1e3 for k in labels]
    fig, ax = plt.subplots(figsize=(8, 4))
    colors = ["tab:red" if timing[k][verdict_clock(timing[k])]["unstable"] else "tab:blue" for k in labels]
    ax.bar(labels, med, color=colors, yerr=[[0] * len(med), [p - m for p, m in zip(p95, med)]], capsize=3)
    clocks = {verdict_clock(timing[k]) for k in labels}
    ax.set_ylabel(f"critical-rank {' / '.join(CLOCKS[c] for c in sorted(clocks))} per step (ms)")
    ax.set_title("median with P95 whisker; red = PERF_UNSTABLE")
    ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(fig_dir / "performance.png", dpi=120)
    plt.close(fig)
    written.append(str(fig_dir / "performance.png"))
    return written


def write_all(doc: SuiteResult, run_dir: Path) -> None:
    """Every file of a suite run directory that is derived from result.json."""
    write_records(doc, run_dir)
    write_markdown(doc, run_dir / "report.md")
    write_figures(doc, run_dir)
