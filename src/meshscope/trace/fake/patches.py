"""Every place a fake world changes torch, declared in one table.

A fake world runs an unmodified script against torch's fake backend, with CUDA mapped to the CPU
where there is none, and optionally with tensors that hold no data; each of those needs torch to
answer something differently. `PATCHES` lists every such change: its targets (the torch names it
replaces or wraps), why, the torch releases whose source it was read against, the modes it applies
to, and the installer that makes it (in `backend`, `devices`, `cuda_api`, `cuda_build`, `attention`,
`objects`, `pipeline`, `tensors` or, for a library the script imports, `fbgemm`).
`apply` installs the rows of a mode whose targets this torch has, and returns their names for the rank's record, so a
result says which rows were active. ``tests/test_fake_patches.py`` checks, in-process, that every
row's targets exist on the installed torch: a torch that renames one fails there, not in a user's
trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Callable

from ..entry_points import resolve
from . import (attention, backend, cuda_api, cuda_build, cuda_tensors, devices, fbgemm, known, objects, pipeline,
               receives, replay, storage, tensors)

FAKE_WORLD = "fake-world"
"""Every rank of a fake world."""
CUDA_MAP = "cuda-map"
"""A fake world on a machine whose torch has no CUDA (`devices.needed`)."""
FAKE_TENSORS = "fake-tensors"
"""``--fake-tensors``: the script runs under FakeTensorMode."""
MEASURE_CUDA = "measure-cuda"
"""``--measure-on cuda``: the ranks run their kernels on this host's GPU."""


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
    since: str = ""
    """The first torch release with the targets, where an earlier one lacks them ("": every release read)."""
    until: str = ""
    """The first torch release without them, where the row's job is done otherwise ("": none read)."""
    library: str = ""
    """The package the targets are in where it is not torch (``fbgemm_gpu``): the row applies where it is installed,
    and its installer patches them when the script imports it (`present` does not import it: every rank would pay
    its import)."""


C10D = "torch.distributed.distributed_c10d"
DDP = "torch.nn.parallel.DistributedDataParallel"
MESH = "torch.distributed.device_mesh.DeviceMesh"
MATRIX_OPS = "torch.distributed.tensor._ops._matrix_ops"
LOADER_ITER = "torch.utils.data.dataloader._BaseDataLoaderIter"
PIPELINE = "torch.distributed.pipelining.schedules._PipelineSchedule"

PATCHES = (
    Patch("fake backend", (f"{C10D}.init_process_group", "torch.testing._internal.distributed.fake_pg.FakeStore"),
          "whatever backend the script asks for becomes torch's fake one, with a store that needs no peer and the "
          "rank and world the fake world's environment names", "2.11, 2.13", FAKE_WORLD,
          backend.fake_init_process_group),
    Patch("new_group on the fake backend", (f"{C10D}.new_group",),
          "every subgroup is fake whatever backend it names ('gloo' on the fake store fails in ProcessGroupGloo's "
          "constructor, distributed_c10d.py:2169; 'nccl', 'cpu:gloo,cuda:nccl', DeviceMesh's override); its "
          "device_id and the named backend's pg_options are dropped", "2.11, 2.13", FAKE_WORLD,
          backend.fake_new_group),
    Patch("split_group on the fake backend", (f"{C10D}.split_group",),
          "torch's split needs a device bound to the default group and a backend that splits (NCCL); the rank's "
          "split is made by new_group with use_local_synchronization (members only, a hashed name)", "2.13",
          FAKE_WORLD, backend.fake_split_group),
    Patch("object collectives receive what was sent", tuple(f"{C10D}.{n}" for n in (
              *objects.COLLECTIVES, *objects.RECEIVERS, "_pickler")),
          "the fake backend hands a receiver back its own tensors, so a broadcast_object_list decodes garbage "
          "sizes (distributed_c10d.py:4039); torch's code still issues the calls, and what the sender sent (its "
          "record in objects/, else this rank's own object, its bytes assumed) is put into what it receives into; "
          "a P2P receive of the job's own tensors gets zeros, not torch.empty's garbage (NaN on a later stage)",
          "2.13, 2.15", FAKE_WORLD, objects.deliver_objects),
    Patch("pipelining's vote taken alone", ("torch.distributed.pipelining.schedules._PipelineSchedule._warmup_p2p",
                                            "torch.distributed.pipelining._utils.InferenceMode.needs_dynamic"),
          "the warm-up vote (static shapes or inference over P2P) multiplies every stage's vote over P2P, which "
          "the fake backend does not carry: a rank's stages take their own stages' vote (2.15 votes by an all_reduce, "
          "which returns this rank's own)", "2.13", FAKE_WORLD, pipeline.vote_alone, until="2.15"),
    Patch("pipelining's stage metadata from any replica",
          ("torch.distributed.pipelining.stage.PipelineStage._send_meta",
           "torch.distributed.pipelining.stage.PipelineStage._recv_meta",
           "torch.distributed.pipelining._utils._derive_grad_metas",
           "torch.distributed.pipelining._utils._StageBackwardMeta"),
          "shape inference receives metadata from the neighbouring stages, whose ranks may run after this one in "
          "a fake world: the same stage's message from any traced rank, else (gradients) torch's own rule from this "
          "stage's outputs, its bytes assumed", "2.13, 2.15", FAKE_WORLD, pipeline.stage_metadata),
    Patch("get_backend as asked", (f"{C10D}.get_backend", "torch.distributed.ProcessGroup.name",
                                   "torch.distributed.ProcessGroup._get_backend_name", f"{C10D}.BackendConfig",
                                   "torch.accelerator.current_accelerator"),
          "every group is a fake one, whose backend torch names 'fake' (its name() 'custom'); a library maps the "
          "name to a device (Colossal-AI 0.5.0 device/device_mesh.py:109) or picks a path by it (torch's "
          "nn/functional.py:413, DeviceMesh's device set-up, pipelining's set-up at 2.15, Colossal-AI's "
          "pipeline/p2p.py:160 by name()): it is the backend the script named for the group, as torch keeps it, "
          "and name() the default backend torch makes of it", "2.13", FAKE_WORLD, backend.backend_as_asked),
    Patch("pipelining's per-edge set-up on the fake backend", (f"{PIPELINE}._initialize_pipeline_distributed_state",),
          "torch 2.15 runs the set-up (the shape vote, the stages' preconnect) only off the fake backend, as the "
          "backend asked for is; with per-edge groups it would ask the fake backend for a device map it has not, "
          "so that set-up sees 'fake'", "2.15", FAKE_WORLD, pipeline.per_edge_setup_as_fake, since="2.15"),
    Patch("DDP's all-reduce hook", (f"{DDP}.__init__", f"{DDP}.register_comm_hook", f"{DDP}._check_comm_hook",
                                    f"{DDP}._register_builtin_comm_hook", "torch.distributed._register_comm_hook",
                                    "torch.distributed.BuiltinCommHookType",
                                    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook",
                                    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook",
                                    "torch._C._distributed_c10d._create_work_from_future"),
          "DDP's built-in hook asserts on the fake work's empty future; a hook issuing the same all-reduce "
          "of the same bucket completes with the bucket; a hook registered through register_comm_hook (the "
          "script's, or torch's for mixed_precision) takes its place in the reducer's one slot, the works it "
          "issues carrying their outputs as gloo's do; a built-in one (_register_builtin_comm_hook) as the Python "
          "hook torch writes alike (default_hooks.py)", "2.11, 2.13", FAKE_WORLD, backend.hook_ddp),
    Patch("CUDA answered", tuple(cuda_api.ANSWERS),
          "a script written for GPUs takes its GPU path on the CPU, and torch's own uses of torch.accelerator (the "
          "optimizers' current stream, DataLoader's pinning) agree: one device per local rank, the CPU's RNG, "
          "streams and events that do nothing, the stand-in GPU's properties and memory (--fake-device); every other "
          "public function of torch.cuda and torch.accelerator raises one line naming the call when it needs a device",
          "2.11, 2.13", CUDA_MAP, cuda_api.answer_torch_cuda),
    Patch("Dynamo's current stream answered", ("torch._dynamo.utils.get_current_stream",
                                                "torch._dynamo.guards.get_current_stream"),
          "every Dynamo trace takes the current stream, and its compiled code asks for it again through a C++ "
          "binding at torch 2.15 (a Python function asking torch.accelerator at 2.13), which refuses the CPU "
          "stand-in on a CUDA build without a GPU; it asks the answered torch.accelerator instead", "2.13, 2.15",
          CUDA_MAP, cuda_api.dynamo_current_stream),
    Patch("CUDA's gate named", ("torch.cuda._lazy_init", "torch._utils._dummy_type"),
          "torch.cuda's lazy init and a CPU build's placeholders for CUDA's C++ types (CUDAGraph, MemPool) raise one "
          "line naming the call instead of 'not compiled with CUDA' or 'dummy base class'", "2.11, 2.13", CUDA_MAP,
          cuda_api.unmapped_lazy_init),
    Patch("CUDA generators as the CPU's", ("torch.Generator", "torch._C.Generator"),
          "torch.Generator(device='cuda') needs ATen's CUDA library (nanotron 2411b02 data/dataloader.py:134): "
          "a subclass of torch's makes it the CPU's, its device the CUDA one it stands for", "2.13", CUDA_MAP,
          cuda_build.cuda_generators),
    Patch("CUDA bindings named", ("torch._C", "torch.cuda._is_compiled"),
          "a library reads torch._C's CUDA bindings at import once CUDA is available (bitsandbytes 0.50.2 "
          "backends/cuda/ops.py:69, via Colossal-AI 0.5.0's booster): every _cuda_* function torch's stub declares "
          "and a CPU build lacks is there, raising one line naming it when called; _cuda_getDeviceCount stays "
          "missing, torch's own test of a CUDA build", "2.13", CUDA_MAP, cuda_build.cuda_bindings),
    Patch("NCCL available", (f"{C10D}.is_nccl_available", f"{C10D}.is_backend_available"),
          "the world's groups present as nccl, and a library takes a path torch lacks where NCCL is not "
          "(Colossal-AI 0.5.0 pipeline/p2p.py:159 is_hccl_available); torch's own checks of a ProcessGroupNCCL "
          "find none", "2.13", CUDA_MAP, cuda_build.nccl_available),
    Patch("CUDA meshes on the CPU", (f"{MESH}.__init__",),
          "init_device_mesh('cuda') builds a CPU mesh, so FSDP2 and DTensor take their CPU path", "2.11, 2.13",
          CUDA_MAP, devices.cpu_device_mesh),
    Patch("DDP without device_ids", (f"{DDP}.__init__",),
          "DDP accepts device_ids / output_device only for GPU modules", "2.11, 2.13", CUDA_MAP,
          devices.ddp_without_device_ids),
    Patch("CUDA devices as the CPU", (
              "torch.overrides.TorchFunctionMode", "torch.overrides._get_current_function_mode_stack", "torch.Tensor.cuda",
              "torch.Tensor.to", "torch.Tensor.cpu", "torch.autograd.graph._engine_run_backward",
              "torch._C._nn._parse_to", "torch._dynamo.eval_frame._TorchDynamoContext.__call__"),
          "a TorchFunctionMode turns every CUDA device argument of a torch call (factories' device=, .to, .cuda(), an "
          "ordinal as a CUDA build reads one) into the CPU, inside torch's parallel APIs too, and around autograd's "
          "engine so backward functions see it (the mode is off inside its own handler, backward() included); "
          "Module.to's C++ parser reads an ordinal as a CUDA device; what the script put on a GPU, and what any "
          "torch call (a compiled region as one) made of it, is marked as standing for a CUDA tensor", "2.13",
          CUDA_MAP, devices.cpu_devices),
    Patch("CUDA tensors answered as such", (
              "torch.Tensor.device", "torch.Tensor.is_cuda", "torch.Tensor.is_cpu", "torch.Tensor.type",
              "torch.Tensor.get_device", "torch._subclasses.fake_tensor.FakeTensor.device",
              "torch.utils.checkpoint._allowed_determinism_checks_to_fns"),
          "a tensor marked as standing for a CUDA one answers device, is_cuda, is_cpu, type() and get_device() as a "
          "GPU's, outside the torch calls the devices mode hands on (megatron-core 0.16.1 asserts param.grad.type() == 'torch.cuda.FloatTensor' when "
          "it clips, by default); checkpointing's recomputation check reads where tensors are (a forward's saved "
          "output is read before its op returns, so before it is marked)", "2.13", CUDA_MAP, cuda_tensors.answered),
    Patch("pinned memory unpinned", ("torch.Tensor.pin_memory",),
          "pinning needs an accelerator's allocator: Tensor.pin_memory() returns the tensor (DataLoader pins in a "
          "thread of its own)", "2.13", CUDA_MAP, devices.unpinned_memory),
    Patch("record_stream on the CPU", ("torch.Tensor.record_stream", "torch.ops.aten.record_stream.default",
                                       "torch.library.Library"),
          "aten::record_stream has kernels for CUDA and Meta only, so a CPU tensor standing for a CUDA one raised "
          "NotImplementedError (DeepSpeed 0.19.8 ZeRO-1/2 with overlap_comm, runtime/zero/stage_1_and_2.py:1531; "
          "ZeRO-3's parameter gather, runtime/zero/partition_parameters.py:327); the CPU's kernel does nothing (a "
          "fake world's streams order nothing and its memory is not reused early)", "2.13", CUDA_MAP,
          devices.streamless_tensors),
    Patch("CUDA's fused RMSNorm", ("torch.ops.aten._fused_rms_norm", "torch.ops.aten._fused_rms_norm_backward"),
          "rms_norm runs _fused_rms_norm, one kernel on CUDA (autograd keeps the input and one fp32 per row), the CPU's "
          "composite of seven fp32 ops whose intermediates autograd keeps: CPU kernels from torch's decompositions make "
          "the CPU dispatch as CUDA does (memory and traffic as the GPU's)", "2.13", CUDA_MAP, devices.fused_rms_norm),
    Patch("SDPA as cuDNN's attention", ("torch.nn.functional.scaled_dot_product_attention",
                                         "torch.ops.aten._scaled_dot_product_cudnn_attention",
                                         "torch.ops.aten._scaled_dot_product_cudnn_attention_backward"),
          "a Hopper GPU's SDPA runs cuDNN's attention, the CPU standing for it its own flash kernel, which a selective "
          "checkpointing policy that saves attention by op name recomputes (torchtitan 0.2.2's _op_sac_save_list): "
          "called as cuDNN's where torch would take it, its CPU kernels computed by the CPU's flash kernel", "2.13",
          CUDA_MAP, attention.cudnn_attention),
    Patch("CUDA's half-precision matmuls", tuple(f"torch.ops.aten.{n}" for n in ("mm", "addmm", "bmm", "baddbmm")),
          "a bf16 or fp16 matrix product on a CPU without bf16 units takes a hundred times fp32's (1.31 s against 13 ms "
          "for a 512 x 1024 by 1024 x 1024 mm on an AVX2 CPU): computed in fp32 and rounded once, as tensor cores "
          "accumulate", "2.13", CUDA_MAP, devices.half_precision_matmuls),
    Patch("CUDA's histc of integers", ("torch.histc", "torch.Tensor.histc"),
          "the CPU's histc (and its meta function) refuses integers, CUDA's counts them in their dtype (torchtitan "
          "0.2.2's MoE router, models/moe/moe.py:348): counted as float64, returned in the input's dtype", "2.13",
          CUDA_MAP, devices.integer_histc),
    Patch("triton kernels interpreted", ("triton.runtime.jit.JITFunction",),
          "a script's own triton kernel launched on the CPU tensors standing for the GPU's asks triton's NVIDIA "
          "driver for libcuda (torchtitan 0.2.2's MoE token permutation, models/moe/kernels.py:207); triton's "
          "interpreter runs it on the CPU (TRITON_INTERPRET, read when a kernel is decorated)", "2.13 (triton 3.8)",
          CUDA_MAP, devices.interpreted_triton_kernels, library="triton"),
    Patch("CUDA checkpoints on the CPU", ("torch.serialization.register_package",
                                          "torch.serialization.default_restore_location"),
          "torch.load's storages tagged or mapped to cuda (map_location='cuda:N', a cuda device, a GPU's checkpoint) "
          "stay on the CPU: a deserializer before CUDA's, through torch's hook for devices", "2.13", CUDA_MAP,
          devices.cuda_checkpoints_on_cpu),
    Patch("inductor without triton's GPU", ("torch.utils._triton.has_triton",),
          "with triton installed, the mapped CUDA makes has_triton() true and inductor's first compile asks "
          "triton's NVIDIA driver for libcuda; with device detection off it compiles the mapped (CPU) tensors "
          "as CPU code", "2.13", CUDA_MAP, devices.inductor_without_triton_devices),
    Patch("DTensor's rule for the CPU flash attention", (
              f"{MATRIX_OPS}._scaled_dot_product_flash_attention_base_strategies",
              f"{MATRIX_OPS}._scaled_dot_product_flash_attention_backward_base_strategies",
              "torch.distributed.tensor._ops.utils.register_op_strategy",
              "torch.distributed.tensor._ops.utils.expand_to_full_mesh_op_strategy",
              "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default",
              "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default"),
          "F.scaled_dot_product_attention on the CPU standing in for CUDA picks the CPU's flash kernel, which DTensor "
          "cannot shard; it gets DTensor's rule for CUDA's flash kernel, so DTensor redistributes as on the GPU",
          "2.13", CUDA_MAP, attention.cpu_flash_attention_rule),
    Patch("flex attention's backward on the CPU", ("torch.nn.attention.flex_attention.flex_attention",
                                                    "torch.nn.attention.flex_attention._validate_device"),
          "flex_attention refuses a backward on the CPU by its device alone, and inductor has no CPU kernel for "
          "it: the CPU standing for CUDA passes the check and every call runs eagerly, its dense backward",
          "2.13, 2.15", CUDA_MAP, attention.cpu_flex_attention),
    Patch("DeviceMesh on real tensors", (MESH, "torch.distributed.device_mesh.init_device_mesh",
                                         "torch._C._unset_dispatch_mode", "torch._C._set_dispatch_mode",
                                         "torch._C._TorchDispatchModeKey.FAKE"),
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
    Patch("pipelining's vote real", (f"{PIPELINE}._warmup_p2p",),
          "the warm-up vote reads the one-element tensors it received as numbers", "2.13", FAKE_TENSORS,
          tensors.pipeline_vote_real, until="2.15"),
    Patch("pipelining's set-up real", (f"{PIPELINE}._initialize_pipeline_distributed_state",),
          "the set-up that replaces the warm-up vote at torch 2.15 reads its all-reduced vote as a number", "2.15",
          FAKE_TENSORS, tensors.pipeline_setup_real, since="2.15"),
    Patch("DataLoader's random draws and indices real", (f"{LOADER_ITER}.__init__", f"{LOADER_ITER}._next_index"),
          "every iterator draws its random base seed with .item() (torch/utils/data/dataloader.py:690-694) and samplers "
          "read their indices back (DistributedSampler: randperm(...).tolist(), distributed.py:112)", "2.13",
          FAKE_TENSORS, tensors.data_loading_real),
    Patch("object collectives real", tuple(f"{C10D}.{n}" for n in tensors.OBJECT_COLLECTIVES),
          "they pickle the rank's own objects into byte tensors and read the sizes back "
          "(distributed_c10d.py:3514 max(object_size_list).item())", "2.13", FAKE_TENSORS,
          tensors.object_collectives_real),
    Patch("flex attention uncompiled", ("torch.nn.attention.flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG",),
          "flex_attention compiles its higher-order op with fullgraph=True, and Dynamo compiles no frame under the "
          "recording dispatch mode; torch's own switch calls the op directly, which FakeTensorMode answers",
          "2.13, 2.15", FAKE_TENSORS, tensors.flex_attention_uncompiled),
    Patch("torch.compile eager by its stance", ("torch.compiler.set_stance",),
          "Dynamo compiles no frame while the recording dispatch mode is on the stack (torch 2.13 and 2.15 "
          "_dynamo/convert_frame.py: every frame is skipped, and checked again at its next call): a compiled "
          "function ran eagerly, each of its frames through Dynamo's callback (2,754 in one rank of torchtitan "
          "0.3.0), and one compiled with fullgraph=True raised that it found no compiled frames; the "
          "'force_eager' stance runs them eagerly without either", "2.13, 2.15", FAKE_TENSORS,
          tensors.compiled_code_eager,
          since="2.6"),
    Patch("format of a 0-dim FakeTensor", ("torch.Tensor.__format__",),
          "Tensor.__format__ formats a 0-dim tensor's item() but leaves a subclass to object.__format__ (a "
          "TypeError for f'{loss:.3f}'); the read is answered like .item()", "2.13", FAKE_TENSORS,
          tensors.format_answers),
    Patch("torch.tensor of FakeTensors", ("torch.tensor", "torch.as_tensor", "torch.jit._builtins._find_builtin",
                                          "torch.jit._builtins._register_builtin"),
          "a list of 0-dim FakeTensors is read element by element ('data is not allocated yet'; Megatron's grad "
          "norm without Apex, megatron/core/utils.py:1206): it is their stack; each wrapper is registered in "
          "TorchScript's table of builtins as the op it wraps, which TorchScript resolves by identity (else it "
          "compiles the wrapper from source and fails: import torch.distributed.optim)", "2.13", FAKE_TENSORS,
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
    Patch("tensor collectives receive what was sent", tuple(f"{C10D}.{n}" for n in receives.TARGETS),
          "the fake backend hands a receiver its own tensor: a broadcast's receiver kept its own value (DeepSpeed "
          "0.19.8's ZeRO-3 module-trace check failed on every rank but 0), an uneven all-to-all's counts disagreed "
          "with what they size (TorchRec's KJT all-to-alls); what the traced sender sent (its record in objects/, "
          "payloads up to a cap) is put into what the rank receives into, after the object collectives' row "
          "(whose own calls it leaves to them); else the rank's own integers are noted and what they sized assumed",
          "2.13", FAKE_WORLD, replay.replay_tensors),
    Patch("torch.cpu's streams watched", ("torch.cpu.Stream.wait_stream", "torch.cpu.Stream.record_event",
                                           "torch.cpu.Stream.wait_event", "torch.cpu.Event.record",
                                           "torch.cpu.Event.wait"),
          "a fake world's CUDA mesh is a CPU mesh, so FSDP2 orders its copy-in, all-gather and reduce-scatter "
          "streams with torch.cpu's, which do nothing (record_event returns None); --work's forecast needs those "
          "orders (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_init.py _get_device_from_mesh, torch/cpu/__init__.py)",
          "2.13", FAKE_WORLD, cuda_api.cpu_streams_watched),
    Patch("Work.wait watched", ("torch._C._distributed_c10d.Work.wait",),
          "where the job waits for a call is where its stream needs it on a GPU, read or not (NCCL's Work.wait "
          "orders the current stream after the call's kernel); c10d waits so for every call not async_op, and "
          "Megatron's distributed optimizer all-gathers its parameters so, each model chunk's read only when that "
          "chunk's forward runs (megatron/core/distributed/param_and_grad_buffer.py start_param_sync); --work's "
          "forecast needs those waits (torch 2.13 distributed_c10d.py, _coalescing_manager)", "2.11, 2.13",
          FAKE_WORLD, cuda_api.work_waits_watched),
    Patch("torch.cuda's streams watched", ("torch.cuda.Stream.wait_stream", "torch.cuda.Stream.record_event",
                                            "torch.cuda.Stream.wait_event", "torch.cuda.Event.record",
                                            "torch.cuda.Event.wait"),
          "--measure-on cuda times each stream's work on the GPU; the forecast needs which stream each op ran on "
          "and the orders the job puts between them (FSDP2's copy-in, all-gather and reduce-scatter streams, torch "
          "2.13 distributed/fsdp/_fully_shard/_fsdp_param_group.py): each is reported, then done as asked", "2.11, 2.13",
          MEASURE_CUDA, cuda_api.cuda_streams_watched),
    Patch("DTensor's sharding propagation is not the job's work",
          ("torch.distributed.tensor._sharding_prop.ShardingPropagator._propagate_tensor_meta_non_cached",),
          "it runs each new op again at its global shape on tensors of its own, in the fake mode it finds (the "
          "job's under --fake-tensors, else one it makes), where --work would count those FLOPs and hold those "
          "tensors as the rank's: with real tensors (--measure-on) its cached results held 2 copies of AdamW's "
          "state at step 0 under FSDP2 (torch 2.13 distributed/tensor/_sharding_prop.py:546)", "2.11, 2.13", FAKE_WORLD,
          tensors.sharding_propagation_uncounted),
    Patch("triton kernels on known values", ("triton.runtime.interpreter.InterpretedFunction.run",),
          "under --fake-tensors an interpreted kernel's tensors are FakeTensors, which it cannot read: it runs on "
          "their values where all are known (torchtitan 0.2.2's MoE token permutation from balanced routing), and "
          "is skipped otherwise, what it could write no longer known (trace/fake/known.py)", "2.13 (triton 3.8)",
          FAKE_TENSORS, known.interpreted_kernels_on_known_values, library="triton"),
    Patch("FSDP2's chunks made where read", ("torch.distributed.fsdp._fully_shard._fsdp_param._chunk_with_empty",),
          "FSDP2 cuts each parameter into one chunk per rank of its shard group and reads this rank's and the first "
          "(torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py:298, 569); under --fake-tensors each chunk is "
          "a FakeTensor made in Python, most of a 1,024-rank trace's set-up: they are made when read, the same "
          "views", "2.13", FAKE_TENSORS, tensors.fsdp_chunks_on_demand),
    Patch("storage resizes counted", ("torch.UntypedStorage.resize_",),
          "FSDP2 frees its gathered parameters by resizing their storage to 0 and refills it before the next "
          "gather (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py free_storage, alloc_storage), below "
          "every dispatch mode: --work's count of live bytes is told each resize", "2.13", FAKE_WORLD,
          storage.resizes_watched),
    Patch("fbgemm's CUDA embedding tables on the CPU", (f"{fbgemm.TBE}.__init__",),
          "TorchRec's sharded tables on its CUDA path are fbgemm's CUDA table-batched embeddings, whose lookup "
          "refuses the CPU tensors standing for the GPU's ('weights[0] must be a GPU or MTIA tensor', fbgemm-gpu-cpu "
          "1.8.0); one whose specs name ComputeDevice.CUDA is built as TorchRec builds it on the CPU (every table "
          "HOST on ComputeDevice.CPU, torchrec 1.8.0 distributed/batched_embedding_kernel.py:3751-3753), its device "
          "the CUDA one: TorchRec issues the collectives around it, as on the GPU, and it issues none",
          "2.13 (fbgemm-gpu-cpu 1.8.0, torchrec 1.8.0)", CUDA_MAP, fbgemm.patch, library="fbgemm_gpu"),
)


def release(version: str) -> tuple[int, ...]:
    """'2.15.0+cu132' -> (2, 15): a torch release, as the rows' bounds name it."""
    return tuple(int(part) for part in version.split("+")[0].split(".")[:2])


def meant_for(patch: Patch, version: str) -> bool:
    """Whether torch `version` lies within `patch`'s releases (its targets should exist there)."""
    return (not patch.since or release(version) >= release(patch.since)) and (
        not patch.until or release(version) < release(patch.until))


def present(patch: Patch) -> bool:
    """Whether this torch has every target of `patch`; for a library's row, whether the library is installed."""
    if patch.library:
        return find_spec(patch.library) is not None  # found, not imported
    try:
        for target in patch.targets:
            resolve(target)
    except (AttributeError, ImportError):
        return False
    return True


def modes(fake_tensors: bool, measure_on: str = "") -> set[str]:
    """The modes of a fake world's rank here: the fake backend, CUDA mapped where torch has none, fake tensors
    when asked for, the GPU's streams watched where its clock times the work."""
    return ({FAKE_WORLD} | ({CUDA_MAP} if devices.needed() else set()) | ({FAKE_TENSORS} if fake_tensors else set())
            | ({MEASURE_CUDA} if measure_on == "cuda" else set()))


def apply(modes: set[str]) -> list[str]:
    """Install every row of `modes` whose targets this torch has; the names of those installed."""
    rows = [p for p in PATCHES if p.mode in modes and present(p)]
    for p in rows:
        p.install()
    return [p.name for p in rows]
