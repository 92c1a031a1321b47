"""Named experiments: the registry and the contract each experiment module fulfils.

An experiment module in this package defines an `Experiment` subclass and registers one or more
named presets with `register`. The registry imports every module of the package on first use, so a
new parallel mode adds a file here and nothing else.

Contract (all pure Python except `run_rank`):
  config(overrides)   -> a frozen Config dataclass (validated; `UsageError` on bad input)
  layout(cfg)         -> the mesh `Layout` it runs on
  predict(cfg)        -> every CommEvent every rank must issue in one training step
  run_rank(ctx, cfg)  -> this rank's `RankOutput` (captured events of one step, numerics, checks)
  summarize(cfg, outs)-> mode-specific sections of result.json (e.g. ``experts``, ``timeline``)
  step_fn(ctx, cfg)   -> one training step as a callable (the suite times and profiles it)
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, fields, replace

from ..errors import UsageError
from ..events import CommEvent
from ..mesh import Layout


@dataclass
class Check:
    """One verified invariant: its name, whether it held, and the figure behind it."""

    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict:
        return {"name": self.name, "passed": bool(self.passed), "detail": self.detail}


def bound(name: str, value: float, limit: float, what: str = "max abs err") -> Check:
    """A check that `value` is finite and at most `limit`."""
    ok = value == value and value <= limit  # NaN fails
    return Check(name, ok, f"{what} {value:.3g} (limit {limit:.0e})")


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
            from ..overrides import CLI_DESTS

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

    def validate(self, cfg) -> None:
        """Raise `UsageError` for inconsistent parameters."""

    def layout(self, cfg) -> Layout:
        raise NotImplementedError

    def predict(self, cfg) -> list[CommEvent]:
        raise NotImplementedError

    def run_rank(self, ctx, cfg) -> RankOutput:
        raise NotImplementedError

    def summarize(self, cfg, outputs: list[RankOutput]) -> dict:
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


_REGISTRY: dict[str, Experiment] = {}
_LOADED = False


def register(cls, name: str, description: str, **preset) -> None:
    """Register a named preset of an Experiment subclass."""
    if name in _REGISTRY:
        raise ValueError(f"experiment {name!r} registered twice")
    _REGISTRY[name] = cls(name, preset, description)


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for mod in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{mod.name}")


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def get(name: str) -> Experiment:
    _load()
    if name not in _REGISTRY:
        raise UsageError(f"unknown experiment {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]
