"""`meshscope suite`: the seed chapter in one launch: every configuration verified, timed and compared.

One launch of the ranks, one process group, every mesh's groups created once up front. Then:
1. verification: each configuration runs as `meshscope run` runs it (captured ledger vs prediction,
   outputs and gradients vs the unsharded reference, replicas, finite losses);
2. timing, as the seed ("所有配置都运行两轮、顺序相反") but with the statistics made explicit: `rounds`
   rounds with the configuration order reversed in every other round, `iters` timed steps per round
   after `warmup` discarded ones, a barrier before every step; per step the critical rank (max over
   ranks) of host time and, on GPU, CUDA-event time; median, P95, P99, CV and PERF_UNSTABLE;
3. on GPU with `profile`, one torch.profiler trace per rank and configuration and its NCCL kernel
   fingerprint, compared with the kernels the prediction implies;
4. the seed's four parameter-change comparisons: structural delta next to the timing ratio and its
   stability verdict, each figure marked measured or predicted ("哪些结论来自实际运行").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import experiments
from .errors import UsageError
from .events import CommEvent
from .experiments.sizes import check_int
from .profiling import load_fits
from .stats import DEFAULT_CV_THRESHOLD, compare, summarize_table, time_steps
from .verify import build_result


@dataclass(frozen=True)
class Entry:
    """One configuration of the suite."""

    label: str
    experiment: str
    overrides: dict = field(default_factory=dict)


SUITE = (
    Entry("tp_ar_b32", "tp_ar_b32"),
    Entry("tp_ar_b128", "tp_ar_b128"),
    Entry("tp_sp_b128", "tp_sp_b128"),
    Entry("tp_ar_b128_replicated", "tp_ar_b128", {"semantics": "replicated-loss"}),
    Entry("tp_sp_b128_replicated", "tp_sp_b128", {"semantics": "replicated-loss"}),
    Entry("pp_mb1", "pp_mb1"),
    Entry("pp_mb8", "pp_mb8"),
    Entry("pp_1f1b_mb1", "pp_mb1", {"schedule": "1f1b"}),
    Entry("pp_1f1b_mb8", "pp_1f1b_mb8"),
    Entry("ep_balanced", "ep_balanced"),
    Entry("ep_skewed", "ep_skewed"),
    Entry("ep_nograd", "ep_nograd"),
)
"""The seed's seven configurations and the additions (1F1B, pruned dispatch, replicated-loss TP)."""

COMPARISONS = (
    ("tp batch 32 vs 128", "tp_ar_b32", "tp_ar_b128"),
    ("tp all-reduce vs sequence parallel", "tp_ar_b128", "tp_sp_b128"),
    ("pp 1 vs 8 microbatches", "pp_mb1", "pp_mb8"),
    ("ep balanced vs skewed", "ep_balanced", "ep_skewed"),
)
"""The seed's "参数变化带来的证据": (title, config A, config B)."""


@dataclass(frozen=True)
class SuiteOptions:
    configs: tuple[str, ...] = tuple(e.label for e in SUITE)
    """Labels of the configurations to run, in suite order."""
    rounds: int = 2
    """Timing rounds; odd rounds run the configurations in reverse order."""
    iters: int = 20
    """Timed steps per configuration and round."""
    warmup: int = 3
    """Untimed steps before each configuration's timed steps, per round."""
    steps_per_sample: int = 1
    """Back-to-back steps per timed sample (1 = per-step timing)."""
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    """CV above which a series is PERF_UNSTABLE."""
    profile: bool = False
    """Record a torch.profiler trace per rank and configuration (kernel fingerprints on GPU)."""
    profile_steps: int = 5
    """Steps per profiled trace; kernel counts are per step (they must divide evenly)."""
    world: int | None = None
    """Run every configuration on this many ranks instead of its default (e.g. 2 on a 2-GPU host)."""
    sweep: str | None = None
    """A saved `meshscope sweep` (sweep.json): predict each config's communication time from its ledger."""
    cuda_graph: bool = False
    """Time each sample as one replay of a CUDA graph of its steps (`cuda_graph`): the device's steps
    without Python and launch jitter. A configuration that `Experiment.graph_blocker` rules out is
    timed eagerly and its method says why; a capture that fails otherwise ends the run with CUDA's
    reason. With `profile` and `sweep`, the NCCL kernel time is also measured over graph replays."""

    def validate(self) -> None:
        known = {e.label for e in SUITE}
        for label in self.configs:
            if label not in known:
                raise UsageError(f"unknown suite config {label!r}; valid: {', '.join(e.label for e in SUITE)}")
        if not self.configs:
            raise UsageError("--configs selects no configuration")
        for name in ("rounds", "iters", "steps_per_sample", "profile_steps"):
            check_int(name.replace("_", "-"), getattr(self, name))
        if self.sweep is not None:
            if not self.profile:
                raise UsageError("--sweep needs --profile: the measured communication time comes from the profile")
            load_fits(self.sweep)  # a bad file fails here, before any rank starts
        check_int("warmup", self.warmup, minimum=0)
        if not 0 < self.cv_threshold < 10:
            raise UsageError(f"--cv-threshold {self.cv_threshold} must be a fraction such as 0.05")

    def entries(self) -> list[Entry]:
        chosen = set(self.configs)
        return [e for e in SUITE if e.label in chosen]


def resolve(options: SuiteOptions) -> list[tuple[Entry, object, object]]:
    """(entry, experiment, config) per chosen configuration; UsageError on bad input."""
    options.validate()
    out = []
    for entry in options.entries():
        exp = experiments.get(entry.experiment)
        overrides = {**entry.overrides, **({"world": options.world} if options.world else {})}
        out.append((entry, exp, exp.config(overrides)))
    return out


def world_of(options: SuiteOptions) -> int:
    worlds = {exp.layout(cfg).world for _, exp, cfg in resolve(options)}
    if len(worlds) != 1:
        raise UsageError(f"the chosen configurations need different world sizes {sorted(worlds)}; pick one world")
    return worlds.pop()


def run_suite_rank(ctx, options: SuiteOptions) -> dict | None:
    """Everything the suite does on one rank; rank 0 returns the suite document."""
    plan = resolve(options)
    for _, exp, cfg in plan:  # every group of every mesh, once, before any traffic
        ctx.mesh(exp.layout(cfg))
    results = {}
    for i, (entry, exp, cfg) in enumerate(plan):
        ctx.progress(f"verify {entry.label} ({i + 1}/{len(plan)})")
        outs = ctx.gather(exp.run_rank(ctx, cfg))
        if ctx.rank == 0:
            results[entry.label] = {"label": entry.label, **build_result(exp, cfg, ctx.backend, outs),
                                    "losses": {o.rank: o.extra.get("losses") for o in outs}}
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
        results[label]["kernels"] = fp
        for key in ("check", "ops_check"):
            if key in fp:
                results[label]["checks"].append(fp[key])
                results[label]["passed"] = results[label]["passed"] and fp[key]["passed"]
    return {"kind": "suite", "options": options.__dict__ | {"configs": list(options.configs)},
            "timing_method": _common_method(methods), "results": results, "timing": timing,
            "comparisons": comparisons(results, timing)}


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
    from .profiling import load_fits, profile_config

    fits = load_fits(options.sweep)
    out = {}
    for entry, exp, cfg in plan:
        ctx.progress(f"profile {entry.label}: {options.profile_steps} steps")
        section = profile_config(ctx, exp, cfg, entry.label, options.profile_steps, options.warmup, fits,
                                 options.cuda_graph)
        if section is not None:
            out[entry.label] = section
    return out


def _structure(result: dict) -> dict:
    """Structural figures of one configuration's verified run (predicted and captured alike)."""
    events = [CommEvent.from_json(e) for e in result["comm"]["events"]["captured"] if e["rank"] == 0]
    payload = {}
    for e in events:
        key = f"{result.get('axis_labels', {}).get(e.axis, e.axis)} {e.op}"
        payload[key] = max(payload.get(key, 0), e.bytes_in, e.bytes_out)
    return {"max_payload_rank0": payload,
            "counts_rank0": result["comm"]["per_rank"][0]["captured"],
            "tokens_per_expert": result.get("experts", {}).get("tokens_per_expert")}


def comparisons(results: dict, timing: dict) -> list[dict]:
    """The seed's parameter-change evidence: structure (measured in the captured ledger and checked
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
                    results[a]["comm"]["match"] and results[b]["comm"]["match"] else "MISMATCH with prediction",
                    "timing_ratio": verdict.ratio, "timing_verdict": _verdict(verdict),
                    "timing_distinguishable": verdict.distinguishable,
                    "timing_detail": verdict.detail, "timing_source": f"measured: critical-rank {CLOCKS[clock]}"})
    return out


CLOCKS = {"gpu": "GPU time (CUDA events)", "host": "host time"}


def verdict_clock(row: dict) -> str:
    """The clock a configuration's verdicts use: CUDA events on a GPU (they span the sample on the
    device, first kernel to last; the host clock adds the wake-up of the final synchronise, which
    shows on 70 us graph-replayed steps), the host clock on CPU."""
    return "gpu" if "gpu" in row else "host"


def _verdict(c) -> str:
    """PERF_UNSTABLE as the issue defines it (a noisy series, or a difference within the spread); a
    difference beyond the spread of noisy series (the seed's PP effect) says so."""
    if not c.unstable:
        return "stable"
    return "PERF_UNSTABLE, but the [P5, P95] intervals are disjoint" if c.distinguishable else "PERF_UNSTABLE"


def _summary(d: dict):
    from .stats import Summary

    return Summary(**{k: d[k] for k in Summary.__dataclass_fields__})
