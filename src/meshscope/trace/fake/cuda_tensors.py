"""Which of a fake world's CPU tensors stand for CUDA tensors, and what they answer as such.

Scripts written for GPUs ask their tensors where they live: megatron-core 0.16.1's gradient clipping,
on by default (``clip_grad=1.0``), asserts ``param.grad.type() == 'torch.cuda.FloatTensor'``
(optimizer/clip_grads.py:167); others branch on ``t.is_cuda`` or ``t.device.type == "cuda"``. On a
machine without CUDA the fake world makes every CUDA tensor a CPU tensor (`devices`), so a tensor
keeps a mark saying it stands for a CUDA one, and ``Tensor.device``, ``is_cuda``, ``is_cpu``,
``type()`` and ``get_device()`` answer for it as a GPU would.

A tensor is marked where the script puts it on a GPU (a factory's ``device="cuda"`` or ordinal,
``.cuda()``, ``.to("cuda")``, ``Module.to(1)``), and where any torch call makes it from a marked
tensor: torch's own rule, an op's result lives where its operands do, and a gradient where its
tensor does (``.grad`` is read through a torch call, so the gradients autograd's C++ engine made are
marked when the script reads them). A call that names a device decides by that device instead
(``zeros_like(t, device="cpu")``, ``.cpu()``). The mark is on the storage, so whatever shares it
shares the mark: views, ``.data``, ``detach()``, an ``nn.Parameter`` made of the tensor.

A tensor the script certainly puts in the host's memory is marked as the host's: ``.cpu()`` of a GPU's tensor,
pinned memory, a non-blocking copy to the CPU (torch pins its destination, aten ``_to_copy``), and what a torch
call makes from such tensors (torch's rule again; a 0-dim host tensor is a scalar, which decides nothing). A
CPU a call merely names is no proof: FSDP2 takes its device from its mesh (torch 2.13
distributed/fsdp/_fully_shard/_fsdp_init.py ``_get_device_from_mesh``), and a fake world's CUDA mesh is a CPU
one. FSDP2's CPU offload keeps its sharded parameters (``.cpu()``, pinned), gradients (a non-blocking copy) and
optimizer state (made from those) on the host, and `on_host` tells ``forecast``'s memory count
(`capture.work`) not to count them as the GPU's (an unmarked tensor counts as the GPU's: most of a GPU job's
tensors are, autograd's included).

Moves copy, as they do between a GPU and its host: ``.cuda()`` of an unmarked tensor (``.to(cpu)``
would return the tensor itself, marking the host's copy too: a data loader's batch), and ``.cpu()``
of a marked one. In-place results keep their own storage's mark (``cpu_t.copy_(cuda_t)`` is on the
host).

The devices mode (`devices._cpu_devices`) sees every torch call the script (and torch's Python outside
a torch call) makes and hands each one's result to `result`; a compiled region's results are placed as
one call's (`compiled_regions`). `answered` sets the answers on ``torch.Tensor``. What is not seen: a
thread the script starts (the mode is thread-local), and a tensor torch makes in C++ and hands to the
script without a torch call (the gradient a tensor hook gets, DDP's bucket in a comm hook): those read
as the host's.
"""

from __future__ import annotations

import functools
import os
import threading


def local_rank() -> int:  # the rank's environment, read at the call (not at install: fork_server)
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_ordinal(device) -> bool:
    return isinstance(device, int) and not isinstance(device, bool)


def is_cuda(device) -> bool:
    """A CUDA device as torch accepts one: ``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 1)``."""
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


HOST = "host"
"""What a call names that puts its result on the host (``"cpu"``, ``"meta"``, a tensor marked as the host's), and
the mark of a storage the script certainly put there."""

_marked: dict[int, tuple[object, int | str]] = {}
"""Each marked storage (by its ``_cdata``): a weak reference to it, and the GPU index it stands on, or `HOST`.
An entry whose storage died is stale (a new storage may reuse the address): `_place` says so."""
_pruned_at = [1024]


def _storage(tensor):
    import torch

    try:
        with torch._C.DisableTorchFunction():  # asked from the answers below too: not the devices mode's call
            return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # no storage of its own
        from torch._C import _functorch

        # vmap's and grad's wrappers: the tensor they wrap holds the storage, and vmap's result is a view
        # of it (flex_attention's create_block_mask builds its mask under vmap, torch 2.13
        # nn/attention/flex_attention.py); a wrapper subclass (DTensor) stands where its first inner tensor
        # does (DDP refuses a module whose DTensor and plain parameters answer different devices,
        # nn/parallel/distributed.py:1372); a sparse tensor has none
        if _functorch.is_functorch_wrapped_tensor(tensor):
            return _storage(_functorch.get_unwrapped(tensor))
        inner = _inner(tensor)
        return _storage(inner[0]) if inner else None


def _key(tensor) -> int | None:
    storage = _storage(tensor)
    return None if storage is None else storage._cdata


def index(tensor) -> int | None:
    """The GPU index `tensor` stands on, or None where it stands for a host tensor."""
    return _at(_key(tensor))


def _at(key: int | None) -> int | None:
    """The GPU index the storage `key` stands on (`index`), or None."""
    where = _place(key)
    return None if where == HOST else where


def _place(key: int | None) -> int | str | None:
    """The storage `key`'s mark: a GPU index, `HOST`, or None (unmarked)."""
    entry = _marked.get(key) if key is not None else None
    if entry is None:
        return None
    if entry[0].expired():
        _marked.pop(key, None)  # (DataLoader's pin thread marks too)
        return None
    return entry[1]


def on_host_tensor(tensor) -> bool:
    """`tensor` is marked as the host's (a wrapper subclass by its inner tensor)."""
    key = _key(tensor)
    return key is not None and _where(tensor, key) == HOST


def on_host(storage) -> bool:
    """`storage` stands for the host's memory: it is marked so, or a call that certainly puts its results there
    is making it now (its results are marked once it returns, after the dispatch modes below saw them made)."""
    where = _place(storage._cdata)
    return where == HOST or (where is None and getattr(_torch_call, "host", False))


_torch_call = threading.local()
"""How deep this thread is in torch calls the devices mode handed on (`run`): torch's own Python inside one
reads where its tensors are, as its CPU kernels need (flex_attention's unfused path allocates on its query's
device, torch 2.13 nn/attention/flex_attention.py)."""


def run(func, args, kwargs, depth: int | None = None, host: bool = False):
    """``func(*args, **kwargs)``, a torch call the devices mode hands on: inside it, no tensor answers as a GPU's;
    or at `depth` 0, code of the script's that torch runs (autograd's backward functions and hooks), where they do.
    `host`: the call puts what it makes on the host (`on_host`)."""
    outer, outer_host = getattr(_torch_call, "depth", 0), getattr(_torch_call, "host", False)
    _torch_call.depth = outer + 1 if depth is None else depth
    _torch_call.host = host
    try:
        return func(*args, **kwargs)
    finally:
        _torch_call.depth, _torch_call.host = outer, outer_host


def mark(tensor, gpu: int | str) -> None:
    """`tensor` stands on GPU `gpu`, or on the host (`HOST`): its storage, and a wrapper subclass's inner tensors'
    (a DTensor holds a storage of its own beside its local tensor's, torch 2.13; dispatch modes see the local
    one)."""
    storage = _storage(tensor)
    if storage is not None:
        mark_storage(storage, gpu)
    for inner in _inner(tensor):
        mark(inner, gpu)


def _inner(tensor) -> list:
    """A wrapper subclass's inner tensors (DTensor's local tensor), else none."""
    plain, is_wrapper = _tensor_types()
    if type(tensor) in plain or not is_wrapper(tensor):
        return []
    try:
        names = type(tensor).__tensor_flatten__(tensor)[0]
    except Exception:  # noqa: BLE001 - a subclass's own flattening failed: it is placed as itself
        return []
    inner = (getattr(tensor, name, None) for name in names)
    return [t for t in inner if isinstance(t, plain[0])]


@functools.cache
def _tensor_types():
    """(the plain tensor types, torch's test for a wrapper subclass), imported once: `_inner` runs on every mark."""
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return (torch.Tensor, torch.nn.Parameter), is_traceable_wrapper_subclass


def _where(tensor, key: int) -> int | str | None:
    """The mark of `tensor` (storage `key`), or where it is unmarked, of its first inner tensor."""
    where = _place(key)
    if where is None:
        for inner in _inner(tensor):
            return _where(inner, _key(inner))
    return where


def mark_storage(storage, gpu: int | str) -> None:
    """`storage` (untyped, or a TypedStorage: a checkpoint's) stands on GPU `gpu`, or on the host (`HOST`)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    storage = getattr(storage, "_untyped_storage", storage)
    _marked[storage._cdata] = (StorageWeakRef(storage), gpu)
    if len(_marked) > 2 * _pruned_at[0]:  # dead storages' entries, dropped now and then
        for dead in [k for k, (ref, _) in list(_marked.items()) if ref.expired()]:  # (a copy: the pin thread marks)
            _marked.pop(dead, None)
        _pruned_at[0] = max(1024, len(_marked))


@functools.cache
def answered() -> None:
    """A marked tensor answers ``device``, ``is_cuda``, ``is_cpu``, ``type()`` and ``get_device()`` as a GPU's
    wherever the script (or torch's Python outside a torch call: DDP, FSDP, an optimizer) asks; inside a torch
    call the devices mode handed on, or with torch functions off (make_fx's tracing inside flex_attention's
    backward), where they are (`run`). Set on ``torch.Tensor`` over ``TensorBase``'s getters, and over
    FakeTensor's own ``device`` (--fake-tensors), which answers ``meta`` inside its kernels and stays so. Checkpointing's
    recomputation check compares a forward's saved tensor, read inside the op that made it, before the op's
    results are marked, with its recomputed twin, read after (torch 2.13 utils/checkpoint.py
    ``_default_meta_extractor``): it reads where both are."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import checkpoint

    base = vars(torch._C.TensorBase)
    device, fake_device = base["device"], vars(FakeTensor)["device"]
    is_cuda_, is_cpu_, type_, get_device = base["is_cuda"], base["is_cpu"], base["type"], base["get_device"]

    def asked(tensor) -> int | None:
        if getattr(_torch_call, "depth", 0) or not torch._C._is_torch_function_mode_enabled():
            return None
        return index(tensor)

    def on_gpu(getter, answer):
        def get(tensor):
            where = asked(tensor)
            return getter.__get__(tensor, type(tensor)) if where is None else answer(where)
        return property(get)

    def type_of(tensor, dtype=None, non_blocking=False, **kwargs):
        answer = type_(tensor, dtype, non_blocking, **kwargs)  # the mode hands torch's call back to this one
        if dtype is None and asked(tensor) is not None and not answer.startswith("torch.cuda."):
            return answer.replace("torch.", "torch.cuda.", 1)  # 'torch.FloatTensor' -> 'torch.cuda.FloatTensor'
        return answer

    def device_of_fake(tensor):
        where = None if tensor.fake_mode.in_kernel_invocation else asked(tensor)
        return fake_device.__get__(tensor) if where is None else torch.device("cuda", where)

    torch.Tensor.device = on_gpu(device, lambda where: torch.device("cuda", where))
    torch.Tensor.is_cuda = on_gpu(is_cuda_, lambda where: True)
    torch.Tensor.is_cpu = on_gpu(is_cpu_, lambda where: False)
    torch.Tensor.type = functools.wraps(type_)(type_of)
    @functools.wraps(get_device)
    def get_device_of(tensor):
        where = asked(tensor)
        return get_device(tensor) if where is None else where

    torch.Tensor.get_device = get_device_of
    FakeTensor.device = property(device_of_fake)
    checks = checkpoint._allowed_determinism_checks_to_fns
    default = checks[checkpoint._DEFAULT_DETERMINISM_MODE]

    def where_it_is(tensor):
        with torch._C.DisableTorchFunction():
            return {**default(tensor), "device": device.__get__(tensor, type(tensor))}

    checks[checkpoint._DEFAULT_DETERMINISM_MODE] = where_it_is


def gpu(device) -> int:
    """The GPU index a CUDA device or an ordinal names: ``"cuda"`` is the current one, the local rank's."""
    import torch

    if is_ordinal(device):
        return device
    if device is None or torch.device(device).index is None:
        return local_rank()  # torch.cuda.set_device does nothing in a fake world (`cuda_api`)
    return torch.device(device).index


class MeshCpu(str):
    """``"cpu"``, the device type of a mesh the script built for CUDA (`devices.cpu_device_mesh`): DTensor moves
    its local tensors to it (``.to(mesh.device_type)``, torch 2.13 distributed/tensor/_api.py), and they stay
    the GPU's, as they are on the script's GPUs (DDP refuses a module whose DTensor and plain parameters
    answer different devices, nn/parallel/distributed.py:1372)."""


def named(device) -> int | str | None:
    """What a device argument names: a GPU index, `HOST`, or None (no device)."""
    import torch

    if device is None:
        return None
    if is_cuda(device) or is_ordinal(device) or isinstance(device, MeshCpu):
        return gpu(None if isinstance(device, MeshCpu) else device)
    if isinstance(device, torch.Tensor):  # Tensor.to(other): where `other` is (unmarked: its operands decide)
        return _place(_key(device))
    return HOST if isinstance(device, (str, torch.device)) else None


def _tensors(args, kwargs):
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def operands(args, kwargs) -> tuple[int | str | None, set[int]]:
    """Where a call's operands are: the GPU index of the first one marked so, else `HOST` where one that is not a
    scalar (0-dim: torch moves those to its other operands' device) is the host's, else None; and every operand's
    storage."""
    gpu, host, storages = None, False, set()
    for tensor in _tensors(args, kwargs):
        key = _key(tensor)
        if key is None:
            continue
        storages.add(key)
        if gpu is None:
            where = _where(tensor, key)
            if where == HOST:
                host = host or tensor.dim() > 0
            else:
                gpu = where
    return (HOST if gpu is None and host else gpu), storages


def result(out, asked: int | str | None, operand_gpu: int | str | None, operand_storages: set[int],
           deep: bool = False, host: bool = False):
    """`out` of a torch call, marked where torch would place it. ``asked`` is what the call named: a GPU
    index, `HOST`, or None where it named no device (its operands decide, `operands`); `host`: the call certainly
    puts its results in the host's memory (module doc), and a tensor not marked as the host's comes back copied;
    `deep`: `_held`."""
    import torch

    def place(tensor):
        key = _key(tensor)
        if key is None:
            return tensor
        if asked == HOST:
            if _at(key) is not None or (host and key in operand_storages and _place(key) != HOST):
                return copied_to_host(tensor, host)  # a GPU's tensor to the host: a copy
            if host and key not in operand_storages:  # (an operand came back: it stays where it was)
                mark(tensor, HOST)
            return tensor
        if asked is not None:
            if key in operand_storages and _at(key) is None:
                tensor = tensor.clone()  # the host's tensor itself came back: a GPU gets a copy
            mark(tensor, asked)
        elif operand_gpu is not None and key not in operand_storages:
            mark(tensor, operand_gpu)  # a new storage made from a GPU's operands
        return tensor

    if isinstance(out, torch.Tensor):
        return place(out)
    for tensor in _held(out, deep):  # no call that names a device returns several tensors: nothing is copied
        place(tensor)
    return out


def copied_to_host(tensor, certain: bool = True):
    """A copy of `tensor` made on the host by a copy engine: no kernel's or host op's work (the forecast does not
    time transfers between host and GPU), marked as the host's where that is `certain` (module doc)."""
    from ...capture.work import outside_the_job

    with outside_the_job():
        copy = run(tensor.clone, (), {}, depth=getattr(_torch_call, "depth", 0), host=certain)
    if certain:
        mark(copy, HOST)
    return copy


def _held(out, deep: bool):
    """The tensors a call's result holds: in a list or tuple (split, chunk, autograd.grad, max's
    ``torch.return_types``), and where `deep`, a dict's values and an object's attributes (flex_attention's
    ``BlockMask``, which is no pytree), one level down."""
    import torch

    values = ()
    if isinstance(out, (list, tuple)):
        values = out
    elif deep and isinstance(out, dict):
        values = out.values()
    elif deep and hasattr(out, "__dict__") and not callable(out):
        values = vars(out).values()
    return (v for v in values if isinstance(v, torch.Tensor))


@functools.cache
def compiled_regions() -> None:
    """A compiled region's results, placed as one call's: the devices mode is traced into Dynamo's graphs
    (with marks off: its tensors are Dynamo's fake ones), so none of the region's own calls marks anything
    when the compiled code runs. Its results are marked from its operands, or from a GPU it was asked for
    (torchtitan compiles ``create_block_mask(..., device="cuda")``, whose mask ``flex_attention`` checks
    against its query's device, torch 2.13 nn/attention/flex_attention.py). Every compiled function and
    module runs through a ``_TorchDynamoContext``'s wrapper (torch 2.13 _dynamo/eval_frame.py:914), where a
    ``--work`` rank counts it as the kernels its compilation fuses (`capture.work.run_compiled`)."""
    import torch
    from torch._dynamo import eval_frame

    from ...capture.work import run_compiled

    wrap = eval_frame._TorchDynamoContext.__call__

    def call(context, fn):
        compiled = wrap(context, fn)
        if not callable(compiled) or isinstance(compiled, torch.nn.Module):  # a module's forward comes here too
            return compiled

        @functools.wraps(compiled)  # Dynamo reads the wrapper's attributes (_torchdynamo_inline, ...)
        def placed(*args, **kwargs):
            if torch.compiler.is_compiling():
                return compiled(*args, **kwargs)
            operand_gpu, operand_storages = operands(args, kwargs)
            if operand_gpu in (None, HOST):  # a GPU it was asked for decides over the host's operands
                operand_gpu = next((gpu(v) for v in (*args, *kwargs.values()) if is_cuda(v)), operand_gpu)
            return result(run_compiled(compiled, *args, **kwargs), None, operand_gpu, operand_storages, deep=True)

        return placed

    eval_frame._TorchDynamoContext.__call__ = call
