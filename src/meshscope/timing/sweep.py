"""`meshscope sweep`: the rank-side collective benchmark (nccl-tests' algbw and busbw, back-to-back
or CUDA-graph-replayed calls) whose results `predict.alpha_beta` fits."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..core.errors import UsageError
from ..core.events import human_bytes
from ..core.mesh import GROUP_NAMES, Layout
from ..core.rundir import RunDir
from ..core.sizes import check_int
from ..predict.alpha_beta import ELEM_BYTES, OPS, busbw, fit_alpha_beta

DEFAULT_SIZES = tuple(1024 << k for k in range(17))
"""1 KiB .. 64 MiB, doubling."""


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
    import torch.distributed as dist

    from ..core.groups import AxisGroup
    from .sampler import time_steps
    from .statistics import critical_path, percentile, summarize

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
                trace = RunDir(ctx.run_dir).profile(f"sweep.{op}.{size}", ctx.rank)
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


def sweep_program(ctx, spec: dict) -> list[dict] | None:
    """The sweep's rank program (`run.worker.Program`): a collective benchmark, not an experiment,
    so there is no ledger to verify; rank 0 returns the sweep document."""
    doc = run_sweep_rank(ctx, SweepConfig.from_json(spec["sweep"]))
    return [doc] if ctx.rank == 0 else None


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
