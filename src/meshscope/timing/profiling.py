"""Profile one configuration's training steps and compare the NCCL kernels with the prediction.

The chapter's Nsight communication fingerprint (docs/chapter.md, Q25): each logical collective leaves a
kernel of a known family; all_to_all and send/recv both appear as SendRecv. Each rank records a
torch.profiler trace of `steps` steps after `warmup` untimed ones; rank 0 divides the kernel counts per
family by the number of steps and compares them with `kernels.expected_kernels` of the predicted ledger.
With a sweep's alpha-beta fits it also puts the predicted communication time of the ledger next to the
measured NCCL kernel time (the sum of kernel durations per step, which includes waiting for the peer), both
on the critical rank.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch.distributed as dist

from ..capture.recorder import suspended
from ..core.rundir import RunDir
from .kernels import (
    comm_counts,
    comm_records,
    compare_fingerprints,
    expected_kernels,
    fingerprint,
    kernel_seconds_per_step,
    profiled,
)
from .statistics import critical_path, percentile


def _calls(calls) -> str:
    return ", ".join(f"{n:g} {op} on {list(g) if g else '?'}" for (op, g), n in sorted(calls.items(), key=str))


def load_fits(path: str | None):
    """The alpha-beta fits of a saved `meshscope sweep` (its sweep.json), or None; UsageError if unusable.

    Its kernel-time fits when it has them (`sweep --cuda-graph` on GPUs): the measured side of the
    comparison is NCCL kernel time, so those predict like for like; its wall-time fits otherwise.
    """
    if path is None:
        return None
    from ..core.errors import UsageError
    from ..predict.alpha_beta import Fit

    try:
        doc = json.loads(Path(path).read_text())
        return [Fit(**{**f, "rel_err": tuple(f["rel_err"])}) for f in doc.get("kernel_fits") or doc["fits"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--sweep {path}: not the sweep.json of `meshscope sweep --out DIR` ({type(exc).__name__})") from None


def profile_config(ctx, exp, cfg, label: str, steps: int, warmup: int, fits=None,
                   cuda_graph: bool = False) -> dict | None:
    """Every rank profiles `steps` training steps; rank 0 returns the kernel section (None elsewhere).

    The section's ``check`` exists only on GPUs (gloo launches no kernels to fingerprint). With `fits`
    the NCCL kernel time per step is compared with the alpha-beta prediction; with `cuda_graph` too
    (and a step that can be captured, and `steps` >= `graph_kernels.MIN_CALLS`) it is also measured
    over one replay of a CUDA graph of `steps` steps (`graph_kernels`), where the ranks run in lockstep:
    an eager kernel's duration mostly waits for the peer's launch.
    """
    step = exp.step_fn(ctx, cfg)
    path = RunDir(ctx.run_dir).profile(label, ctx.rank)
    with suspended():  # as in timing: recording would delay the launches the kernels then wait for
        for _ in range(max(warmup, 1)):
            step()
        with profiled(path, ctx.device):
            for _ in range(steps):
                # ranks start each profiled step together, as in timing, so that a kernel's duration is
                # not the other rank's lag from the previous step
                ctx.synchronize()
                dist.barrier(group=ctx.control)
                step()
    trace = json.loads(path.read_text())
    graph_s = None
    from .graph_kernels import MIN_CALLS, graph_kernel_seconds

    if fits and cuda_graph and ctx.device.type == "cuda" and exp.graph_blocker(cfg) is None and steps >= MIN_CALLS:
        graph_s = graph_kernel_seconds(step, ctx.device, steps, warmup, RunDir(ctx.run_dir).profile(f"{label}.graph", ctx.rank),
                                       lambda: dist.barrier(group=ctx.control))
    gathered = ctx.gather((fingerprint(trace), kernel_seconds_per_step(trace, steps), comm_counts(comm_records(trace)),
                           graph_s))
    if ctx.rank != 0:
        return None
    predicted = exp.predict(cfg)
    per_rank, problems, op_problems = [], [], []
    for r, (total, seconds, ops, _) in enumerate(gathered):
        mine = [e for e in predicted if e.rank == r]
        want = expected_kernels(mine)
        got = {f: n // steps if n % steps == 0 else n / steps for f, n in total.items()}
        problems += [f"rank {r}: {d}" for d in compare_fingerprints(want, got)]
        # The profiler's comm metadata names the logical op and group behind each kernel: it tells an
        # EP all_to_all from PP send/recv although both launch SendRecv kernels.
        logical = {op: sum(n for n in by_group.values()) / steps for op, by_group in ops.items()}
        got_calls = {(op, tuple(g) if g else None): n / steps for op, by_group in ops.items() for g, n in by_group.items()}
        want_calls = Counter((e.op, e.group) for e in mine)
        if ops and got_calls != dict(want_calls):
            op_problems.append(f"rank {r}: profiler comm records {_calls(got_calls)} per step, predicted "
                               f"{_calls(want_calls)}")
        per_rank.append({"rank": r, "expected": want, "measured": got,
                         "comm_ops_per_step": logical, "comm_ops_by_group": {op: {str(list(g) if g else g): n / steps
                                                                                     for g, n in by_group.items()}
                                                                                for op, by_group in ops.items()},
                         "nccl_kernel_s_per_step": percentile(seconds, 50)})
    section = {"profile_steps": steps, "per_rank": per_rank}
    if ctx.device.type == "cuda":
        detail = ("; ".join(problems[:3]) if problems else
                  f"{sum(sum(p['measured'].values()) for p in per_rank)} kernels per step on {len(per_rank)} ranks "
                  f"as predicted ({steps} profiled steps)")
        section["check"] = {"name": "NCCL kernels == prediction", "passed": not problems, "detail": detail}
        if any(p["comm_ops_per_step"] for p in per_rank):  # present when the backend records comm metadata
            section["ops_check"] = {"name": "profiler comm records == predicted ops", "passed": not op_problems,
                                    "detail": "; ".join(op_problems[:2]) if op_problems else
                                    "the logical op and group of every NCCL call match the prediction"}
    if fits:
        from ..predict.alpha_beta import predict_time

        pred = predict_time(predicted, fits).critical_s
        meas = percentile(critical_path([seconds for _, seconds, _, _ in gathered]), 50)
        section["comm_time"] = {"predicted_critical_s": pred, "predicted_as": f"alpha-beta fits of {fits[0].basis} "
                                "time per call (sweep), summed over the rank's events, max over ranks",
                                "measured_critical_s": meas,
                                "rel_err": (pred - meas) / meas if meas else None,
                                "measured_as": "sum of NCCL kernel durations per step, max over ranks, median over "
                                               "the profiled steps"}
        if all(g is not None for *_, g in gathered):
            graph = percentile(critical_path([g for *_, g in gathered]), 50)
            section["comm_time"] |= {"measured_graph_critical_s": graph,
                                     "rel_err_graph": (pred - graph) / graph if graph else None,
                                     "measured_graph_as": f"the same over one CUDA-graph replay of {steps} steps"}
    return section

