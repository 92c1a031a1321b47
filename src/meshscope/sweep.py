"""``meshscope sweep``: collective time over message sizes on one mesh group, and a fitted alpha-beta model.

The seed refuses to fit its two TP medians into a bandwidth model ("不能把这两组 median拟合成可靠带宽或
线性模型": CV 55-81 %, and the step mixes TP and DP messages). A sweep isolates one collective on one
group, times it per size (critical rank = max over ranks per iteration, median after warmup, via
`stats`), and fits the latency-bandwidth model t = alpha + beta * bytes per collective and group size.
`predict_time` then turns a predicted ledger into a predicted communication time per rank, so the
suite can put predicted next to measured communication time.

Sizes and bus bandwidth follow nccl-tests (doc/PERFORMANCE.md): the size of all_gather is the total
OUTPUT bytes, of reduce_scatter the total INPUT bytes, of all_reduce the buffer, of all_to_all the bytes
each rank sends in total, of sendrecv the bytes each rank sends to its ring neighbour (while it receives
as much from the other). algbw = size / time; busbw = algbw * factor(op, n) (`BUS_FACTOR`).

Legend: n = group size, i = this rank's index in the group, S = size in bytes, e = S / 4 (float32 elements),
I / O = input / output elements of one call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import UsageError
from .events import DTYPE_BYTES, human_bytes
from .experiments.sizes import check_int
from .mesh import GROUP_NAMES, Layout

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "sendrecv": lambda n: 1.0}
"""nccl-tests' busbw / algbw: the fraction of the data each rank's link must carry for the op to finish."""
DEFAULT_SIZES = tuple(1024 << k for k in range(17))
"""1 KiB .. 64 MiB, doubling."""
ELEM_BYTES = DTYPE_BYTES["float32"]


def busbw(op: str, size: int, seconds: float, n: int) -> float:
    """nccl-tests bus bandwidth (bytes/s) of `op` moving `size` bytes in `seconds` on `n` ranks."""
    return size / seconds * BUS_FACTOR[op](n)


def parse_sizes(text: str) -> tuple[int, ...]:
    """"1K,64K,1M" (1024-based suffixes K, M, G; plain bytes allowed) -> sizes in bytes."""
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for item in text.split(","):
        item = item.strip().upper().removesuffix("IB").removesuffix("B")
        num, unit = item.rstrip("KMG"), item[len(item.rstrip("KMG")):]
        if not num.isdigit() or unit not in scale or int(num) <= 0:
            raise UsageError(f"--sizes item {item!r} is not a positive size like 4096, 64K, 1M or 1G")
        out.append(int(num) * scale[unit])
    return tuple(out)


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep, on which group."""

    world: int = 2
    """Number of ranks."""
    tp: int = 1
    """Mesh sizes, as `meshscope layout`; they only define the groups of --axis."""
    cp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    axis: str = "world"
    """The group the collectives run on: ``world`` or a mesh group name (every group of it runs at once)."""
    ops: tuple[str, ...] = OPS
    """Collectives to sweep, of `OPS`."""
    sizes: tuple[int, ...] = DEFAULT_SIZES
    """Message sizes in bytes, as nccl-tests defines them per op."""
    iters: int = 20
    """Timed iterations per size (after warmup)."""
    warmup: int = 5
    """Discarded iterations per size."""
    back_to_back: int = 1
    """Collectives issued back to back per timed sample (time / count), as nccl-tests times a loop of
    iterations: amortises the launch skew between ranks that a single synchronised call pays in full."""
    cuda_graph: bool = False
    """Each sample one replay of a CUDA graph of its `back_to_back` collectives (`cuda_graph`): no
    Python or launch overhead, so small messages show NCCL's own latency rather than the host's
    (nccl-tests' ``-G`` captures its loop the same way). On GPUs with `back_to_back` >= 3 the NCCL
    kernel time per call is profiled and fitted too (`graph_kernels`)."""

    def layout(self) -> Layout:
        return Layout(self.world, tp=self.tp, cp=self.cp, ep=self.ep, etp=self.etp, pp=self.pp)

    def group_of(self, rank: int) -> list[int]:
        return list(range(self.world)) if self.axis == "world" else self.layout().group_of(self.axis, rank)

    def validate(self) -> None:
        """Raise `UsageError` naming the bad value and what would be valid."""
        self.layout()
        if self.axis != "world" and self.axis not in GROUP_NAMES:
            raise UsageError(f"--axis {self.axis!r} is not a group; valid: world, {', '.join(GROUP_NAMES)}")
        n = len(self.group_of(0))
        if n < 2:
            raise UsageError(f"--axis {self.axis} has groups of {n} rank; a sweep needs at least 2 (raise its size)")
        bad = [op for op in self.ops if op not in OPS]
        if bad or not self.ops:
            raise UsageError(f"--ops {','.join(self.ops)!r}: valid ops are {', '.join(OPS)}")
        for s in self.sizes:
            if s % (n * ELEM_BYTES):
                raise UsageError(f"size {s} B does not split into {n} float32 chunks; use multiples of {n * ELEM_BYTES} B")
        check_int("back-to-back", self.back_to_back)
        check_int("iters", self.iters, minimum=2)
        check_int("warmup", self.warmup, minimum=0)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "SweepConfig":
        return cls(**{**d, "ops": tuple(d["ops"]), "sizes": tuple(d["sizes"])})


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


# -- running it on the ranks -------------------------------------------------------------------------
def _step(op: str, size: int, group, device):
    """A closure issuing one `op` of `size` bytes (nccl-tests convention) on `group` (an AxisGroup)."""
    import torch
    import torch.distributed as dist

    n, i, e = group.size, group.local_rank(dist.get_rank()), size // ELEM_BYTES
    pg = group.pg
    # S is the output of all_gather and the input of reduce_scatter; the other side is S / n.
    numel_in, numel_out = {"all_gather": (e // n, e), "reduce_scatter": (e, e // n)}.get(op, (e, e))
    # zeros: the in-place all_reduce repeated hundreds of times stays finite (ones would double to inf).
    x_I, y_O = torch.zeros(numel_in, device=device), torch.empty(numel_out, device=device)
    nxt, prv = group.ranks[(i + 1) % n], group.ranks[(i - 1) % n]
    calls = {
        "all_reduce": lambda: dist.all_reduce(x_I, group=pg),
        "all_gather": lambda: dist.all_gather_into_tensor(y_O, x_I, group=pg),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(y_O, x_I, group=pg),
        "all_to_all": lambda: dist.all_to_all_single(y_O, x_I, group=pg),
        # nccl-tests sendrecv: each rank sends to its ring successor while receiving from its predecessor.
        "sendrecv": lambda: [w.wait() for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, x_I, nxt, group=pg), dist.P2POp(dist.irecv, y_O, prv, group=pg)])],
    }
    return calls[op]


def run_sweep_rank(ctx, cfg: SweepConfig) -> dict | None:
    """Every rank times every (op, size); rank 0 returns the sweep document (None elsewhere)."""
    from .groups import AxisGroup
    from .stats import critical_path, percentile, summarize, time_steps

    import torch.distributed as dist

    if cfg.axis == "world":
        group = AxisGroup("world", tuple(range(ctx.world)), dist.group.WORLD)
    else:
        group = ctx.mesh(cfg.layout())[cfg.axis]
    from .graph_kernels import MIN_CALLS, graph_kernel_seconds

    table, kernel = {}, {}
    # kernel time: CUDA kernels in a graph, enough calls for a median that skips the first one's wait
    kernels = cfg.cuda_graph and ctx.device.type == "cuda" and cfg.back_to_back >= MIN_CALLS
    for op in cfg.ops:
        for size in cfg.sizes:
            ctx.progress(f"sweep {op} {human_bytes(size)} on {cfg.axis} (group of {group.size})")
            call = _step(op, size, group, ctx.device)
            t = time_steps(call, cfg.iters, warmup=cfg.warmup, device=ctx.device,
                           steps_per_sample=cfg.back_to_back, cuda_graph=cfg.cuda_graph)
            table[(op, size)] = t.gpu_s if t.gpu_s is not None else t.host_s
            if kernels:
                trace = ctx.run_dir / "traces" / f"sweep.{op}.{size}.rank{ctx.rank}.json"
                per_call = graph_kernel_seconds(call, ctx.device, cfg.back_to_back, cfg.warmup, trace,
                                                lambda: dist.barrier(group=ctx.control))
                kernel[(op, size)] = percentile(per_call, 50)
    everyone = ctx.gather({"ranks": list(group.ranks), "table": table, "kernel": kernel, "method": t.method,
                           "clock": "gpu" if t.gpu_s is not None else "host"})
    if ctx.rank != 0:
        return None
    n, rows, fits, kernel_fits = group.size, [], [], []
    for op in cfg.ops:
        medians, kernel_s = [], []
        for size in cfg.sizes:
            s = summarize(critical_path([r["table"][(op, size)] for r in everyone]))
            medians.append(s.median)
            algbw = size / s.median
            rows.append({"op": op, "bytes": size, "group_size": n, "time_s": s.median, "p95_s": s.p95, "cv": s.cv,
                         "unstable": s.unstable, "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw(op, size, s.median, n) / 1e9})
            if kernels:  # the critical rank's kernel time per call
                kernel_s.append(max(r["kernel"][(op, size)] for r in everyone))
                rows[-1]["kernel_time_s"] = kernel_s[-1]
        fits.append(fit_alpha_beta(op, n, cfg.sizes, medians))
        if kernels and min(kernel_s) > 0:  # a trace without NCCL kernels gives 0: no kernel fit, the rest stands
            kernel_fits.append(fit_alpha_beta(op, n, cfg.sizes, kernel_s, basis="kernel"))
    return {"kind": "sweep", "backend": ctx.backend, "world": ctx.world, "config": cfg.to_json(),
            "groups": sorted({tuple(r["ranks"]) for r in everyone}), "clock": everyone[0]["clock"],
            "timing": everyone[0]["method"] + "; critical rank = max over ranks per iteration; time = median",
            "points": rows, "fits": [f.to_json() for f in fits],
            # all or none: `suite --sweep` predicts every op with the same basis
            **({"kernel_fits": [f.to_json() for f in kernel_fits]} if len(kernel_fits) == len(cfg.ops) else {})}


def render(doc: dict) -> str:
    """The sweep as text: one table of points, one line per fit."""
    lines = [f"sweep on {doc['config']['axis']} groups {doc['groups']} ({doc['backend']}, {doc['clock']} clock); "
             f"{doc['timing']}",
             f"{'op':15s} {'size':>9s} {'time us':>10s} {'CV':>7s} {'algbw GB/s':>11s} {'busbw GB/s':>11s}"
             + (f" {'kernel us':>10s}" if "kernel_fits" in doc else "")]
    for p in doc["points"]:
        flag = " PERF_UNSTABLE" if p["unstable"] else ""
        kernel = f" {p['kernel_time_s'] * 1e6:10.1f}" if "kernel_time_s" in p else ""
        lines.append(f"{p['op']:15s} {human_bytes(p['bytes']):>9s} {p['time_s'] * 1e6:10.1f} {p['cv']:7.1%} "
                     f"{p['algbw_GBps']:11.3f} {p['busbw_GBps']:11.3f}{kernel}{flag}")
    for f in doc["fits"] + doc.get("kernel_fits", []):
        worst = max(abs(r) for r in f["rel_err"])
        # beta <= 0 happens when noise swamps the size dependence (few, small sizes): say so, no "inf GB/s"
        bw = f"{1 / f['beta_s_per_byte'] / 1e9:.3f} GB/s" if f["beta_s_per_byte"] > 0 else "n/a (beta <= 0)"
        lines.append(f"fit of {f.get('basis', 'wall')} time, {f['op']} n={f['group_size']}: alpha {f['alpha_s'] * 1e6:.1f} us, 1/beta {bw}, "
                     f"max |rel err| {worst:.1%}")
    return "\n".join(lines)
