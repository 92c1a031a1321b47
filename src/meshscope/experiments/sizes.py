"""Validation of an experiment's sizes, shared by every parallel mode.

World and data-parallel size determine each other through the model-parallel product (tp for the TP
MLP, pp for the pipeline, tp x pp for the composed model): world = model x dp. Either may be given;
given both, they must agree. Every failure is a one-line `UsageError` naming the values.
"""

from __future__ import annotations

from ..errors import UsageError


def check_positive(cfg, names) -> None:
    """Each named field of `cfg` is None (derived later) or a positive integer."""
    for name in names:
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise UsageError(f"--{name.replace('_', '-')} {value!r} must be a positive integer")


def check_choice(flag: str, value: str, valid) -> None:
    if value not in valid:
        raise UsageError(f"--{flag} {value!r} is not one of: {', '.join(valid)}")


def world_and_dp(world: int | None, dp: int | None, model: int, model_name: str, default_world: int) -> tuple[int, int]:
    """(world, dp) with world = model x dp; `model_name` spells the product for messages ("tp", "tp x pp")."""
    if dp is None:
        world = world or default_world
        if world % model:
            raise UsageError(f"--world {world} is not divisible by {model_name} = {model}; world = {model_name} x dp")
        return world, world // model
    if world is None:
        return model * dp, dp
    if world != model * dp:
        raise UsageError(f"--world {world} disagrees with {model_name} x --dp {dp} = {model * dp}")
    return world, dp
