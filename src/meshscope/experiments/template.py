"""The experiment template every parallel mode fills in.

`Experiment` is the contract (config, predict, run_rank, summarize, step_fn) that the registry,
the worker, the suite and the doctor rely on. `TrainedExperiment` is the one run loop of every
trained mode: it drives a per-rank `RankTrainer` through ``cfg.steps`` SGD steps, captures step 0
(forward, backward and every gradient sync, nothing else), compares every step with the unsharded
reference, requires finite losses and gathers the worst errors into the numerics, so that TP, PP,
EP and the N-D composition differ only in their model, their reference and their own checks.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field, fields, replace

from ..capture.recorder import Capture
from ..core.errors import UsageError
from ..core.events import CommEvent
from ..core.result import Check
from .numerics import Worst, finite


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


class RankTrainer:
    """One rank's side of a trained experiment: its shard of the model, its slice of the unsharded
    reference, and the checks only its mode knows. `TrainedExperiment.run_rank` calls, per step,
    `prepare`, `train` (captured at step 0) and `compare`; then `finish`."""

    def prepare(self, step: int) -> None:
        """Before the step, outside the capture (e.g. a barrier that gives every rank time zero)."""

    def train(self, step: int) -> float | None:
        """One training step, exactly what step 0 captures: forward, backward and the gradient syncs.
        Returns this rank's loss, None on a rank that holds none (an inner pipeline stage)."""
        raise NotImplementedError

    def compare(self, step: int, worst: Worst) -> None:
        """The step's outputs and gradients against the unsharded reference, then SGD on both."""
        raise NotImplementedError

    def finish(self, worst: Worst) -> list[Check]:
        """After the last step: the final weights against the reference, and the mode's checks."""
        raise NotImplementedError

    def replicas(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """State that must be bit-identical across a group: name -> (group ranks, digest)."""
        return {}

    def extra(self) -> dict:
        """Mode-specific per-rank data for `Experiment.summarize`."""
        return {}


class TrainedExperiment(Experiment):
    """An experiment that trains a sharded model against its unsharded reference (`RankTrainer`)."""

    def trainer(self, ctx, cfg) -> RankTrainer:
        raise NotImplementedError

    def run_rank(self, ctx, cfg) -> RankOutput:
        trainer = self.trainer(ctx, cfg)
        worst, losses, events = Worst(), [], []
        for step in range(cfg.steps):
            trainer.prepare(step)
            with Capture() if step == 0 else contextlib.nullcontext() as capture:
                loss = trainer.train(step)
            if step == 0:
                events = capture.events
            if loss is not None:
                losses.append(loss)
            trainer.compare(step, worst)
        checks = trainer.finish(worst)
        if losses:
            checks.append(Check("losses finite", all(map(finite, losses)), f"{len(losses)} losses, last {losses[-1]:.6g}"))
        return RankOutput(ctx.rank, events, checks=checks, numerics=worst.numerics(), replicas=trainer.replicas(),
                          extra=trainer.extra() | {"losses": losses})

