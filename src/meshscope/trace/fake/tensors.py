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

What a script meets here, and how it is handled:

- **DeviceMesh** keeps real tensors: its rank tables are read back as Python ints (``tolist``), which
  a FakeTensor cannot answer, so every DeviceMesh method runs with fake mode off
  (``unset_fake_temporarily``); the mesh is bookkeeping, not data.
- **Module.to / .cuda / .float** of fake parameters: torch's ``Module._apply`` swaps a FakeTensor
  parameter for its converted copy with ``torch.utils.swap_tensors``, which refuses a tensor that
  FakeTensorMode holds a weak reference to; two FakeTensors are swapped through ``.data`` instead.
- **Reading a value** (``loss.item()``, ``.tolist()``, ``if tensor:``, data-dependent shapes such as
  ``nonzero`` or MoE routing counts for an uneven all-to-all) has no answer without data: the rank
  fails with one line naming the script's line (`value_read`), and such a script runs in a fake
  world without ``--fake-tensors``.

Checked (tests and by hand, docs/trace.md): DDP, FSDP2, DTensor TP and SP, FSDP2 x TP,
``torch.distributed.pipelining`` with static stage shapes, and Megatron-core's process groups. A
``torch.compile``'d module was seen to run eagerly under the outer fake mode (the same calls, the
region without ``.GraphModule``). Anything that reads tensor values is not supported.
"""

from __future__ import annotations

import contextlib
import functools
import os
import traceback

from ..entry_points import rebind

DATA_DEPENDENT = ("DataDependentOutputException", "DynamicOutputShapeException")
"""FakeTensorMode's errors for an op whose answer needs the data."""


def _with_fake_off(function):
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with unset_fake_temporarily():
            return function(*args, **kwargs)
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


@contextlib.contextmanager
def shapes_only(sink):
    """Run the block with fake tensors, every collective handed to `sink` (a `capture.dispatch` sink)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ...capture.dispatch import ModeRecorder

    with FakeTensorMode(allow_non_fake_inputs=True), ModeRecorder(sink):
        yield


def value_read(exc: BaseException, script: str) -> str | None:
    """The one-line error for a script (a path, or the file of a ``-m`` module) that read a tensor's
    value under fake tensors, else None."""
    if type(exc).__name__ not in DATA_DEPENDENT:
        return None
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.abspath(f.filename) == os.path.abspath(script)]
    where = f" at {os.path.basename(script)}:{frames[-1].lineno} ({(frames[-1].line or '').strip()})" if frames else ""
    what = (str(exc).splitlines() or [type(exc).__name__])[0]
    return (f"the script reads a tensor's value{where} ({what}); with --fake-tensors tensors have shapes and no "
            f"values: trace it in a fake world without --fake-tensors")
