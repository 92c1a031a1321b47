"""`meshscope suite`: the chapter's configurations (docs/chapter.md) in one launch: verified, timed, compared.

One launch of the ranks, one process group, every mesh's groups created once up front. Then:
1. verification: each configuration runs as `meshscope run` runs it (captured ledger vs prediction,
   outputs and gradients vs the unsharded reference, replicas, finite losses);
2. timing, as in the chapter (every configuration run twice, the second time in reverse order) but
   with the statistics made explicit: `rounds` rounds with the configuration order reversed in every
   other round, `iters` timed steps per round after `warmup` discarded ones, a barrier before every
   step; per step the critical rank (max over ranks) of host time and, on GPU, CUDA-event time;
   median, P95, P99, CV and PERF_UNSTABLE;
3. on GPU with `profile`, one torch.profiler trace per rank and configuration and its NCCL kernel
   fingerprint, compared with the kernels the prediction implies;
4. the chapter's four parameter-change comparisons: structural delta next to the timing ratio and its
   stability verdict, each figure marked measured or predicted (docs/chapter.md, Q28).
"""

from __future__ import annotations

from ..core.environment import environment
from ..core.events import counts
from ..core.result import RunResult, SuiteResult
from ..timing.profiling import load_fits
from ..timing.sampler import time_steps
from ..timing.statistics import compare, summarize_table
from ..verify.result import add_kernels, build_result
from .plan import COMPARISONS, SuiteOptions, resolve
from .verdicts import CLOCKS, _summary, _verdict, summary, verdict_clock


def run_suite_rank(ctx, options: SuiteOptions) -> SuiteResult | None:
    """Everything the suite does on one rank; rank 0 returns the suite document."""
    plan = resolve(options)
    for _, exp, cfg in plan:  # every group of every mesh, once, before any traffic
        ctx.mesh(cfg.layout)
    results = {}
    for i, (entry, exp, cfg) in enumerate(plan):
        ctx.progress(f"verify {entry.label} ({i + 1}/{len(plan)})")
        outs = ctx.gather(exp.run_rank(ctx, cfg))
        if ctx.rank == 0:
            result = build_result(exp, cfg, ctx.backend, outs, label=entry.label)
            result.sections["losses"] = {o.rank: o.extra.get("losses") for o in outs}
            results[entry.label] = result
    host: dict[str, list[list[float]]] = {e.label: [] for e, _, _ in plan}
    gpu: dict[str, list[list[float]]] = {e.label: [] for e, _, _ in plan}
    methods: dict[str, str] = {}
    for rnd in range(options.rounds):
        order = plan if rnd % 2 == 0 else plan[::-1]
        for j, (entry, exp, cfg) in enumerate(order):
            ctx.progress(f"time {entry.label}: round {rnd + 1}/{options.rounds}, config {j + 1}/{len(plan)}, "
                         f"{options.iters} steps")
            blocker = exp.graph_blocker(cfg) if options.cuda_graph else None
            times = time_steps(exp.step_fn(ctx, cfg), options.iters, warmup=options.warmup, device=ctx.device,
                               steps_per_sample=options.steps_per_sample,
                               cuda_graph=options.cuda_graph and blocker is None)
            methods[entry.label] = times.method + (f"; eager, not a CUDA graph: {blocker}" if blocker else "")
            gathered = ctx.gather((times.host_s, times.gpu_s))
            if ctx.rank == 0:
                _append_round(host[entry.label], [h for h, _ in gathered])
                if gathered[0][1] is not None:
                    _append_round(gpu[entry.label], [g for _, g in gathered])
    kernels = _profile(ctx, plan, options) if options.profile else {}
    if ctx.rank != 0:
        return None
    timing = {}
    for entry, _, _ in plan:
        row = {"method": methods[entry.label],
               "host": summarize_table(host[entry.label], options.cv_threshold).to_json(),
               "host_steps": host[entry.label]}
        if gpu[entry.label]:
            row["gpu"] = summarize_table(gpu[entry.label], options.cv_threshold).to_json()
            row["gpu_steps"] = gpu[entry.label]
        timing[entry.label] = row
    for label, fp in kernels.items():
        add_kernels(results[label], fp)
    return SuiteResult(options=options.__dict__ | {"configs": list(options.configs)}, results=results,
                       timing=timing, comparisons=comparisons(results, timing), timing_method=_common_method(methods))


def _common_method(methods: dict[str, str]) -> str:
    """The one timing method of every configuration, or a pointer to each one's when they differ."""
    distinct = set(methods.values())
    return distinct.pop() if len(distinct) == 1 else "differs per configuration: see timing.<config>.method"


def _append_round(table: list[list[float]], per_rank: list[list[float]]) -> None:
    """Extend each rank's series with this round's steps (step k of a round is the same on all ranks)."""
    if not table:
        table.extend([] for _ in per_rank)
    for series, new in zip(table, per_rank):
        series.extend(new)


def _profile(ctx, plan, options) -> dict:
    from ..timing.profiling import profile_config

    fits = load_fits(options.sweep)
    out = {}
    for entry, exp, cfg in plan:
        ctx.progress(f"profile {entry.label}: {options.profile_steps} steps")
        section = profile_config(ctx, exp, cfg, entry.label, options.profile_steps, options.warmup, fits,
                                 options.cuda_graph)
        if section is not None:
            out[entry.label] = section
    return out


def _structure(result: RunResult) -> dict:
    """Structural figures of one configuration's verified run (predicted and captured alike)."""
    events = [e for e in result.captured if e.rank == 0]
    payload = {}
    for e in events:
        key = f"{result.axis_labels.get(e.axis, e.axis)} {e.op}"
        payload[key] = max(payload.get(key, 0), e.bytes_in, e.bytes_out)
    return {"max_payload_rank0": payload, "counts_rank0": counts(events),
            "tokens_per_expert": result.sections.get("experts", {}).get("tokens_per_expert")}


def comparisons(results: dict[str, RunResult], timing: dict) -> list[dict]:
    """The chapter's parameter-change evidence: structure (measured in the captured ledger and checked
    against the prediction) next to timing (measured) and its stability verdict."""
    out = []
    for title, a, b in COMPARISONS:
        if a not in results or b not in results:
            continue
        clock = verdict_clock(timing[a])
        verdict = compare(_summary(timing[a][clock]), _summary(timing[b][clock]))
        out.append({"title": title, "a": a, "b": b, "structure_a": _structure(results[a]),
                    "structure_b": _structure(results[b]),
                    "structure_source": "measured: captured ledger, equal to the prediction" if
                    results[a].match and results[b].match else "MISMATCH with prediction",
                    "timing_ratio": verdict.ratio, "timing_verdict": _verdict(verdict),
                    "timing_distinguishable": verdict.distinguishable,
                    "timing_detail": verdict.detail, "timing_source": f"measured: critical-rank {CLOCKS[clock]}"})
    return out


def suite_program(ctx, spec: dict) -> list[dict] | None:
    """The suite's rank program (`run.worker.Program`): rank 0 returns the suite document, with the
    machine it ran on and its summary line."""
    options = SuiteOptions(**{**spec["suite"], "configs": tuple(spec["suite"]["configs"])})
    doc = run_suite_rank(ctx, options)
    if ctx.rank != 0:
        return None
    doc.environment = environment(ctx.backend, ctx.world)
    doc.summary = summary(doc)
    return [doc.to_json()]
