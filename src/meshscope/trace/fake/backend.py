"""The fake process-group backend under a traced script: every group a fake world's rank creates.

``meshscope trace --fake-world N`` runs each chosen rank r in a process of its own and swaps
whatever backend the script asks ``init_process_group`` for with torch's ``fake`` one (and a store
that needs no peer, torch/testing/_internal/distributed/fake_pg.py, torch 2.11-2.13), and so for
every subgroup, whatever backend it names (`fake_new_group`, `fake_split_group`): its
collectives return at once with their input as output, so the script runs alone while issuing
every call it would issue at N ranks, each seen by the dispatcher recorder as usual. Values received
from other ranks are not there: all-to-all split sizes exchanged at run time come back as this
rank's own (`assumed` marks what a call's fields cannot know), and a P2P receive gets no data (what
``torch.distributed.pipelining``'s warm-up learns from its peers is `pipeline`'s). DDP's built-in gradient hook
takes the reduced bucket from the work's future, which the fake backend leaves empty, so DDP gets a
hook that issues the same all-reduce of the same bucket and hands the bucket back
(`fake_allreduce_hook`); a comm hook the script registers (or torch's DDP for itself) takes its place,
and the works it waits on carry their outputs, as gloo's do (`hook_ddp`); so does a built-in hook, as the
Python hook torch writes alike. ``dist.get_backend`` answers the backend the script named for the group, not
``"fake"``, and a group's ``name()`` the one torch would have made its default (`backend_as_asked`). What object
collectives receive is `objects`'s.

Each installer here is one row of `patches.PATCHES` (its target, why, the torch versions read) and
idempotent: the fork server installs them before it forks the ranks, which install them again.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager

from ..entry_points import arguments, wrap


asked: dict[str, str] = {}
"""Group name -> the backend the script named for it, as torch keeps it for ``get_backend``
(distributed_c10d.py ``_world.pg_map``, torch 2.13): ``init_process_group``'s (``"undefined"`` where it
named none), a ``new_group``'s (the default group's where it named none), a split's parent's."""


@functools.cache
def fake_init_process_group() -> None:
    """The script's ``init_process_group`` makes a fake group of the world the environment names (read
    at the call: the fork server installs this before it forks the ranks)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def fake_init(original):
        bind = arguments(original)

        @functools.wraps(original)
        def init_process_group(*args, **kwargs):
            given = bind(args, kwargs)
            for name in ("device_id", "init_method", "_ranks"):  # the fake backend binds no device, needs no peer
                given.pop(name, None)
            named = str(given.get("backend") or "undefined")
            given.update(backend="fake", store=FakeStore(), rank=int(os.environ["RANK"]),
                         world_size=int(os.environ["WORLD_SIZE"]))
            done = original(**given)
            _name(None, named)
            return done
        return init_process_group

    wrap("init_process_group", fake_init)


@functools.cache
def fake_new_group() -> None:
    """Every group ``new_group`` makes is a fake one, whatever backend the script names: ``"gloo"`` (on the
    fake store, torch 2.13's ``ProcessGroupGloo(...)`` fails: "INTERNAL ASSERT FAILED ... Not implemented",
    distributed_c10d.py:2169, from Megatron-core's ``_GLOO`` twins), ``"nccl"`` (absent from a CPU build),
    ``"cpu:gloo,cuda:nccl"``, DeviceMesh's backend override. Its ``device_id`` is dropped (the fake backend
    binds no device), and its ``pg_options``: they are the named backend's options, which the fake one does not
    take (DeviceMesh reads their timeout before it calls, and passes it as ``timeout``)."""
    def fake(original):
        bind = arguments(original)

        @functools.wraps(original)  # its signature stays visible to the --timeout wrapper
        def new_group(*args, **kwargs):
            given = bind(args, kwargs)
            for name in ("device_id", "pg_options"):
                given.pop(name, None)
            named = given.get("backend")
            given["backend"] = "fake"
            group = original(**given)
            _name(group, str(named) if named else _asked(None))
            return group
        return new_group

    wrap("new_group", fake)


@functools.cache
def fake_split_group() -> None:
    """``split_group`` builds this rank's split as a fake group. torch's own needs a device bound to the default
    group and a backend that splits (NCCL), neither of which a fake world has ("No device associated with the
    default pg", torch 2.13 distributed_c10d.py:5565); every member of the parent calls it once and gets its
    own split, which `new_group` with ``use_local_synchronization`` makes the same way (members only, the
    name hashed from its ranks as split_group's is). Its description, when none is given, is NCCL's:
    ``<parent>:split:<n>``, n counting this rank's splits of that parent."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    splits: dict[str, int] = {}

    def fake(original):
        bind = arguments(original)

        @functools.wraps(original)
        def split_group(*args, **kwargs):
            given = bind(args, kwargs)
            parent = given.get("parent_pg") or dist.group.WORLD
            desc = given.get("group_desc")
            if desc is None:
                n = splits[parent.group_name] = splits.get(parent.group_name, -1) + 1
                desc = f"{parent.group_desc}:split:{n}"
            mine = dist.get_rank(parent)
            split = next((s for s in given.get("split_ranks") or () if mine in s), None)
            if split is None:  # in no split: torch returns None
                return None
            ranks = sorted(dist.get_global_rank(parent, r) for r in split)
            group = c10d.new_group(ranks, timeout=given.get("timeout"), group_desc=desc, use_local_synchronization=True)
            _name(group, _asked(parent))  # torch's split keeps its parent's backend (distributed_c10d.py:5623)
            return group
        return split_group

    wrap("split_group", fake)


def _name(group, named: str) -> None:
    """Keep `named` as `group`'s asked backend (None: the default group; a non-member's group is not one)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    group = c10d._get_default_group() if group is None else group
    if isinstance(group, dist.ProcessGroup):
        asked[group.group_name] = named


def _asked(group) -> str:
    """The backend the script named for `group` (None: the default group), as ``get_backend`` spells it; a
    group made past the wrappers has the default group's, as torch's ``new_group`` gives it."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    default = c10d._get_default_group().group_name
    return dist.Backend(asked.get((group or c10d._get_default_group()).group_name) or asked.get(default, "fake"))


_actual: list[bool] = []
"""Non-empty inside `actual_backend`."""


@contextmanager
def actual_backend():
    """``get_backend`` answers ``"fake"`` inside (a group's ``name()`` ``"custom"``): for torch's own code that must
    take its fake path."""
    _actual.append(True)
    try:
        yield
    finally:
        _actual.pop()


def _default_backend(named: str) -> str:
    """``ProcessGroup.name()`` of a group built for backend `named`: the type torch makes its default
    (distributed_c10d.py:2069-2093, torch 2.13), spelled as ProcessGroup.hpp:100-118 spells it (the type's
    name in lower case). One backend named is its own type (a plugin's ``"custom"``); ``"undefined"`` and a
    map of several are ``"nccl"`` where the map holds NCCL, else ``"gloo"`` (the fake world's own plugin is not
    the script's, so torch's branch for a registered plugin, 2088-2091, is not taken). ``"undefined"``'s map is
    the accelerator's default backend (``BackendConfig``, 419-425), the accelerator as the fake world answers
    it: torch asks ``torch._C._get_accelerator``, which a CPU build answers with the CPU."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import BackendConfig

    if "," not in named and ":" not in named and named != dist.Backend.UNDEFINED:
        return dist.Backend.backend_type_map[named].name.lower()
    if named == dist.Backend.UNDEFINED:
        device = torch.accelerator.current_accelerator() or torch.device("cpu")
        backends = {dist.Backend.default_device_backend_map[device.type]}
    else:
        backends = set(BackendConfig(dist.Backend(named)).get_device_backend_map().values())
    return dist.Backend.NCCL if dist.Backend.NCCL in backends else dist.Backend.GLOO


@functools.cache
def backend_as_asked() -> None:
    """``get_backend(group)`` answers what torch would have had the script's backend been built: ``"nccl"``,
    ``"gloo"``, ``"cpu:gloo,cuda:nccl"``, ``"undefined"``, for every group and the whole run. Libraries map it to
    a device (Colossal-AI 0.5.0 colossalai/device/device_mesh.py:109: ``KeyError: None`` for ``"fake"``) or
    pick a path by it (torch's distributed/nn/functional.py:413, NCCL's reduce-scatter; DeviceMesh's device
    set-up, device_mesh.py:453; pipelining's set-up at torch 2.15, `pipeline`). A group's ``name()`` (and
    ``_get_backend_name()``, the same C++ getter, ProcessGroup.hpp:168) answers its default backend's type from
    the same asked name (`_default_backend`), not the fake group's ``"custom"``: Colossal-AI 0.5.0
    pipeline/p2p.py:160 compares it with ``Backend.NCCL`` and otherwise reads ``Backend.HCCL``, which torch
    lacks; torch's sharded_tensor/api.py:641 picks the CPU for ``"gloo"``."""
    import torch.distributed as dist

    def as_asked(original):
        @functools.wraps(original)
        def get_backend(group=None):
            name = original(group)
            return _asked(group) if name == "fake" and not _actual else name
        return get_backend

    wrap("get_backend", as_asked)

    def named_as_asked(original):
        @functools.wraps(original)
        def name(self):
            got = original(self)
            return _default_backend(_asked(self)) if got == "custom" and not _actual else got
        return name

    for getter in ("name", "_get_backend_name"):
        setattr(dist.ProcessGroup, getter, named_as_asked(getattr(dist.ProcessGroup, getter)))


@functools.cache
def hook_ddp() -> None:
    """Every DDP's reducer gets one comm hook of meshscope's (the reducer takes one only: "can only be called
    once", torch 2.13 reducer.cpp), which runs `fake_allreduce_hook` until a hook is registered through
    ``register_comm_hook`` (the script's: nanotron 2411b02 helpers.py:446 with accumulate_grad_in_fp32; torch's
    own in DDP's constructor for ``mixed_precision``); from then on it runs that hook, with torch's checks and
    bookkeeping made as for any hook (nn/parallel/distributed.py:2253-2257), and the works that hook issues
    carry their outputs (`_carrying`): torch's hooks read the reduced tensor from the work's future
    (default_hooks.py ``fut.value()[0]``), which the fake backend leaves empty. A built-in hook
    (``_register_builtin_comm_hook``, which hands the reducer a C++ hook: the same one slot) takes it as the
    Python hook torch writes alike: ALLREDUCE's ``AllReduceCommHook`` and FP16_COMPRESS's ``FP16CompressCommHook``
    (torch 2.13 csrc/distributed/c10d/default_comm_hooks.cpp:11-42: the bucket, or its float16 copy, divided
    by the group's size and all-reduced on DDP's group, copied back) are default_hooks.py's ``allreduce_hook``
    and ``fp16_compress_hook``, and torch names the hook as it does (distributed.py:2285). A second
    registration of either kind fails as torch's does."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    init, register = DistributedDataParallel.__init__, DistributedDataParallel.register_comm_hook
    register_builtin = DistributedDataParallel._register_builtin_comm_hook
    builtin = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
               dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}

    class Slot:
        """The reducer's one hook: meshscope's until `taken`."""

        def __init__(self, group):
            self.hook, self.state, self.taken = fake_allreduce_hook, group, False

    def run(slot, bucket):
        if not slot.taken:
            return fake_allreduce_hook(slot.state, bucket)
        with _carrying():
            return slot.hook(slot.state, bucket)

    def slot_of(ddp) -> Slot:
        slot = vars(ddp).get("_meshscope_hook")
        if slot is None:
            slot = vars(ddp)["_meshscope_hook"] = Slot(ddp.process_group)
            dist._register_comm_hook(ddp.reducer, slot, run)
        return slot

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        slot_of(self)

    def register_comm_hook(self, state, hook):
        slot = slot_of(self)
        if slot.taken:  # torch's own error: the reducer's one hook is registered
            return register(self, state, hook)
        with _as_a_cuda_build():
            self._check_comm_hook(hook)
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        slot.hook, slot.state, slot.taken = hook, state, True

    def _register_builtin_comm_hook(self, comm_hook_type):
        slot = slot_of(self)
        if slot.taken:  # torch's own error, as above
            return register_builtin(self, comm_hook_type)
        self.logger._set_comm_hook_name(str(comm_hook_type))
        slot.hook, slot.state, slot.taken = builtin[comm_hook_type], self.process_group, True

    DistributedDataParallel.__init__ = __init__
    DistributedDataParallel.register_comm_hook = register_comm_hook
    DistributedDataParallel._register_builtin_comm_hook = _register_builtin_comm_hook


@contextmanager
def _as_a_cuda_build():
    """``torch.version.cuda`` as a CUDA build of torch has it, while DDP checks a hook the script registers, where
    the fake world maps CUDA onto a CPU build: DDP takes ``bf16_compress_hook`` only from a CUDA build with NCCL
    2.10+ (torch 2.13 nn/parallel/distributed.py ``_check_comm_hook``), which the job asked for (its NCCL version
    is `cuda_api.NCCL_VERSION`). Only the check reads it; the figure is not read, only whether there is one."""
    import torch

    from . import devices

    if not devices.needed() or torch.version.cuda is not None:
        yield
        return
    torch.version.cuda = "12.8"
    try:
        yield
    finally:
        torch.version.cuda = None


def fake_allreduce_hook(group, bucket):
    """DDP's one all-reduce of the bucket, completed with the bucket itself (the fake work's future
    carries no tensor, which DDP's built-in hook asserts on)."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda _: buffer)


def _carrying():
    """A dispatch mode in which a c10d op's work whose future is empty (the fake backend's ``FakeWork``, torch
    2.13) is a completed work whose future carries the op's outputs, a list as gloo's does (``[tensor]`` for
    an all-reduce): callbacks chained on it run at once, inside the mode."""
    import torch
    from torch._C._distributed_c10d import Work, _create_work_from_future
    from torch.utils._python_dispatch import TorchDispatchMode

    class Carrying(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace != "c10d" or not isinstance(out, tuple) or not isinstance(out[-1], torch.ScriptObject):
                return out
            future = Work.unbox(out[-1]).get_future()
            if not future.done() or future.value() is not None:
                return out
            carried = torch.futures.Future()
            carried.set_result(out[0] if isinstance(out[0], list) else [out[0]])
            return (*out[:-1], Work.boxed(_create_work_from_future(carried)))

    return Carrying()


def assumed(op: str, input_splits, output_splits, passed: bool = False) -> tuple[str, ...]:
    """What a fake world's rank cannot know of one call, by the fields that hold it.

    What an all-to-all receives is what its peers send: the fake backend hands back this rank's own
    input, so ``output_splits`` and ``bytes_out`` are assumed on every all-to-all. Uneven input splits
    are assumed too: a rank computes them from counts it received earlier (a MoE combine sends back
    what its dispatch received), and the ledger cannot tell them from splits it chose itself (a
    dispatch's routing), so neither is presented as known. Even input splits are the even split of
    the tensor the script allocated and are kept, unless the caller knows the script `passed` them:
    counts a rank received as its own for every peer's are even (`replay.Call.put`).
    """
    if op != "all_to_all":
        return ()
    if passed or input_splits and len(set(input_splits)) > 1:
        return ("input_splits", "output_splits", "bytes_in", "bytes_out")
    return ("output_splits", "bytes_out")
