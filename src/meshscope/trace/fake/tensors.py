"""``meshscope trace --fake-world N --fake-tensors``: a fake world's rank whose tensors have no data.

A fake world's rank still builds its model and computes its steps for real: at 1,024 ranks of an
8-layer, dim-1024 transformer that is seconds of arithmetic per rank class and the full model in
memory before it is sharded. With ``--fake-tensors`` the script runs inside torch's
``FakeTensorMode``: every tensor it makes (parameters, activations, gradients, optimizer state) is a
FakeTensor, a shape, dtype and device without storage, so a model of any size takes no memory and a
step costs only the Python of its ops. The script issues the same calls with the same shapes (its
c10d calls reach the fake backend; FakeTensorMode answers the functional ones, DTensor's, itself), so
the ledger is the same call for call (`tests/test_fake_tensors.py` holds it against the fake world
with real tensors). FakeTensorMode answers every op before the dispatcher's ``BackendSelect``
kernels run, so the calls are recorded by `capture.dispatch.ModeRecorder`, a dispatch mode above it,
through the same decoders (``--recorder`` does not apply).

What a script meets here, and how it is handled (each a row of `patches.PATCHES`, installed here):

- **DeviceMesh** keeps real tensors: its rank tables are read back as Python ints (``tolist``), which
  a FakeTensor cannot answer, so every DeviceMesh method runs with fake mode off
  (``unset_fake_temporarily``); the mesh is bookkeeping, not data. So do DDP's parameter check and
  bucket rebuild and pipelining's warm-up vote, for the same reason.
- **Module.to / .cuda / .float** of fake parameters: torch's ``Module._apply`` swaps a FakeTensor
  parameter for its converted copy with ``torch.utils.swap_tensors``, which refuses a tensor that
  FakeTensorMode holds a weak reference to; two FakeTensors are swapped through ``.data`` instead.
- **A DataLoader** draws its base seed with ``torch.empty((), dtype=torch.int64).random_().item()``
  (torch/utils/data/dataloader.py:690-694, every iterator, torchdata's StatefulDataLoader's too) and
  its sampler reads indices back (``DistributedSampler``: ``randperm(...).tolist()``,
  distributed.py:112): the iterator's set-up and its index sampling run with fake mode off, so the
  indices are the real ones; the dataset's items stay what the script made.
- **Object collectives** (``all_gather_object``, ``broadcast_object_list``, ...) pickle the rank's own
  objects into byte tensors and read their sizes back (distributed_c10d.py:3514): they run with fake
  mode off, on the rank's own bytes, as in a fake world with real tensors.
- **What needs no value**: ``copy.deepcopy`` of a FakeTensor is its clone in the same fake mode
  (torch's deepcopy copies storage, or the fake mode itself); ``torch.tensor([...])`` of 0-dim
  FakeTensors (Megatron's grad norm without Apex) is their stack, a FakeTensor of the list's shape;
  ``torch.save`` writes the structure without data (``torch.serialization.skip_data``), so a file is
  whole and a later ``torch.load`` in the rank gets FakeTensors of the same shapes; c10d's coalesced
  ops (Megatron's DDP in ``_coalescing_manager``, distributed_c10d.py:2900) get the fake kernels torch
  declares for the others (torch/distributed/_meta_registrations.py).
- **flex_attention** compiles its higher-order op itself (``torch.compile(..., fullgraph=True)``, torch
  2.13 and 2.15 nn/attention/flex_attention.py), which fails here: Dynamo compiles no frame while a
  dispatch mode that does not ignore compile internals is on the stack (the recorder above
  FakeTensorMode; torch 2.15 _dynamo/convert_frame.py), so every ``torch.compile`` runs eagerly, by
  torch's ``force_eager`` stance (`compiled_code_eager`: without it a ``fullgraph=True`` compile raises
  that it found no compiled frames); torch's own switch for running the op uncompiled
  (``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``) calls it directly, and FakeTensorMode answers it.
- **Reading a value** (``loss.item()``, ``float(norm)``, ``f"{loss:.3f}"``, ``if mask.any():``) is
  answered with a placeholder and counted by where it was read; an op whose output shape depends on
  values (``bincount`` of MoE routing for an uneven all-to-all) stops the rank with one line naming
  both places: `values` says which, and why.

Checked (tests and by hand, docs/trace.md): DDP, FSDP2, DTensor TP and SP, FSDP2 x TP,
``torch.distributed.pipelining`` with static stage shapes, Megatron-core's process groups, and the
value reads of ``tests/jobs/value_reads.py``. A ``torch.compile``'d module (``fullgraph=True``) runs
eagerly under the outer fake mode (the same calls, the region without ``.GraphModule``)."""

from __future__ import annotations

import contextlib
import copy
import functools
import sys

from ..entry_points import rebind, wrap


def _with_fake_off(function):
    """`function` run with FakeTensorMode unset, as torch's ``unset_fake_temporarily`` does it (torch 2.13
    and 2.15 _subclasses/fake_tensor.py) without its generator-made context manager: 0.9 us a call
    against 3.0 us on the box, and every DeviceMesh method and property comes through here (109,094 calls
    in one rank of torchtitan 0.3.0's HSDP x TP at 1,024 ranks, 4 steps)."""
    import torch

    fake, unset, restore = torch._C._TorchDispatchModeKey.FAKE, torch._C._unset_dispatch_mode, torch._C._set_dispatch_mode

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        old = unset(fake)
        try:
            return function(*args, **kwargs)
        finally:
            if old is not None:
                restore(old)
    return wrapped


@functools.cache  # each installer once per process (the fork server's, then the rank's)
def real_device_meshes() -> None:
    """Every method and property of DeviceMesh (and its registry) runs with fake mode off."""
    from torch.distributed import device_mesh

    for cls in (device_mesh.DeviceMesh, getattr(device_mesh, "_MeshEnv", None)):
        if cls is None:
            continue
        for name, value in list(vars(cls).items()):
            if isinstance(value, property):
                setattr(cls, name, property(value.fget and _with_fake_off(value.fget), value.fset, value.fdel,
                                            value.__doc__))
            elif isinstance(value, (staticmethod, classmethod)):
                setattr(cls, name, type(value)(_with_fake_off(value.__func__)))
            elif callable(value) and not isinstance(value, type):
                setattr(cls, name, _with_fake_off(value))
    rebind(device_mesh.init_device_mesh, _with_fake_off(device_mesh.init_device_mesh))


@functools.cache
def swap_through_data() -> None:
    """``torch.utils.swap_tensors`` of two FakeTensors as ``t1.data = t2.data`` (see the module doc)."""
    import torch.utils
    from torch._subclasses.fake_tensor import FakeTensor

    swap = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor):
            t1.data = t2.data
            t1.fake_device = t2.fake_device  # a FakeTensor's device is its own field, not its data's
            return None
        return swap(t1, t2)

    rebind(swap, swap_tensors)


@functools.cache
def sharding_propagation_uncounted() -> None:
    """DTensor's sharding propagation runs each new op at its global shape on tensors of its own, in the fake
    mode it finds (`capture.work.outside_the_job` says why): outside the job's work."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    from ...capture.work import outside_the_job

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    @functools.wraps(original)
    def propagate(*args, **kwargs):
        with outside_the_job():
            return original(*args, **kwargs)

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate


class _Chunks:
    """FSDP2's list of a parameter's `num` chunks along `dim` (``_chunk_with_empty``: ``torch.chunk``'s, padded
    with empty tensors to `num`), each made when first read."""

    def __init__(self, tensor, num: int, dim: int):
        self.tensor, self.num, self.dim = tensor, num, dim
        self.step = -(-tensor.size(dim) // num)  # torch.chunk's size: every chunk but the last
        self.made: dict[int, object] = {}

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i: int):
        if not -self.num <= i < self.num:
            raise IndexError(f"chunk {i} of {self.num}")
        i %= self.num
        if i not in self.made:
            start, size = i * self.step, self.tensor.size(self.dim)
            if start < size or size == 0:  # torch.chunk's i-th (of a size-0 dim: `num` empty views)
                self.made[i] = self.tensor.narrow(self.dim, min(start, size), max(0, min(self.step, size - start)))
            else:  # past torch.chunk's last: FSDP2's padding
                self.made[i] = self[0].new_empty(0)
        return self.made[i]

    def __iter__(self):
        return (self[i] for i in range(self.num))


@functools.cache
def fsdp_chunks_on_demand() -> None:
    """FSDP2 cuts each parameter into one chunk per rank of its shard group and reads two of them (this rank's and
    the first); under fake tensors every chunk is a FakeTensor made in Python (tens of microseconds), which at
    1,024 ranks was most of a rank's time before its first step (70-90 s of about 125, torchtitan's Llama 3 8B
    on the project's 2-core box; 4 s with this): the chunks are made where read."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    _fsdp_param._chunk_with_empty = _Chunks


@functools.cache
def ddp_bucket_rebuild_real() -> None:
    """DDP's bucket rebuild (``_pre_forward``) reads what it gathered as numbers: with fake mode off its
    own tensors are real."""
    from torch.nn.parallel import distributed

    ddp = distributed.DistributedDataParallel
    ddp._pre_forward = _with_fake_off(ddp._pre_forward)


@functools.cache
def ddp_param_check_real() -> None:
    """DDP's C++ parameter check reads the shapes it gathers back as numbers (``item``): with fake mode
    off its own tensors are real; the parameters it is given are only measured."""
    import torch.distributed.utils as dist_utils

    check = dist_utils._verify_param_shape_across_processes
    rebind(check, _with_fake_off(check))


@functools.cache
def pipeline_vote_real() -> None:
    """torch.distributed.pipelining's warm-up vote (torch 2.13) reads the vote it received as a number:
    its few one-element tensors are real (the fake world's receive fills them with ones, `backend`)."""
    from torch.distributed.pipelining import schedules

    base = schedules._PipelineSchedule
    base._warmup_p2p = _with_fake_off(base._warmup_p2p)


@functools.cache
def pipeline_setup_real() -> None:
    """torch 2.15's pipeline set-up reads its all-reduced vote as a number (``vote.item()``); its tensors are its
    own one-element ones, real with fake mode off."""
    from torch.distributed.pipelining import schedules

    base = schedules._PipelineSchedule
    base._initialize_pipeline_distributed_state = _with_fake_off(base._initialize_pipeline_distributed_state)


OBJECT_COLLECTIVES = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
                      "send_object_list", "recv_object_list")


@functools.cache
def data_loading_real() -> None:
    """A DataLoader iterator's set-up (its random base seed) and its index sampling (the sampler's reads) with fake
    mode off; fetching the items stays in fake mode."""
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    base.__init__ = _with_fake_off(base.__init__)
    base._next_index = _with_fake_off(base._next_index)


@functools.cache
def object_collectives_real() -> None:
    """The ``*_object`` collectives with fake mode off: their tensors are the rank's own pickled objects."""
    for name in OBJECT_COLLECTIVES:
        wrap(name, _with_fake_off)


@functools.cache
def flex_attention_uncompiled() -> None:
    """flex_attention calls its higher-order op without compiling it (read at each call)."""
    from torch.nn.attention import flex_attention

    flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True


@functools.cache
def compiled_code_eager() -> None:
    """Every ``torch.compile`` runs eagerly by torch's own stance for it, not frame by frame through Dynamo."""
    import torch

    torch.compiler.set_stance("force_eager")


@functools.cache
def format_answers() -> None:
    """``format`` of a 0-dim FakeTensor formats its value, as ``Tensor.__format__`` does for a plain tensor
    (torch/_tensor.py:1139, which leaves a subclass to ``object.__format__``: a TypeError for ``:.3f``); the
    value is read, and answered (`values`)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.Tensor.__format__

    def __format__(self, spec):
        if isinstance(self, FakeTensor) and self.dim() == 0:
            return self.detach().item().__format__(spec)
        return original(self, spec)

    torch.Tensor.__format__ = __format__


@functools.cache
def tensor_of_fakes() -> None:
    """``torch.tensor`` / ``torch.as_tensor`` of (nested) sequences of FakeTensors: their stack, with the dtype,
    device and grad torch would give (torch 2.13 reads each element's storage: "data is not allocated yet").

    TorchScript still sees the builtins: it resolves a function a scripted one calls by its identity in
    ``torch.jit._builtins``' table (``_find_builtin``, asked by the compiler for every global it meets), built
    from ``dir(torch)`` when torch is imported (torch 2.13 jit/_script.py:1799 registers into it), so a wrapper
    put in their place later is a Python function it compiles from source, which fails: its source is the
    builtin's (``__wrapped__``; "module, class, method, function, ... was expected, got builtin_function_or_method"
    at ``import torch.distributed.optim``, whose functional optimizers are scripted at import and call
    ``torch.tensor``). Each wrapper is registered as the op the original is (``aten::tensor``,
    ``aten::as_tensor``), so scripted code compiles as it does without the wrapper and runs torch's own op."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.jit._builtins import _find_builtin, _register_builtin

    def make(original):
        @functools.wraps(original)
        def build(data, *args, **kwargs):
            leaf = data
            while isinstance(leaf, (list, tuple)) and leaf:
                leaf = leaf[0]
            if not isinstance(leaf, FakeTensor):
                return original(data, *args, **kwargs)
            return _stacked(original, data, kwargs.get("dtype", args[0] if args else None),
                            kwargs.get("device", args[1] if len(args) > 1 else None), kwargs.get("requires_grad", False))
        _register_builtin(build, _find_builtin(original))
        return build

    torch.tensor, torch.as_tensor = make(torch.tensor), make(torch.as_tensor)


def _stacked(original, data, dtype, device, requires_grad: bool):
    """What ``torch.tensor(data)`` gives for nested sequences of scalars and one-element tensors."""
    import torch

    def leaves(d):
        if isinstance(d, (list, tuple)):
            for x in d:
                yield from leaves(x)
        else:
            yield d

    def dtype_of(x):  # torch's element type inference (torch/csrc/utils/tensor_new.cpp infer_scalar_type)
        if isinstance(x, torch.Tensor):
            return x.dtype
        if isinstance(x, bool):
            return torch.bool
        if isinstance(x, int):
            return torch.int64
        return torch.complex64 if isinstance(x, complex) else torch.get_default_dtype()

    dtype = dtype or functools.reduce(torch.promote_types, map(dtype_of, leaves(data)))

    def stack(d):
        if isinstance(d, (list, tuple)):
            return torch.stack([stack(x) for x in d])
        return (d if isinstance(d, torch.Tensor) else original(d)).detach().reshape(()).to(dtype)

    out = stack(data).to(device if device is not None else torch.get_default_device())
    return out.requires_grad_() if requires_grad else out


@functools.cache
def deepcopy_clones() -> None:
    """``copy.deepcopy`` of a FakeTensor is its clone in the same fake mode, with the script's own attributes
    copied (torch 2.13's ``Tensor.__deepcopy__`` copies a constant FakeTensor's storage, which fails
    (torch/_tensor.py:174), and else deep-copies the FakeTensorMode the tensor belongs to)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()  # torch's own answer for a tensor without storage (torch/_tensor.py:153-163)
        if self.requires_grad:
            new.requires_grad_()
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        for name, value in self.__dict__.items():
            if name not in new.__dict__:  # FakeTensor's own fields are the clone's; a Parameter's flag is not
                setattr(new, name, copy.deepcopy(value, memo))
        return new

    FakeTensor.__deepcopy__ = __deepcopy__


@functools.cache
def save_without_data() -> None:
    """``torch.save`` under ``torch.serialization.skip_data(materialize_fake_tensors=True)``: the checkpoint's
    structure, tensors' shapes and dtypes, and no data (a FakeTensor has none; without it torch 2.13 fails to
    pickle one and leaves a truncated file); counted as an answered read (`values`)."""
    import torch
    from torch.serialization import skip_data

    original = torch.save

    @functools.wraps(original)
    def save(*args, **kwargs):
        from .values import reads

        reads.count(sys._getframe(), "saved without data", sizes=False)
        with skip_data(materialize_fake_tensors=True):
            return original(*args, **kwargs)

    rebind(original, save)


COALESCED = ("allreduce_coalesced_", "allgather_coalesced_", "allgather_into_tensor_coalesced_",
             "reduce_scatter_tensor_coalesced_")
_libraries: list = []  # a torch.library registration lasts as long as its Library object


@functools.cache
def coalesced_fake_kernels() -> None:
    """Fake (Meta) kernels for c10d's coalesced ops: the one torch registers for every other c10d op (a fake
    Work), which torch 2.13 leaves commented out for these as deprecated (torch/distributed/
    _meta_registrations.py); without them FakeTensorMode raises UnsupportedOperatorException."""
    import torch
    from torch.distributed._meta_registrations import create_fakework

    library = torch.library.Library("c10d", "IMPL")
    for name in COALESCED:
        library.impl(name, lambda *args: create_fakework(args, return_first_arg=False), "Meta")
    _libraries.append(library)


@contextlib.contextmanager
def shapes_only(sink, work=None):
    """Run the block with fake tensors, every collective handed to `sink` (a `capture.dispatch` sink),
    every value read answered or explained and every op counted by `work` where given (`values.recorder`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .values import recorder

    with FakeTensorMode(allow_non_fake_inputs=True), recorder(sink, work):
        yield
