"""Numeric comparison against the unsharded reference, one mechanism for every parallel mode.

The chapter's numeric and state acceptance: outputs, gradients and weights are compared element-wise with
a reference built from the full weights, with a tolerance of 2e-5. Two precautions the chapter did not
need: a NaN must never hide (Python's ``max`` keeps the old value when the new one is NaN, so every
maximum here goes through `worse`), and gradients of a mean-square loss are ~1e-3, so 2e-5 absolute
alone would let a 1 % error pass: gradients must also be within `REL_TOLERANCE` of the largest
reference element (`Worst.check`).
"""

from __future__ import annotations

import hashlib
import math

import torch

from ..core.result import Check

TOLERANCE = 2e-5
"""The chapter's acceptance threshold for every numeric comparison."""
REL_TOLERANCE = 1e-4
"""Gradients also: max abs error over the largest element of the reference gradient."""


def worse(a: float, b: float) -> float:
    """The larger of two errors, NaN winning over everything (a NaN error must fail its check)."""
    return b if b != b or b > a else a


def finite(v: float) -> bool:
    return math.isfinite(v)


def max_abs_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max |got - want| over all elements, in float32 on got's device (NaN if any element is NaN)."""
    diff = (got.detach().float() - want.detach().float().to(got.device)).abs()
    return float("nan") if torch.isnan(diff).any() else diff.max().item()


class Worst:
    """Worst error per quantity over all steps: absolute, and relative to the reference's largest
    element. A missing or non-finite value is NaN, and NaN sticks (it fails every bound)."""

    def __init__(self):
        self.abs: dict[str, float] = {}
        self.rel: dict[str, float] = {}

    def add(self, key: str, got: torch.Tensor | None, want: torch.Tensor) -> None:
        err = float("nan") if got is None else max_abs_err(got, want)
        rel = err / max(want.abs().max().item(), 1e-30)
        self.abs[key], self.rel[key] = worse(self.abs.get(key, 0.0), err), worse(self.rel.get(key, 0.0), rel)

    def check(self, name: str, key: str) -> Check:
        """Within TOLERANCE absolute and REL_TOLERANCE of the largest reference element (gradients)."""
        a, r = self.abs[key], self.rel[key]
        return Check(name, a <= TOLERANCE and r <= REL_TOLERANCE,
                     f"max abs err {a:.3g} (limit {TOLERANCE:.0e}), {r:.3g} of the largest element "
                     f"(limit {REL_TOLERANCE:.0e})")

    def numerics(self) -> dict[str, float]:
        """The result's ``numerics`` section: max_abs_err_<key>, and max_rel_err_<key> for gradients."""
        out = {f"max_abs_err_{k}": v for k, v in self.abs.items()}
        out.update({f"max_rel_err_{k}": self.rel[k] for k in self.rel if "grad" in k})
        return out

def digest(tensors) -> str:
    """Bit-exact fingerprint of a sequence of tensors (replicas must match to the last bit)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def bound(name: str, value: float, limit: float, what: str = "max abs err") -> Check:
    """A check that `value` is finite and at most `limit`."""
    ok = value == value and value <= limit  # NaN fails
    return Check(name, ok, f"{what} {value:.3g} (limit {limit:.0e})")
