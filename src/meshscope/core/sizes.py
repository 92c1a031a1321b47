"""Validation of sizes, shared by every parallel mode, the model spec of `place` and the sweep.

World and data-parallel size determine each other through the model-parallel product (tp for the TP
MLP, pp for the pipeline, tp x pp for the composed model): world = model x dp. Either may be given;
given both, they must agree. Every failure is a one-line `UsageError` naming the values.
"""

from __future__ import annotations

from .errors import UsageError


def check_int(flag: str, value, minimum: int = 1) -> None:
    """`value` (of the CLI option --`flag`) is an integer >= `minimum`; a bool is not an integer here."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise UsageError(f"--{flag} {value!r} must be {want}")


def check_positive(cfg, names) -> None:
    """Each named field of `cfg` is None (derived later) or a positive integer."""
    for name in names:
        if getattr(cfg, name) is not None:
            check_int(name.replace("_", "-"), getattr(cfg, name))


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
