"""What ``meshscope forecast`` says of a job on a cluster: one typed record, written to ``--json`` as is."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class AxisTime:
    """One axis of one rank class in the forecast step."""

    axis: str
    calls: int
    bytes: int
    """Logical bytes in nccl-tests' convention (`alpha_beta.model_bytes`)."""
    seconds: float
    """The calls' own times on their links, summed (`collective_time`)."""
    exposed_s: float
    """How long the compute stream waited on them."""
    waiting_for_peers_s: float
    """Of `exposed_s`, waiting for a member that had not issued yet (pipeline bubbles, a slower class)."""


@dataclass(frozen=True)
class ClassForecast:
    """One rank class: the traced rank that plays it and what its step costs."""

    rank: int
    ranks: int
    """Ranks of the world it plays."""
    step_s: float
    compute_s: float
    """Busy time of the compute (default) stream, and the host's work (`compute_by_kind`'s host), which holds it."""
    compute_by_phase: dict[str, float]
    compute_by_kind: dict[str, float]
    """The compute stream's busy time by what bounds it (`forecast.compute.segment_terms`: matmul, attention,
    memory-bound; measured where ``--measure-on`` timed it): the classes a GPU profile's kernels fall in; and host,
    the host's work, which holds every stream of the rank back (CPU offload's optimizer step)."""
    side_compute_s: float
    """Busy time of the job's other streams (FSDP2's copy-in and copy-out)."""
    waited_on_streams_s: float
    """How long the compute stream waited for the job's other streams."""
    flops: dict[str, int]
    """Matmul FLOPs per dtype in the step (torch's FlopCounterMode convention, recomputation included)."""
    axes: tuple[AxisTime, ...]
    peak_bytes: int
    """The most tensor bytes the rank held at once (its whole run, `capture.work`)."""
    peak_at: dict
    """step, phase, module of that peak, and the live bytes by the phase that made them."""
    reserved_bytes: int
    """The most the CUDA caching allocator would have reserved for those tensors (`capture.caching_allocator`):
    what ``torch.cuda.max_memory_reserved`` reports, and torchtitan logs as its memory."""
    reserved_at: dict
    """step, phase, module of that peak, and ``expandable_segments`` (the allocator's setting, from the job's
    environment)."""

    @property
    def exposed_s(self) -> float:
        return sum(a.exposed_s for a in self.axes)


@dataclass(frozen=True)
class Forecast:
    """A traced job's step on a cluster."""

    run_dir: str
    cluster: dict
    """The `ClusterSpec` used (`to_json`, its figures' sources included)."""
    world: int
    step: int
    """The traced step forecast (the last steady one)."""
    step_s: float
    """The slowest class's step."""
    critical_rank: int
    """The traced rank of that class."""
    classes: tuple[ClassForecast, ...]
    compute_source: str
    """How compute was timed."""
    tokens: int | None = None
    """Tokens per step of the whole job, as given (``--tokens``)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        return self.tokens / self.step_s / self.world if self.tokens and self.step_s else None

    @property
    def hfu(self) -> float:
        """Counted matmul FLOPs of the critical class per second over its GPU's bf16 peak: hardware FLOPs
        utilisation (recomputation counted), not MFU's model FLOPs."""
        critical = next(c for c in self.classes if c.rank == self.critical_rank)
        return sum(critical.flops.values()) / self.step_s / self.cluster["gpu"]["bf16_flops"] if self.step_s else 0.0

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["kind"] = "forecast"
        doc["tokens_per_s_per_gpu"] = self.tokens_per_s_per_gpu
        doc["hfu"] = self.hfu
        for c, out in zip(self.classes, doc["classes"]):
            out["exposed_s"] = c.exposed_s
        return doc
