"""``meshscope sweep``: collective time over message sizes on one mesh group, and a fitted alpha-beta model.

The chapter refuses to fit its two TP medians into a bandwidth model (those two medians give no reliable
bandwidth or linear model: CV 55-81 %, and the step mixes TP and DP messages). A sweep isolates one collective
on one group, times it per size (critical rank = max over ranks per iteration, median after warmup, via
`stats`), and fits the latency-bandwidth model t = alpha + beta * bytes per collective and group size.
`predict_time` then turns a predicted ledger into a predicted communication time per rank, so the suite can put
predicted next to measured communication time.

Sizes and bus bandwidth follow nccl-tests (doc/PERFORMANCE.md): the size of all_gather is the total
OUTPUT bytes, of reduce_scatter the total INPUT bytes, of all_reduce the buffer, of all_to_all the bytes
each rank sends in total, of sendrecv the bytes each rank sends to its ring neighbour (while it receives
as much from the other). algbw = size / time; busbw = algbw * factor(op, n) (`BUS_FACTOR`).

Legend: n = group size, i = this rank's index in the group, S = size in bytes, e = S / 4 (float32 elements),
I / O = input / output elements of one call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..core.events import DTYPE_BYTES

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "sendrecv": lambda n: 1.0}
"""nccl-tests' busbw / algbw: the fraction of the data each rank's link must carry for the op to finish."""
ELEM_BYTES = DTYPE_BYTES["float32"]


def busbw(op: str, size: int, seconds: float, n: int) -> float:
    """nccl-tests bus bandwidth (bytes/s) of `op` moving `size` bytes in `seconds` on `n` ranks."""
    return size / seconds * BUS_FACTOR[op](n)


# -- the latency-bandwidth fit -----------------------------------------------------------------------
@dataclass(frozen=True)
class Fit:
    """t = alpha + beta * bytes for one collective on groups of one size."""

    op: str
    group_size: int
    alpha_s: float
    """Latency (seconds)."""
    beta_s_per_byte: float
    """Inverse bandwidth (seconds per byte)."""
    rel_err: tuple[float, ...]
    """(model - measured) / measured at each fitted point, in size order."""
    basis: str = "wall"
    """What was fitted: ``wall`` time per call on the stream, or ``kernel`` time (`graph_kernels`)."""

    def time(self, nbytes: int) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes

    def to_json(self) -> dict:
        return {**asdict(self), "rel_err": list(self.rel_err)}


def fit_alpha_beta(op: str, group_size: int, sizes, seconds, basis: str = "wall") -> Fit:
    """Least squares of t = alpha + beta * S, weighted by 1 / t^2.

    The weights make it minimise the squared RELATIVE error: sizes span five orders of magnitude, and an
    unweighted fit would spend all its freedom on the largest messages and miss the latency term the
    small ones measure. On exact data it recovers alpha and beta exactly either way.
    """
    xs, ts = [float(s) for s in sizes], [float(t) for t in seconds]
    if len(xs) != len(ts) or len(set(xs)) < 2:
        raise ValueError(f"fit needs at least 2 distinct sizes with one time each; got {len(set(xs))} sizes, {len(ts)} times")
    if min(ts) <= 0:
        raise ValueError(f"fit needs positive times; got min {min(ts)}")
    w = [1.0 / t ** 2 for t in ts]
    sw, sx, st = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * t for wi, t in zip(w, ts))
    sxx, sxt = sum(wi * x * x for wi, x in zip(w, xs)), sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    beta = (sw * sxt - sx * st) / (sw * sxx - sx * sx)
    alpha = (st - beta * sx) / sw
    rel = tuple((alpha + beta * x - t) / t for x, t in zip(xs, ts))
    return Fit(op, group_size, alpha, beta, rel, basis)


@dataclass(frozen=True)
class PredictedTime:
    """A ledger's communication time under fitted models."""

    per_rank_s: dict[int, float]
    """Sum over each rank's events of alpha + beta * bytes."""
    critical_s: float
    """Max over ranks."""


MODEL_OF_OP = {"all_reduce": "all_reduce", "barrier": "all_reduce", "all_gather": "all_gather",
               "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_all", "send": "sendrecv", "recv": "sendrecv"}
"""Ledger op -> swept collective whose fit models it (NCCL's barrier is a 1-element all_reduce)."""


def model_bytes(e) -> int:
    """An event's size in nccl-tests' convention: all_gather output, reduce_scatter input, the bytes a
    send sends / a recv receives, and for all_to_all the larger of sent and received (uneven splits:
    the heavier direction bounds the time)."""
    return {"all_gather": e.bytes_out, "recv": e.bytes_out, "all_to_all": max(e.bytes_in, e.bytes_out),
            "barrier": ELEM_BYTES}.get(e.op, e.bytes_in)


def predict_time(events, fits) -> PredictedTime:
    """Predicted communication time per rank (sum of alpha + beta * bytes) and on the critical rank.

    A collective is looked up by (op, group size); send/recv by op alone when no fit has their group's
    size, since a ring sendrecv's per-rank cost does not depend on the group size. Missing fits raise.
    """
    by_key = {(f.op, f.group_size): f for f in fits}
    per_rank: dict[int, float] = {}
    for e in events:
        model = MODEL_OF_OP.get(e.op)
        fit = by_key.get((model, len(e.group)))
        if fit is None and model == "sendrecv":
            fit = next((f for f in fits if f.op == "sendrecv"), None)
        if fit is None:
            have = ", ".join(f"{f.op}@{f.group_size}" for f in fits) or "none"
            raise ValueError(f"no fit for {e.op} on a group of {len(e.group)} ranks (fits: {have}); sweep it first")
        per_rank[e.rank] = per_rank.get(e.rank, 0.0) + fit.time(model_bytes(e))
    return PredictedTime(per_rank, max(per_rank.values(), default=0.0))
