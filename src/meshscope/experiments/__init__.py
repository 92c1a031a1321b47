"""Named experiments: the registry, one package per parallel mode.

Each mode is a package here (``tp``, ``pp``, ``ep``, ``nd``, ``collectives``) holding its ``config``
(a frozen dataclass whose fields are the CLI override names and whose ``layout`` is the mesh it runs
on), its ``predict`` (the ledger from `predict.edges`), its unsharded ``reference`` and its
``experiment`` module, which defines an `template.Experiment` and registers its named presets with
`register`. The registry imports every mode's ``experiment`` module on first use, so a new parallel
mode adds a package here and nothing else.

Contract (`template.Experiment`; all pure Python except `run_rank` and `step_fn`):
  config(overrides)   -> a validated Config (`UsageError` on bad input); ``cfg.layout`` is its mesh
  predict(cfg)        -> every CommEvent every rank must issue in one training step
  run_rank(ctx, cfg)  -> this rank's `RankOutput` (captured events of one step, numerics, checks);
                         a trained mode fills in `template.RankTrainer` and inherits the loop
  label(overrides)    -> the name of a run's files (the experiment's, plus the options given)
  summarize(cfg, outs, label) -> mode-specific sections of result.json (e.g. ``experts``, ``timeline``)
  step_fn(ctx, cfg)   -> one training step as a callable (the suite times and profiles it)
"""

from __future__ import annotations

import importlib
import pkgutil

from ..core.errors import UsageError
from .template import Experiment

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
            if mod.ispkg:  # one package per mode; its `experiment` module registers the presets
                importlib.import_module(f"{__name__}.{mod.name}.experiment")


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def get(name: str) -> Experiment:
    _load()
    if name not in _REGISTRY:
        raise UsageError(f"unknown experiment {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]
