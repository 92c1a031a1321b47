"""A traced job's step on a cluster: its rank classes' programs timed (`compute`, `collective_time`) and run
together (`timeline`), summed per class and axis into the `Forecast`. The ranks sit where a node map puts them
(`collective_time.NodeOf`): the trace's own numbering on nodes of the cluster's size unless one is given."""

from __future__ import annotations

from ..capture.work import COMPUTE, HOST_WORK
from ..core.errors import UsageError
from ..core.events import human_bytes
from ..predict.alpha_beta import model_bytes
from .cluster import ClusterSpec
from .collective_time import NodeOf, collective_time, default_nodes
from .compute import HOST, segment_seconds, segment_terms
from .inputs import TracedJob
from .result import AxisTime, ClassForecast, Forecast
from .timeline import Simulation


def forecast(job: TracedJob, cluster: ClusterSpec, tokens: int | None = None, tf32: bool = False,
             nodes: NodeOf | None = None) -> Forecast:
    """`job`'s step on `cluster`, its ranks placed by `nodes` (default: rank r on node r // gpus_per_node)."""
    notes: list[str] = []
    unmodelled: dict[str, int] = {}
    if nodes is None:
        nodes = default_nodes(cluster.network.gpus_per_node)

    def call_s(e) -> float:
        try:
            return collective_time(e, cluster, nodes).seconds
        except ValueError:
            unmodelled[e.op] = unmodelled.get(e.op, 0) + 1
            return 0.0

    sim = Simulation(job.programs, job.ledgers, job.represent.get,  # None for a receive from any source (peer -1)
                     lambda item: segment_seconds(item, cluster.gpu, tf32), call_s)
    timelines = sim.run()
    classes = []
    for rank, tl in sorted(timelines.items()):
        flops: dict[str, int] = {}
        by_kind: dict[str, float] = {}
        for item in job.programs[rank]:
            if item[0] == HOST_WORK or (item[0] == COMPUTE and not item[5]):  # as `RankTimeline.compute_s`
                for kind, s in segment_terms(item, cluster.gpu, tf32).items():
                    by_kind[kind] = by_kind.get(kind, 0.0) + s
            if item[0] == COMPUTE:
                for dtype, f in item[2].items():
                    flops[dtype] = flops.get(dtype, 0) + f
        by_axis: dict[str, list] = {}
        for call in tl.calls.values():
            by_axis.setdefault(call.event.axis, []).append(call)
        axes = tuple(AxisTime(axis, len(calls), sum(model_bytes(c.event) for c in calls),
                              sum(c.seconds for c in calls), sum(c.waited for c in calls),
                              sum(c.waited_for_peers for c in calls))
                     for axis, calls in sorted(by_axis.items()))
        work = job.work[rank]
        classes.append(ClassForecast(rank, job.classes.get(rank, 1), tl.end_s, tl.compute_s,
                                     dict(tl.compute_by_phase), by_kind, tl.side_compute_s, tl.waited_on_streams_s,
                                     flops, axes, work.peak_bytes, work.peak_at, work.reserved_bytes,
                                     work.reserved_at))
        if by_kind.get(HOST):
            notes.append(f"rank {rank}: {by_kind[HOST] * 1e3:.1f} ms of ops on the host (their results in its memory: "
                         f"CPU offload), at {cluster.gpu.host_bandwidth / 1e9:g} GB/s, before the rank issues more")
        for name, n in work.uncounted.items():
            notes.append(f"rank {rank}: {n} call(s) of {name} have no FLOP formula in torch; timed by their bytes")
    if unmodelled:
        notes.append("no time model for " + ", ".join(f"{op} ({n} calls)" for op, n in sorted(unmodelled.items()))
                     + ": timed as 0 s")
    if sim.unmatched:
        notes.append(f"{len(sim.unmatched)} call(s) were timed without a partner's matching call (the trace shows "
                     f"none at the same position of the same axis): their start waits for no other rank")
    critical = max(classes, key=lambda c: c.step_s)
    peak = max(classes, key=lambda c: c.peak_bytes)
    if peak.peak_bytes > cluster.gpu.hbm_bytes:
        notes.append(f"rank {peak.rank}'s class holds {human_bytes(peak.peak_bytes)} of tensors at its peak, more "
                     f"than the {human_bytes(cluster.gpu.hbm_bytes)} of a {cluster.gpu.name}: it would run out of memory")
    else:
        reserved = max(classes, key=lambda c: c.reserved_bytes)
        if reserved.reserved_bytes > cluster.gpu.hbm_bytes:
            notes.append(f"rank {reserved.rank}'s class would have the caching allocator reserve "
                         f"{human_bytes(reserved.reserved_bytes)}, more than the {human_bytes(cluster.gpu.hbm_bytes)} "
                         f"of a {cluster.gpu.name}, for {human_bytes(reserved.peak_bytes)} of tensors: it would "
                         f"free its cache and retry where full (synchronising the GPU each time), or run out of "
                         f"memory where the fragments left do not fit a request")
    measured = sorted({w.measured_on for w in job.work.values()})
    if measured != [""]:
        if "" in measured:
            raise UsageError(f"{job.run_dir}: some traced ranks' compute was measured ({', '.join(measured[1:])}) and "
                             f"some not: trace again with or without --measure-on for all of them")
        source = (f"measured: each compute segment of the traced ranks timed as it ran on {', '.join(measured)} "
                  f"(--measure-on), not the roofline of a {cluster.gpu.name}")
    else:
        source = (f"counted FLOPs and bytes of the traced ranks' ops (torch's FlopCounterMode formulas), by the "
                  f"roofline of a {cluster.gpu.name}: matmuls at {cluster.gpu.matmul_efficiency:.0%} of peak"
                  f"{' (fp32 as TF32)' if tf32 else ''}, fused attention at {cluster.gpu.attention_efficiency:.0%}, "
                  f"other ops at {cluster.gpu.memory_efficiency:.0%} of HBM "
                  f"bandwidth")
    return Forecast(str(job.run_dir), cluster.to_json(), job.world, job.step, critical.step_s, critical.rank,
                    tuple(classes), source, tokens, tuple(notes))
