"""Every place a fake world changes torch, declared in one table.

A fake world runs an unmodified script against torch's fake backend, with CUDA mapped to the CPU
where there is none, and optionally with tensors that hold no data; each of those needs torch to
answer something differently. `PATCHES` lists every such change: its targets (the torch names it
replaces or wraps), why, the torch releases whose source it was read against, the modes it applies
to, and the installer that makes it (in `backend`, `devices` or `tensors`). `apply` installs the
rows of a mode whose targets this torch has, and returns their names for the rank's record, so a
result says which rows were active. ``tests/test_fake_patches.py`` checks, in-process, that every
row's targets exist on the installed torch: a torch that renames one fails there, not in a user's
trace.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from . import backend, devices, tensors

FAKE_WORLD = "fake-world"
"""Every rank of a fake world."""
CUDA_MAP = "cuda-map"
"""A fake world on a machine whose torch has no CUDA (`devices.needed`)."""
FAKE_TENSORS = "fake-tensors"
"""``--fake-tensors``: the script runs under FakeTensorMode."""


@dataclass(frozen=True)
class Patch:
    """One change a fake world makes to torch."""

    name: str
    targets: tuple[str, ...]
    """Dotted torch names it replaces or wraps (``torch.nn.parallel.DistributedDataParallel.__init__``)."""
    why: str
    read_at: str
    """The torch releases whose source this was read against."""
    mode: str
    install: Callable[[], None]
    """Idempotent: the fork server installs a row before it forks the ranks, which install it again."""


def resolve(target: str):
    """The object a dotted torch name names, importing its module; AttributeError/ImportError if absent."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module of {target!r} can be imported")


C10D = "torch.distributed.distributed_c10d"
DDP = "torch.nn.parallel.DistributedDataParallel"
MESH = "torch.distributed.device_mesh.DeviceMesh"
LOADER_ITER = "torch.utils.data.dataloader._BaseDataLoaderIter"

PATCHES = (
    Patch("fake backend", (f"{C10D}.init_process_group", "torch.testing._internal.distributed.fake_pg.FakeStore"),
          "whatever backend the script asks for becomes torch's fake one, with a store that needs no peer and the "
          "rank and world the fake world's environment names", "2.11, 2.13", FAKE_WORLD,
          backend.fake_init_process_group),
    Patch("new_group without a device", (f"{C10D}.new_group",),
          "the fake backend binds no device: new_group's device_id is dropped", "2.11, 2.13", FAKE_WORLD,
          backend.deviceless_new_group),
    Patch("recv of ones", (f"{C10D}.recv",),
          "a blocking recv gets no data from the fake backend; ones make pipelining's warm-up vote read as "
          "'static shapes' (torch/distributed/pipelining/schedules.py _warmup_p2p)", "2.13", FAKE_WORLD,
          backend.recv_ones),
    Patch("DDP's all-reduce hook", (f"{DDP}.__init__", f"{DDP}.register_comm_hook"),
          "DDP's built-in hook asserts on the fake work's empty future; a hook issuing the same all-reduce "
          "of the same bucket completes with the bucket", "2.11, 2.13", FAKE_WORLD, backend.hook_ddp),
    Patch("CUDA answered", tuple(f"torch.cuda.{n}" for n in (
              "is_available", "device_count", "current_device", "set_device", "synchronize", "empty_cache",
              "manual_seed", "manual_seed_all", "is_current_stream_capturing", "get_rng_state", "get_rng_state_all",
              "set_rng_state", "set_rng_state_all", "Stream", "Event", "_lazy_init"))
          + ("torch.accelerator.is_available", "torch.accelerator.current_accelerator",
             "torch.accelerator.device_count"),
          "a script written for GPUs takes its GPU path on the CPU: one device per local rank, the CPU's RNG, "
          "no-ops for what moves nothing; what needs a real device (streams, events, a lazy CUDA init) is one "
          "line naming the call", "2.11, 2.13", CUDA_MAP, devices.answer_torch_cuda),
    Patch("CUDA meshes on the CPU", (f"{MESH}.__init__",),
          "init_device_mesh('cuda') builds a CPU mesh, so FSDP2 and DTensor take their CPU path", "2.11, 2.13",
          CUDA_MAP, devices.cpu_device_mesh),
    Patch("DDP without device_ids", (f"{DDP}.__init__",),
          "DDP accepts device_ids / output_device only for GPU modules", "2.11, 2.13", CUDA_MAP,
          devices.ddp_without_device_ids),
    Patch("CUDA devices as the CPU", ("torch.overrides.TorchFunctionMode", "torch.Tensor.cuda"),
          "a TorchFunctionMode turns every CUDA device argument of a torch call (factories' device=, .to, "
          ".cuda()) into the CPU, inside torch's parallel APIs too", "2.11, 2.13", CUDA_MAP, devices.cpu_devices),
    Patch("DeviceMesh on real tensors", (MESH, "torch.distributed.device_mesh.init_device_mesh",
                                         "torch._subclasses.fake_tensor.unset_fake_temporarily"),
          "its rank tables are read back as numbers (tolist), which a FakeTensor cannot answer: every "
          "DeviceMesh method runs with fake mode off", "2.13", FAKE_TENSORS, tensors.real_device_meshes),
    Patch("swap_tensors of fakes", ("torch.utils.swap_tensors",),
          "Module._apply swaps a parameter for its converted copy with swap_tensors, which refuses a tensor "
          "FakeTensorMode holds a weak reference to; two FakeTensors swap through .data", "2.13", FAKE_TENSORS,
          tensors.swap_through_data),
    Patch("DDP's bucket rebuild real", (f"{DDP}._pre_forward",),
          "the rebuild reads what it gathered as numbers", "2.13", FAKE_TENSORS, tensors.ddp_bucket_rebuild_real),
    Patch("DDP's parameter check real", ("torch.distributed.utils._verify_param_shape_across_processes",),
          "DDP's C++ check reads the shapes it gathered back (item)", "2.13", FAKE_TENSORS,
          tensors.ddp_param_check_real),
    Patch("pipelining's vote real", ("torch.distributed.pipelining.schedules._PipelineSchedule._warmup_p2p",),
          "the warm-up vote reads the one-element tensors it received as numbers", "2.13", FAKE_TENSORS,
          tensors.pipeline_vote_real),
    Patch("DataLoader's random draws and indices real", (f"{LOADER_ITER}.__init__", f"{LOADER_ITER}._next_index"),
          "every iterator draws its random base seed with .item() (torch/utils/data/dataloader.py:690-694) and samplers "
          "read their indices back (DistributedSampler: randperm(...).tolist(), distributed.py:112)", "2.13",
          FAKE_TENSORS, tensors.data_loading_real),
    Patch("object collectives real", tuple(f"{C10D}.{n}" for n in tensors.OBJECT_COLLECTIVES),
          "they pickle the rank's own objects into byte tensors and read the sizes back "
          "(distributed_c10d.py:3514 max(object_size_list).item())", "2.13", FAKE_TENSORS,
          tensors.object_collectives_real),
    Patch("format of a 0-dim FakeTensor", ("torch.Tensor.__format__",),
          "Tensor.__format__ formats a 0-dim tensor's item() but leaves a subclass to object.__format__ (a "
          "TypeError for f'{loss:.3f}'); the read is answered like .item()", "2.13", FAKE_TENSORS,
          tensors.format_answers),
    Patch("torch.tensor of FakeTensors", ("torch.tensor", "torch.as_tensor"),
          "a list of 0-dim FakeTensors is read element by element ('data is not allocated yet'; Megatron's grad "
          "norm without Apex, megatron/core/utils.py:1206): it is their stack", "2.13", FAKE_TENSORS,
          tensors.tensor_of_fakes),
    Patch("deepcopy of FakeTensors", ("torch._subclasses.fake_tensor.FakeTensor", "torch.Tensor.__deepcopy__"),
          "Tensor.__deepcopy__ copies a constant FakeTensor's storage, which fails (torch/_tensor.py:174; "
          "torchmetrics' states via Lightning's self.log), and else copies its FakeTensorMode: a clone in the "
          "same mode", "2.13", FAKE_TENSORS, tensors.deepcopy_clones),
    Patch("torch.save without data", ("torch.save", "torch.serialization.skip_data"),
          "pickling a FakeTensor fails and leaves a truncated file; torch's skip_data(materialize_fake_tensors) "
          "writes the structure, and torch.load under fake mode reads FakeTensors back", "2.13", FAKE_TENSORS,
          tensors.save_without_data),
    Patch("coalesced c10d ops on fake tensors", tuple(f"torch.ops.c10d.{n}" for n in tensors.COALESCED)
          + ("torch.distributed._meta_registrations.create_fakework",),
          "FakeTensorMode has no kernel for them (torch registers fake ones for every other c10d op); Megatron's "
          "DDP issues its bucket all-reduces in _coalescing_manager (distributed_c10d.py:2900)", "2.13",
          FAKE_TENSORS, tensors.coalesced_fake_kernels),
)


def present(patch: Patch) -> bool:
    """Whether this torch has every target of `patch`."""
    try:
        for target in patch.targets:
            resolve(target)
    except (AttributeError, ImportError):
        return False
    return True


def modes(fake_tensors: bool) -> set[str]:
    """The modes of a fake world's rank here: the fake backend, CUDA mapped where torch has none, and
    fake tensors when asked for."""
    return {FAKE_WORLD} | ({CUDA_MAP} if devices.needed() else set()) | ({FAKE_TENSORS} if fake_tensors else set())


def apply(modes: set[str]) -> list[str]:
    """Install every row of `modes` whose targets this torch has; the names of those installed."""
    rows = [p for p in PATCHES if p.mode in modes and present(p)]
    for p in rows:
        p.install()
    return [p.name for p in rows]
