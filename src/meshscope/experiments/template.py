"""TODO docstring (meshscope.experiments.template)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace

from ..core.errors import UsageError
from ..core.events import CommEvent
from ..core.result import Check


@dataclass
class RankOutput:
    """What one rank reports after running an experiment."""

    rank: int
    events: list[CommEvent]
    """Captured collectives of one training step."""
    checks: list[Check] = field(default_factory=list)
    """Rank-local checks; a check passes overall only if it passes on every rank."""
    numerics: dict[str, float] = field(default_factory=dict)
    """Max abs errors by name (max_abs_err_output, max_abs_err_grad, ...); maxed over ranks."""
    replicas: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    """name -> (group ranks, digest of the state that must be identical across that group)."""
    extra: dict = field(default_factory=dict)
    """Mode-specific per-rank data for `summarize`."""


class Experiment:
    """Base class of a parallel mode's experiment. Subclasses set `Config` and implement the hooks."""

    Config: type
    """Frozen dataclass of the experiment's parameters; field names are the CLI override names."""
    faults: dict[str, dict] = {}
    """Injectable fault kind (`faults.KINDS`) -> the config overrides that plant it."""

    def __init__(self, name: str, preset: dict, description: str):
        self.name, self.preset, self.description = name, preset, description

    def config(self, overrides: dict):
        """Preset + overrides -> validated Config. Unknown overrides are a `UsageError`."""
        names = {f.name for f in fields(self.Config)}
        unknown = sorted(k for k in overrides if k not in names)
        if unknown:
            from ..core.overrides import CLI_DESTS

            flags = sorted(n for n in names if n in CLI_DESTS)
            raise UsageError(
                f"--{unknown[0].replace('_', '-')} does not apply to {self.name}; "
                f"it takes: {', '.join('--' + n.replace('_', '-') for n in flags)}"
            )
        cfg = replace(self.Config(**self.preset), **overrides)
        self.validate(cfg)
        return cfg

    def changed(self, cfg) -> list[str]:
        """The options in which `cfg` differs from this preset, as ``--name value`` (the description
        speaks of the preset only)."""
        preset = self.config({})  # validated, so sizes derived from others compare like for like
        out = []
        for f in fields(cfg):
            value, flag = getattr(cfg, f.name), f.name.replace("_", "-")
            if value != getattr(preset, f.name):  # switches as typed: --moe / --no-moe
                out.append((f"--{flag}" if value else f"--no-{flag}") if isinstance(value, bool) else f"--{flag} {value}")
        return out

    def label(self, overrides: dict) -> str:
        """The name a run under `overrides` gives its files (``figures/LABEL.timeline.png``): the
        experiment's, plus each given option that differs from the preset, as typed
        (``pp_mb1-schedule-1f1b``), so that runs of one experiment under different options do not
        take each other's names. Only the options given count, not the sizes derived from them
        (`changed` lists those too), so that the name says what was asked."""
        preset = self.config({})
        parts = [self.name]
        for f in fields(preset):
            value = overrides.get(f.name, getattr(preset, f.name))
            if value != getattr(preset, f.name):
                flag = f.name.replace("_", "-")
                parts.append((flag if value else f"no-{flag}") if isinstance(value, bool) else f"{flag}-{value}")
        return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))

    def validate(self, cfg) -> None:
        """Raise `UsageError` for inconsistent parameters."""


    def predict(self, cfg) -> list[CommEvent]:
        raise NotImplementedError

    def run_rank(self, ctx, cfg) -> RankOutput:
        raise NotImplementedError

    def summarize(self, cfg, outputs: list[RankOutput], label: str) -> dict:
        """Mode-specific sections of the result. `label` is the name the run's files take: the
        suite configuration's, or `label` of the options a run was given."""
        return {}

    def step_fn(self, ctx, cfg):
        """One training step on this rank as a zero-argument callable, for timing and profiling:
        forward, backward, gradient sync and SGD, exactly as `run_rank` trains, without its checks."""
        raise NotImplementedError(f"{self.name} cannot be timed")

    def has_experts(self, cfg) -> bool:
        """Whether the model has MoE experts, i.e. uses the expert axes (etp, ep, edp) at all."""
        return False

    def graph_blocker(self, cfg) -> str | None:
        """Why `step_fn` cannot be replayed as a CUDA graph (`cuda_graph`), or None when it can: its
        step reads no device value on the host and keeps its shapes and splits from step to step."""
        return None
