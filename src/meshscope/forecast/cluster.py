"""A named cluster to forecast on: one GPU's peak rates and memory, and the network between GPUs, each figure
with the document it comes from (`sources`): a forecast must not run on numbers nobody can check. Three ship
(`SHIPPED`): ``h100-sxm`` and ``h200`` (DGX H100 / H200: NVLink 4 and NVSwitch, 8 x 400 Gb/s NDR InfiniBand) and
``a100-sxm`` (DGX A100: NVLink 3, 8 x 200 Gb/s HDR); a user's own is JSON of the same fields (`to_json` prints
one to start from). The network follows NCCL's cost model (src/graph/tuning.cc, NVIDIA/nccl 5067397c): per
protocol a base latency per call, a latency per ring or tree step on NVLink and on the network, a bandwidth
factor; bandwidths per GPU and direction, a line rate times the fraction NCCL reaches. A sweep's intra-node
link (`place.links.link_from_sweep`, called by the command line: `place` is a layer above) replaces NVLink's
figures (`ClusterSpec.with_intra_link`).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from ..core.errors import UsageError

INTRA, INTER = "intra-node", "inter-node"
"""Link class names, as `place.links.LinkClass.name` spells them."""

TUNING, TOPO = (f"NCCL src/graph/{name} (NVIDIA/nccl 5067397c)" for name in ("tuning.cc", "topo.h"))


def _number(v, whole: bool = False) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (not whole and isinstance(v, float) and math.isfinite(v))


def _check(record, ranged=(), zero_ok=()) -> None:
    """Every number of `record` finite and > 0 (>= 0 in `zero_ok`), at most 1 in `ranged`; ints whole."""
    for f in fields(record):
        v, kind = getattr(record, f.name), str(f.type)
        if kind in ("float", "int", "float | None") and not (v is None and kind == "float | None"):
            if not _number(v, whole=kind == "int"):
                raise UsageError(f"{f.name} {v!r} must be {'a whole number' if kind == 'int' else 'a number'}")
            if v < 0 or (v == 0 and f.name not in zero_ok) or (f.name in ranged and v > 1):
                rule = "in (0, 1]" if f.name in ranged else ">= 0" if f.name in zero_ok else "> 0"
                raise UsageError(f"{f.name} {v!r} must be {rule}")
        elif kind == "str" and not (isinstance(v, str) and v):
            raise UsageError(f"{f.name} {v!r} must be a non-empty string")


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One GPU: peak dense rates, memory, and the fractions of them real kernels reach."""

    name: str
    bf16_flops: float
    """Peak dense bf16 tensor-core FLOP/s (no 2:4 sparsity)."""
    tf32_flops: float
    """Peak dense TF32 tensor-core FLOP/s: fp32 matmuls with TF32 allowed."""
    fp32_flops: float
    """Peak plain fp32 FLOP/s (CUDA cores): fp32 matmuls without TF32, and fp32 elementwise work."""
    hbm_bandwidth: float
    """Peak HBM bandwidth, bytes/s."""
    hbm_bytes: int
    """HBM capacity in bytes."""
    matmul_efficiency: float = 0.8
    """Fraction of peak a job's matmuls reach. Default 0.8, a large matmul's ceiling: 8192^3 bf16 matmuls ran at 798
    TFLOP/s on an H100 SXM, 788 on an H200 (this workplace, 2026-11); the shipped Hopper specs take the rate
    measured over whole training steps (their sources), where the clock drops under sustained load."""
    attention_efficiency: float = 0.8
    """Fraction of the bf16 peak a fused attention kernel reaches (flash attention; FLOPs as the forecast counts
    them, causal halved). Default: a large matmul's, for a spec that gives none; the shipped Hopper specs take the
    rate measured over whole training steps (their sources): shorter sequences reach less."""
    memory_efficiency: float = 0.9
    """Fraction of peak HBM bandwidth a memory-bound op reaches, on the bytes the forecast counts for it. Default
    0.9: large device-to-device copies moved 3.0 of 3.35 TB/s on an H100, 4.3 of 4.8 on an H200 (same machines);
    a training step's elementwise kernels reached less on the H200 (its source)."""
    host_bandwidth: float = 6.8e9
    """Bytes/s a rank's host-side ops move, on the bytes the forecast counts for them: CPU offload's optimizer step,
    run by the rank's own CPU thread. Default (`HOST_RATE`): torch's AdamW on the host at one intra-op thread."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Figure name -> where the figure comes from."""

    def __post_init__(self) -> None:
        _check(self, ranged=("matmul_efficiency", "attention_efficiency", "memory_efficiency"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Protocol:
    """One NCCL protocol in NCCL's cost model (tuning.cc: baseLatencies, hwLatencies, the bandwidth refinements)."""

    name: str
    """LL, LL128 or Simple (NCCL's names)."""
    ring_base_s: float
    """Latency per ring call (baseLatencies, Ring)."""
    tree_base_s: float
    """Latency per tree call (baseLatencies, Tree)."""
    ring_nvlink_s: float
    """Latency per ring step on NVLink (hwLatencies NVLINK, Ring)."""
    tree_nvlink_s: float
    """Latency per tree step on NVLink (hwLatencies NVLINK, Tree)."""
    ring_net_s: float
    """Latency per ring step over the network (hwLatencies NET, Ring)."""
    tree_net_s: float
    """Latency per tree step over the network (hwLatencies NET, Tree; rings of one rank per node use it too)."""
    ring_bw_factor: float
    """Fraction of the link's bus bandwidth a ring reaches with this protocol."""
    tree_bw_factor: float
    """Likewise for a tree across nodes (after the tree's own `NetworkSpec.tree_efficiency`)."""

    def __post_init__(self) -> None:
        _check(self, ranged=("ring_bw_factor", "tree_bw_factor"))


NCCL_PROTOCOLS = (
    Protocol(name="LL", ring_base_s=6.6e-6, tree_base_s=6.8e-6, ring_nvlink_s=0.6e-6, tree_nvlink_s=0.6e-6,
             ring_net_s=2.7e-6, tree_net_s=5.0e-6, ring_bw_factor=0.5, tree_bw_factor=1 / 3.8),
    Protocol(name="LL128", ring_base_s=14.0e-6, tree_base_s=14.0e-6, ring_nvlink_s=1.9e-6, tree_nvlink_s=1.25e-6,
             ring_net_s=4.0e-6, tree_net_s=8.5e-6, ring_bw_factor=0.92, tree_bw_factor=120 / 128),
    Protocol(name="Simple", ring_base_s=8.4e-6, tree_base_s=8.4e-6, ring_nvlink_s=3.4e-6, tree_nvlink_s=4.0e-6,
             ring_net_s=14.0e-6, tree_net_s=14.0e-6, ring_bw_factor=1.0, tree_bw_factor=1.0),
)
"""NCCL's protocols (tuning.cc ncclTunerConstantsDefaults, and ncclTopoTuneModel's factors: ring LL busBw * .5,
LL128 * 0.92, tree LL * 1/3.8, tree LL128 * 120/128 across nodes); a spec may carry others (another NCCL)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkSpec:
    """The links between GPUs: NVLink/NVSwitch inside a node, one NIC per GPU between nodes."""

    gpus_per_node: int
    """GPUs of one node; a placement puts rank r on node r // gpus_per_node."""
    intra_bw: float
    """NVLink line rate per GPU and direction, bytes/s."""
    intra_efficiency: float
    """Fraction of `intra_bw` a ring's bus bandwidth reaches (NCCL's own per-link NVLink figure / line rate)."""
    inter_bw: float
    """One GPU's NIC line rate per direction, bytes/s."""
    inter_efficiency: float
    """Fraction of `inter_bw` NCCL reaches through one NIC (nccl-tests)."""
    ll_busbw_cap: tuple[float, float, float]
    """The LL protocol's bus bandwidth cap on 1, 2 and more nodes, bytes/s (tuning.cc llMaxBws)."""
    nvls_busbw: float = 0.0
    """All-reduce bus bandwidth inside one node with NVLink SHARP (NVLS), bytes/s; 0: no NVLS."""
    nvls_latency_s: float = 25e-6
    """NVLS all-reduce latency per call (tuning.cc: baseLatencies NVLS 0, hwLatencies NVLINK NVLS Simple 25 us)."""
    tree_efficiency: float = 0.92
    """Tree all-reduce bus bandwidth / the link's (tuning.cc: ``busBw * .92`` for Tree AllReduce)."""
    protocols: tuple[Protocol, ...] = NCCL_PROTOCOLS
    intra_call_latency_s: float | None = None
    """Set from a sweep: the whole latency of a call inside a node, in place of the per-step model."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Figure name -> where the figure comes from."""

    def __post_init__(self) -> None:
        _check(self, ranged=("intra_efficiency", "inter_efficiency", "tree_efficiency"),
               zero_ok=("nvls_busbw", "intra_call_latency_s"))
        if not (isinstance(c := self.ll_busbw_cap, tuple) and len(c) == 3 and all(_number(x) and x > 0 for x in c)):
            raise UsageError(f"ll_busbw_cap {c!r} must be 3 numbers > 0 (1 node, 2 nodes, more)")
        names = [p.name for p in self.protocols]
        if "Simple" not in names or len(set(names)) != len(names):
            raise UsageError(f"protocols {names} must name each protocol once, Simple among them")

    intra_busbw = property(lambda self: self.intra_bw * self.intra_efficiency,
                           doc="Bus bandwidth a ring reaches inside a node, bytes/s.")
    inter_busbw = property(lambda self: self.inter_bw * self.inter_efficiency,
                           doc="Bandwidth NCCL reaches through one GPU's NIC, bytes/s.")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """A cluster: its GPU and its network."""

    name: str
    description: str
    gpu: GpuSpec
    network: NetworkSpec

    def __post_init__(self) -> None:
        _check(self)

    def to_json(self) -> dict:
        def plain(v):
            if hasattr(v, "__dataclass_fields__"):
                return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
            return [plain(x) for x in v] if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v
        return plain(self)

    def with_intra_link(self, link) -> ClusterSpec:
        """This cluster with the intra-node link a sweep measured: `link` is `place.links.link_from_sweep`'s
        `LinkClass` (latency_s, bandwidth: bus bandwidth, source). Nothing is discounted from what NCCL reached,
        alpha is a call's whole latency, and no NVLS is modelled beside a sweep that measured NCCL's choice."""
        why = f"{link.source} (meshscope sweep)"
        net = replace(self.network, intra_bw=link.bandwidth, intra_efficiency=1.0, nvls_busbw=0.0,
                      intra_call_latency_s=link.latency_s, sources={**self.network.sources, "intra_bw": why,
                      "intra_call_latency_s": why, "intra_efficiency": "1: a sweep measures busbw", "nvls_busbw": why})
        return replace(self, network=net, description=f"{self.description}; intra-node link from {link.source}")


def _hopper_network() -> NetworkSpec:
    """DGX H100 / H200: 8 GPUs on NVLink 4 through 4 NVSwitches, 8 single-port ConnectX-7 at 400 Gb/s."""
    return NetworkSpec(
        gpus_per_node=8, intra_bw=450e9, intra_efficiency=20.6 / 25, inter_bw=50e9, inter_efficiency=0.94,
        ll_busbw_cap=(141.0e9, 39.0e9, 20.4e9), nvls_busbw=480e9, sources={
            "gpus_per_node": f"{_BASEPOD}: DGX H200 and H100, eight Hopper GPUs, four NVSwitch chips",
            "intra_bw": f"{_H100_DS}: NVLink 900 GB/s (18 NVLink 4 links, both ways) = 450 GB/s a direction",
            "intra_efficiency": f"{TOPO} SM90_NVLINK_BW 20.6 GB/s a link / 25 line; nccl-tests#212: ring ~370 GB/s",
            "inter_bw": f"{_BASEPOD}: eight single-port ConnectX-7, up to 400 Gb/s InfiniBand = 50 GB/s a GPU",
            "inter_efficiency": "nccl-tests#290 (AddyLaddy): 'For NDR @ 400Gbps you should see 46-48GB/s per NIC'",
            "ll_busbw_cap": f"{TUNING} llMaxBws Hopper-N1 141, Intel-N2 39, Intel-N4 20.4 GB/s (Xeon 8480C hosts)",
            "nvls_busbw": "nccl-tests#212 (sjeaugey): NVLS all-reduce on 8 H100s ~480 GB/s busbw; 475 on H200 (#272)",
            "nvls_latency_s": f"{TUNING} hwLatencies NVLINK NVLS Simple 25 us, baseLatencies NVLS 0",
            "tree_efficiency": f"{TUNING}: Tree AllReduce busBw * .92",
            "protocols": f"{TUNING} ncclTunerConstantsDefaults, ncclTopoTuneModel's protocol factors"})


_BASEPOD = "NVIDIA DGX BasePOD reference architecture, Core Components"
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet, Technical Specifications, H100 SXM"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet, Technical Specifications, H200 SXM"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet, 'NVIDIA A100 Tensor Core GPU Specifications', A100 80GB SXM"
_DGX_A100 = "NVIDIA DGX A100 datasheet, System Specifications"
_DENSE = "half the sparse figure; exact in the H100 whitepaper's A100/H100 table (glennklockwood.com/garden)"
_STEPS = "docs/results/forecast/step_kernels_h200.txt"
HOST_RATE = ("measured in this workplace: benchmarks/forecast_host_rate.py, torch 2.11's AdamW over 64 Mi "
             "parameters on the host at one intra-op thread (torchrun sets OMP_NUM_THREADS=1 for each of several "
             "ranks a node, torch 2.13 distributed/run.py) moved the bytes the forecast counts at 6.7 GB/s in fp32 "
             "and 7.0 GB/s in bf16 on the Xeon host of the device tool's H100 (16 cores, 2026-12-07, "
             "docs/results/forecast/offload_h100.txt); on this project's 2-core box, 13.1-13.5 and 5.9-6.3")
_IN_STEP = (f"measured in this workplace over whole training steps, not one kernel: "
            f"benchmarks/forecast_step_kernels.py on an H200 (700 W, torch 2.11), 8B Llama blocks in 5 configs (4-8 "
            f"blocks, 1-4 x 2,048-8,192 tokens), each class's kernels summed from the profile of a step against the "
            f"work the forecast counts for it ({_STEPS})")
_STEPS_H100 = "docs/results/forecast/step_kernels_h100.txt"
_MATMUL_IN_STEP = (f"{_IN_STEP}: matmuls at 0.72 of the bf16 peak over the 5 (0.69-0.74 in steps over 100 ms, 0.77 "
                   f"in a 96 ms one: the clock drops under sustained load; an H100's same steps: 0.73, {_STEPS_H100}); "
                   f"one 8192^3 matmul alone reaches 0.77-0.80")
_ATTENTION_IN_STEP = (f"{_IN_STEP}: causal grouped-query attention, head dim 128, at 0.45 of the bf16 peak over the "
                      f"5 (0.50 at 1 x 8,192 tokens, 0.40 at 4 x 2,048; an H100's same steps: 0.46); torch 2.11 runs "
                      f"cuDNN's flash kernel, which alone reaches 0.52 at sequence 8,192 on an H100 "
                      f"(docs/results/forecast/kernel_rates_h100.txt)")
_MEMORY_H200 = (f"{_IN_STEP}: the other kernels (elementwise, norms, AdamW's foreach updates) moved the bytes the "
                f"forecast counts at 0.67 of 4.8 TB/s (0.63-0.72), 3.2 TB/s; a 1 GiB copy reaches 0.90")
_MEMORY_H100 = ("measured in this workplace over whole training steps: benchmarks/forecast_step_kernels.py on an H100 "
                "SXM (700 W, torch 2.11), the same 5 configs: the other kernels (elementwise, norms, AdamW's foreach "
                f"updates) moved the bytes the forecast counts at 0.78 of 3.35 TB/s (0.75-0.82), 2.6 TB/s ({_STEPS_H100}); "
                "a 1 GiB device-to-device copy alone moves 0.89 (docs/results/forecast/kernel_rates_h100.txt)")


def _hopper_gpu(name: str, hbm_bandwidth: float, hbm_gib: int, sheet: str, smi_mib: int,
                memory_efficiency: float, memory_source: str) -> GpuSpec:
    """A Hopper SXM GPU: the same SMs, clocks and power (700 W) in the H100 and the H200, so the same compute rates;
    their memories differ."""
    return GpuSpec(
        name=name, bf16_flops=989.4e12, tf32_flops=494.7e12, fp32_flops=66.9e12, hbm_bandwidth=hbm_bandwidth,
        hbm_bytes=hbm_gib << 30, matmul_efficiency=0.72, attention_efficiency=0.45,
        memory_efficiency=memory_efficiency, sources={
            "bf16_flops": f"{sheet}: BF16 Tensor Core 1,979 TFLOPS with sparsity; {_DENSE}",
            "tf32_flops": f"{sheet}: TF32 Tensor Core 989 TFLOPS with sparsity; {_DENSE}",
            "fp32_flops": f"{sheet}: FP32 67 TFLOPS; 66.9 in the H100 whitepaper's A100/H100 table",
            "hbm_bandwidth": f"{sheet}: GPU memory bandwidth {hbm_bandwidth / 1e12:g} TB/s",
            "hbm_bytes": f"{sheet}: {hbm_gib} GB, read as GiB (nvidia-smi shows {smi_mib} MiB, some reserved)",
            "matmul_efficiency": _MATMUL_IN_STEP, "attention_efficiency": _ATTENTION_IN_STEP,
            "memory_efficiency": memory_source, "host_bandwidth": HOST_RATE})


def _a100_network() -> NetworkSpec:
    """DGX A100: 8 GPUs on NVLink 3 through 6 NVSwitches, 8 single-port ConnectX-6 at 200 Gb/s, no NVLS."""
    hopper = _hopper_network()
    return replace(
        hopper, intra_bw=300e9, intra_efficiency=20.0 / 25, inter_bw=25e9, inter_efficiency=0.96,
        ll_busbw_cap=(87.7e9, 22.5e9, 19.0e9), nvls_busbw=0.0, sources={**hopper.sources,
            "gpus_per_node": f"{_DGX_A100}: 8x NVIDIA A100 80 GB GPUs, 6 NVSwitches",
            "intra_bw": f"{_A100_DS}: NVLink 600 GB/s (12 NVLink 3 links, both ways) = 300 GB/s a direction",
            "intra_efficiency": f"{TOPO} SM80_NVLINK_BW 20.0 GB/s a link / 25; 232.5 GB/s busbw in nccl-tests#175",
            "inter_bw": f"{_DGX_A100}: 8x single-port ConnectX-6 VPI 200 Gb/s HDR InfiniBand = 25 GB/s a GPU",
            "inter_efficiency": "NVIDIA/nccl#812 (AddyLaddy): 192 GB/s all-reduce busbw on DGX A100, 8x200Gbit/s IB",
            "ll_busbw_cap": f"{TUNING} llMaxBws Ampere-N1 87.7, AMD-N2 22.5, AMD-N4 19.0 GB/s (EPYC 7742 hosts)",
            "nvls_busbw": f"0: {TUNING} nvlsEfficiency is 0 for Ampere (NVLink SHARP came with NVSwitch 3)"})


SHIPPED: dict[str, ClusterSpec] = {
    "h100-sxm": ClusterSpec(name="h100-sxm", description="H100 SXM5 80 GB, NVLink 4 + 8 x 400 Gb/s NDR InfiniBand",
                            gpu=_hopper_gpu("H100 SXM5 80GB", 3.35e12, 80, _H100_DS, 81559, 0.78, _MEMORY_H100),
                            network=_hopper_network()),
    "h200": ClusterSpec(name="h200", description="H200 SXM 141 GB, NVLink 4 + 8 x 400 Gb/s NDR InfiniBand",
                        gpu=_hopper_gpu("H200 SXM 141GB", 4.8e12, 141, _H200_DS, 143771, 0.67, _MEMORY_H200),
                        network=_hopper_network()),
    "a100-sxm": ClusterSpec(
        name="a100-sxm", description="A100 SXM4 80 GB, NVLink 3 + 8 x 200 Gb/s HDR InfiniBand", network=_a100_network(),
        gpu=GpuSpec(name="A100 SXM4 80GB", bf16_flops=312e12, tf32_flops=156e12, fp32_flops=19.5e12,
                    hbm_bandwidth=2.039e12, hbm_bytes=80 << 30, sources={
                        "bf16_flops": f"{_A100_DS}: BFLOAT16 Tensor Core 312 TFLOPS (624 with sparsity)",
                        "tf32_flops": f"{_A100_DS}: TF32 Tensor Core 156 TFLOPS (312 with sparsity)",
                        "fp32_flops": f"{_A100_DS}: FP32 19.5 TFLOPS",
                        "hbm_bandwidth": f"{_A100_DS}: GPU memory bandwidth 2,039 GB/s",
                        "hbm_bytes": f"{_A100_DS}: GPU memory 80GB HBM2e, read as GiB",
                        "matmul_efficiency": "default (GpuSpec)", "attention_efficiency": "default (GpuSpec)",
                        "memory_efficiency": "default (GpuSpec)", "host_bandwidth": HOST_RATE})),
}
"""The clusters a forecast knows by name."""


def load_cluster(text: str) -> ClusterSpec:
    """A shipped cluster by name, or by path a JSON file of `ClusterSpec.to_json`'s shape."""
    if text in SHIPPED:
        return SHIPPED[text]
    if not Path(text).is_file():
        raise UsageError(f"cluster {text!r}: neither a shipped cluster ({', '.join(SHIPPED)}) nor a JSON file")
    try:
        return _record(ClusterSpec, json.loads(Path(text).read_text()), "", text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"cluster {text}: not a readable JSON file ({exc.__class__.__name__}: {exc})") from None
    except UsageError as exc:  # names the field; a figure given without a source is sourced to the file
        raise UsageError(f"cluster {text}: {exc}") from None


def _record(cls, doc, path: str, where: str):
    if not isinstance(doc, dict):
        raise UsageError(f"{path.rstrip('.') or 'the spec'} must be a JSON object, not {type(doc).__name__}")
    known = {f.name: f for f in fields(cls)}
    required = [n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING]
    if unknown := sorted(set(doc) - set(known)):
        raise UsageError(f"unknown field {path}{unknown[0]} (a {cls.__name__} has {', '.join(known)})")
    if missing := [n for n in required if n not in doc]:
        raise UsageError(f"missing field {path}{missing[0]} (a {cls.__name__} needs {', '.join(required)})")
    kwargs = {}
    for name, value in doc.items():
        if name in ("gpu", "network"):
            value = _record(GpuSpec if name == "gpu" else NetworkSpec, value, f"{path}{name}.", where)
        elif name == "protocols":
            listed = value if isinstance(value, list) else [value]
            value = tuple(_record(Protocol, p, f"{path}protocols[{i}].", where) for i, p in enumerate(listed))
        elif isinstance(value, list):
            value = tuple(value)
        elif name == "sources" and not (isinstance(value, dict) and all(isinstance(s, str) for s in value.values())):
            raise UsageError(f"{path}sources must map figure names to strings")
        kwargs[name] = value
    if "sources" in known:  # a figure given with no source is the file's; one left out is the default's
        kwargs["sources"] = {**{n: f"{where} (no source given)" if n in doc else f"default ({cls.__name__}.{n})"
                                for n, f in known.items() if n not in ("name", "sources")
                                and (kwargs[n] if n in doc else f.default) is not None}, **kwargs.get("sources", {})}
    try:
        return cls(**kwargs)
    except UsageError as exc:
        raise UsageError(f"{path}{exc}") from None
