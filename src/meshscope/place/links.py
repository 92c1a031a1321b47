"""The link model of the placement advisor: one class of links (intra- or inter-node) costs alpha + link bytes /
bandwidth per call; its defaults, and the intra-node class measured by a saved `meshscope sweep`.

Kept apart from the solver (`advisor`) so that the command line reads the defaults for its flags without
the solver's numpy (about 15 MiB resident and 0.1 s in every ``meshscope`` process, the fake world's
launcher too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UsageError
from ..predict.alpha_beta import BUS_FACTOR, Fit
from ..predict.volume import Traffic, link_bytes


@dataclass(frozen=True)
class LinkClass:
    """One class of links under the alpha-beta model: a call of B link bytes costs alpha + B / bandwidth."""

    name: str
    """intra-node or inter-node."""
    latency_s: float
    """alpha: seconds per call."""
    bandwidth: float
    """Bytes per second one rank's link carries (nccl-tests bus bandwidth)."""
    source: str = "default"
    """Where the figures come from (defaults, flags, or a sweep file)."""

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth > 0):
            raise UsageError(f"{self.name} link: latency {self.latency_s} s must be >= 0 and bandwidth "
                             f"{self.bandwidth} B/s > 0")

    def time(self, t: Traffic, n: int) -> float:
        return t.count * self.latency_s + link_bytes(t, n) / self.bandwidth

    def to_json(self) -> dict:
        return {"name": self.name, "latency_s": self.latency_s, "bandwidth_Bps": self.bandwidth, "source": self.source}


INTRA_DEFAULT = LinkClass("intra-node", 10e-6, 300e9)
"""NVLink/NVSwitch: 300 GB/s bus bandwidth (the design brief measured 326 GB/s all_reduce busbw on
two H200s at 1 GiB), 10 us per call (NCCL's usual 5-20 us)."""
INTER_DEFAULT = LinkClass("inter-node", 20e-6, 25e9)
"""One 200 Gb/s NIC per GPU (HDR InfiniBand / RoCE): 25 GB/s, 20 us per call."""


def link_from_sweep(path: Path) -> LinkClass:
    """The intra-node link from a saved `meshscope sweep` (a run directory or its sweep.json).

    Takes the all_reduce fit of the largest group (else the first fit): alpha is the fit's latency and
    the bandwidth is its bus bandwidth factor(op, n) / beta, so ring factors are not counted twice.
    One link class for every intra-node group, whatever its size: the model has one alpha per class.
    """
    file = path / "sweep.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
        fits = [Fit(**{**f, "rel_err": tuple(f["rel_err"])}) for f in doc["fits"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--sweep {path}: not a readable meshscope sweep.json ({exc.__class__.__name__}: {exc})")
    if not fits:
        raise UsageError(f"--sweep {path}: the sweep has no fits")
    ars = [f for f in fits if f.op == "all_reduce"]
    fit = max(ars, key=lambda f: f.group_size) if ars else fits[0]
    if fit.beta_s_per_byte <= 0:
        raise UsageError(f"--sweep {path}: the {fit.op} fit has beta {fit.beta_s_per_byte:.3g} <= 0 (noise "
                         f"swamped the size dependence); sweep larger sizes")
    bw = BUS_FACTOR[fit.op](fit.group_size) / fit.beta_s_per_byte
    return LinkClass("intra-node", max(fit.alpha_s, 0.0), bw, f"sweep {file} ({fit.op} on {fit.group_size} ranks)")
