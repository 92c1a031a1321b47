"""What the suite runs: its configurations (the chapter's seven plus 1F1B, pruned dispatch and
replicated-loss TP), the four parameter-change comparisons, and the options of one suite launch."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import experiments
from ..core.errors import UsageError
from ..core.sizes import check_int
from ..timing.profiling import load_fits
from ..timing.statistics import DEFAULT_CV_THRESHOLD


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
"""The chapter's seven configurations and the additions (1F1B, pruned dispatch, replicated-loss TP)."""

COMPARISONS = (
    ("tp batch 32 vs 128", "tp_ar_b32", "tp_ar_b128"),
    ("tp all-reduce vs sequence parallel", "tp_ar_b128", "tp_sp_b128"),
    ("pp 1 vs 8 microbatches", "pp_mb1", "pp_mb8"),
    ("ep balanced vs skewed", "ep_balanced", "ep_skewed"),
)
"""The chapter's evidence from parameter changes (docs/chapter.md Q8, Q18, Q26): (title, config A, config B)."""


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


def world_of(options: SuiteOptions, plan: list | None = None) -> int:
    """The one world size of the chosen configurations (`plan`: their `resolve`d entries)."""
    worlds = {cfg.layout.world for _, _, cfg in (plan if plan is not None else resolve(options))}
    if len(worlds) != 1:
        raise UsageError(f"the chosen configurations need different world sizes {sorted(worlds)}; pick one world")
    return worlds.pop()
