"""The stand-in GPU of a fake world: what torch.cuda's device and memory queries answer on a CPU.

Frameworks ask the device what it is before they train: torchtitan's memory monitor reads
``get_device_name`` and ``get_device_properties(...).total_memory`` and resets the peak statistics
(torchtitan 0.2.2 components/metrics.py:42-95), Lightning picks matmul precision from
``get_device_capability`` (lightning/fabric/accelerators/cuda.py:160). ``meshscope trace --fake-world
N --fake-device NAME`` answers them as one GPU of `GPUS` per local rank (`DEFAULT` without the flag):
its name, memory, compute capability and SM count, as ``torch.cuda.get_device_properties`` reports
them on that GPU (``total_memory`` is the driver's ``totalGlobalMem``, a little below the memory on
the box). Its memory statistics are zeros, and say so in the result: a fake world's tensors live in
the CPU's memory, so there is no device allocator to count. `answered` names the calls answered on
this rank, for its record and the result's note.

This module holds data and answers only; `cuda_api` installs them into torch.cuda and torch.accelerator.
It imports no torch at import: the launcher validates ``--fake-device`` with `GPUS`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Gpu:
    """One stand-in GPU, as ``torch.cuda.get_device_properties`` describes it on that GPU (every field of
    torch 2.13's ``_CudaDeviceProperties`` but the ones that name one card: ``uuid``, ``pci_*``)."""

    name: str
    total_memory: int
    """Bytes: the driver's ``totalGlobalMem``."""
    major: int
    minor: int
    multi_processor_count: int
    L2_cache_size: int
    clock_rate: int
    """kHz."""
    memory_clock_rate: int
    """kHz."""
    memory_bus_width: int
    """Bits."""
    shared_memory_per_multiprocessor: int
    shared_memory_per_block_optin: int
    shared_memory_per_block: int = 49_152
    max_threads_per_block: int = 1024
    max_threads_per_multi_processor: int = 2048
    regs_per_multiprocessor: int = 65_536
    warp_size: int = 32
    is_integrated: int = 0
    is_multi_gpu_board: int = 0

    @property
    def gcnArchName(self) -> str:  # torch's name (ROCm's); a CUDA build gives the device's name
        return self.name

    def __repr__(self) -> str:  # as torch's _CudaDeviceProperties prints itself (MB: // 2**20)
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count}, "
                f"L2_cache_size={self.L2_cache_size // 2**20}MB)")

    def __getattr__(self, attr: str):  # a property the stand-in does not know: say which it knows
        known = ", ".join([f.name for f in fields(self)] + ["gcnArchName"])
        raise AttributeError(f"the fake world's stand-in {self.name} has no property {attr!r} (it answers {known})")


GPUS = {
    # torch.cuda.get_device_properties(0) on the device machine's H200 (torch 2.11 CUDA 13.0, 2026-12-01)
    "H200": Gpu("NVIDIA H200", 150_109_880_320, 9, 0, 132, L2_cache_size=62_914_560, clock_rate=1_980_000,
                memory_clock_rate=3_201_000, memory_bus_width=6016, shared_memory_per_multiprocessor=233_472,
                shared_memory_per_block_optin=232_448),
    # NVIDIA's H100 SXM5: the H200's die (132 SMs, 9.0, 1.98 GHz, 228 KiB of shared memory per SM) with 50 MiB
    # of L2 and 5 HBM3 stacks (5120 bits; 3.35 TB/s is a 2619 MHz memory clock); totalGlobalMem 81559 MiB
    # (85520809984 B: nvidia-smi and cudaGetDeviceProperties agree, modal-labs/modal-client#2797)
    "H100": Gpu("NVIDIA H100 80GB HBM3", 85_520_809_984, 9, 0, 132, L2_cache_size=52_428_800, clock_rate=1_980_000,
                memory_clock_rate=2_619_000, memory_bus_width=5120, shared_memory_per_multiprocessor=233_472,
                shared_memory_per_block_optin=232_448),
    # NVIDIA's A100 SXM4 40 GB as deviceQuery prints it (bottlerocket-os/bottlerocket#3873 and a PC2 cluster
    # page): 108 SMs, 8.0, 1410 MHz, 1215 MHz memory over 5120 bits, 40 MiB of L2, 164 KiB of shared memory per
    # SM (163 KiB for one block); totalGlobalMem 42298834944 B (drivers differ by about 0.3 %)
    "A100": Gpu("NVIDIA A100-SXM4-40GB", 42_298_834_944, 8, 0, 108, L2_cache_size=41_943_040, clock_rate=1_410_000,
                memory_clock_rate=1_215_000, memory_bus_width=5120, shared_memory_per_multiprocessor=167_936,
                shared_memory_per_block_optin=166_912),
}
"""``--fake-device`` names -> the stand-in GPU."""

DEFAULT = "H100"

chosen: Gpu = GPUS[DEFAULT]
"""The stand-in GPU of this rank (`choose`)."""

answered: list[str] = []
"""The device and memory calls this rank answered, each named once, in the order first met."""


def lookup(name: str) -> str | None:
    """The `GPUS` key ``name`` stands for (any case), or None."""
    return next((key for key in GPUS if key.lower() == name.lower()), None)


def choose(name: str) -> None:
    global chosen
    chosen = GPUS[lookup(name) or DEFAULT]


def properties(device=None) -> Gpu:
    return chosen


def name(device=None) -> str:
    return chosen.name


def capability(device=None) -> tuple[int, int]:
    return chosen.major, chosen.minor


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total): nothing is allocated on the stand-in."""
    return chosen.total_memory, chosen.total_memory


_POOLS = ("all", "large_pool", "small_pool")
_METRICS = ("current", "peak", "allocated", "freed")
_CORE = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
         "inactive_split_bytes", "requested_bytes")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


def memory_stats_nested(device=None) -> dict:
    """The caching allocator's statistics as ``torch.cuda.memory_stats_as_nested_dict`` returns them, all
    zero (its keys: the ones the device machine's H200 gave, torch 2.11, and torch.cuda.memory_stats'
    docstring in 2.13)."""
    metrics = {m: 0 for m in _METRICS}
    return {**{core: {pool: dict(metrics) for pool in _POOLS} for core in _CORE}, **{c: 0 for c in _COUNTERS},
            "max_split_size": -1, "oversize_allocations": dict(metrics), "oversize_segments": dict(metrics)}


def memory_stats(device=None) -> dict:
    """`memory_stats_nested` flattened as torch.cuda.memory_stats flattens it (``allocated_bytes.all.peak``)."""
    import collections

    flat: list[tuple[str, int]] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat.append((prefix, value))

    walk("", memory_stats_nested())
    return collections.OrderedDict(sorted(flat))


def zero(device=None) -> int:
    return 0


def nothing(*args, **kwargs) -> None:
    return None


def note(calls: list[str], gpu: Gpu) -> str:
    """The result's note on the stand-in GPU."""
    memory = [c for c in calls if "memory" in c or c.endswith("mem_get_info")]
    return (f"stand-in GPU: {', '.join(calls)} answered as an {gpu.name} ({gpu.total_memory / 1e9:.1f} GB, "
            f"capability {gpu.major}.{gpu.minor}, {gpu.multi_processor_count} SMs; --fake-device)"
            + ("; its memory statistics are zeros: a fake world's tensors live in the CPU's memory" if memory else ""))
