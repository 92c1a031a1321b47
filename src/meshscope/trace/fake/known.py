"""Values a ``--fake-tensors`` rank can know: what follows from the script's own data, computed for real.

A FakeTensor holds no values, so a read of one is answered with a placeholder (`values`) and an op whose
output's shape depends on values (``bincount``, ``nonzero``, a boolean mask) stops the rank. Much of what a
job reads back is not the model's arithmetic but follows from its Python numbers and its inputs: a MoE
router's balanced assignment (``arange(tokens * k) % experts``, torchtitan 0.2.2's
``--debug.moe_force_load_balance``, models/moe/moe.py:242), the tokens per expert counted from it
(``histc``, ``bincount``), the split sizes read back from those (``tolist``), the permutation a kernel builds
of them; a batch's token ids and what is counted of them. Such tensors keep their values here:

- a tensor is *known* when it was made from data that is not fake (``torch.tensor([...])``, a batch the
  DataLoader made), by a factory whose values follow from its arguments (``arange``, ``zeros``, ``full``,
  ``zeros_like``, ...), or by an op whose tensor operands are all known: the op runs once more on their values,
  for real on the CPU, where its operands and results hold at most `LIMIT` elements each;
- a value read of a known tensor (``item``, ``tolist``, ``torch.equal``) returns its value, and an op whose
  output's shape depends on values gets, from known operands, a fake output of the real shape;
- a collective's output from known inputs holds what it would if every member held this rank's inputs (the
  rule a fake world plays an untraced member by: its class; in a balanced MoE every rank counts the same
  tokens per expert): all-to-all, all-gather, all-reduce and broadcast, functional or not. What follows from
  one is *assumed*: reading it counts as an answer (`values.Reads`), so the calls it sizes are marked assumed
  in the ledger, as for a placeholder;
- writing anything not known into a known tensor (an in-place op with an unknown operand, another
  collective, a skipped kernel) makes its storage unknown;
- a triton kernel whose tensors are all known runs in triton's interpreter on their values (torchtitan's token
  permutation, models/moe/kernels.py:207, with ``TRITON_INTERPRET``: `devices.interpreted_triton_kernels`);
  one with a tensor not known is skipped, and what it could write is unknown.

Random draws (``torch.Tag.nondeterministic_seeded``) make nothing known: a fake world's draws are not the
job's. A learned router's choices follow from the model's weights and stay unknown, so its counts still
stop the rank (run it without ``--fake-tensors``).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from ...capture.dispatch import process_group
from ...capture.work import written_positions

LIMIT = 1 << 22
"""Most elements of an operand or a result computed for real (4 M: a MoE layer's routing at 64 K tokens x top 8
is 0.5 M): what a value read decides is that small; a model's activations are not known anyway."""

aten = torch.ops.aten
_FACTORIES = frozenset(id(getattr(packet, name)) for packet in (
    aten.arange, aten.zeros, aten.ones, aten.full, aten.scalar_tensor, aten.eye, aten.linspace, aten.logspace)
    for name in packet.overloads())
"""Ops whose values follow from their (non-tensor) arguments."""
_SHAPE_ONLY_OPS = frozenset(id(getattr(packet, name)) for packet in (
    aten.zeros_like, aten.ones_like, aten.full_like, aten.new_zeros, aten.new_ones, aten.new_full)
    for name in packet.overloads())
"""Ops whose values follow from their arguments and only the shape, dtype and device of their tensor."""
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
_OP, _SKIP, _COLLECTIVE, _RANDOM, _FACTORY, _SHAPE_ONLY = range(6)
_KINDS: dict = {}
"""Op -> what `Known.after` does with it (`_kind`), decided once per op."""


def _kind(func) -> int:
    if getattr(func, "_schema", None) is None:
        return _SKIP  # a higher-order op (flex_attention): the model's arithmetic
    if func.namespace in _COLLECTIVE_NAMESPACES:
        return _COLLECTIVE
    if torch.Tag.nondeterministic_seeded in func.tags:
        return _RANDOM
    return _FACTORY if id(func) in _FACTORIES else _SHAPE_ONLY if id(func) in _SHAPE_ONLY_OPS else _OP


AS_THIS_RANK = "as if every member held this rank's"
"""How an assumed value is named where it is read (`values.reads`)."""


class Known:
    """This rank's known tensors (one per process: the rank's): FakeTensor -> its value."""

    def __init__(self):
        self.values = WeakIdKeyDictionary()
        self.assumed = WeakIdKeyDictionary()
        """Known FakeTensors whose values follow from a collective's (module doc)."""
        self.unknown: set[int] = set()
        """Storages written with what is not known (their tensors' values are not)."""
        self.launches: dict = {}
        """What an interpreted kernel's launch left in its tensors, by the kernel, its grid and what it read
        (`kernel`), the newest `LAUNCHES`."""

    # -- what is known ----------------------------------------------------------------------------------
    def value(self, t):
        """`t`'s value: a tensor that is not fake is its own; None where not known."""
        if not isinstance(t, FakeTensor):
            return t
        real = self.values.get(t)
        if real is None or t.untyped_storage()._cdata in self.unknown:
            return None
        return real

    def _operands(self, args, kwargs):
        """(flat arguments, their values, whether any is assumed), or None where a tensor operand is not known."""
        flat, spec = tree_flatten((args, kwargs or {}))
        reals, assumed = [], False
        for a in flat:
            if isinstance(a, torch.Tensor):
                real = self.value(a)
                if real is None or real.numel() > LIMIT:
                    return None
                assumed = assumed or a in self.assumed
                a = real
            reals.append(a)
        return reals, spec, assumed

    def _keep(self, fakes, reals, assumed: bool) -> None:
        for fake, real in zip(fakes, reals):
            if (isinstance(fake, FakeTensor) and isinstance(real, torch.Tensor) and fake.shape == real.shape
                    and fake.dtype == real.dtype and real.numel() <= LIMIT and real.device.type != "meta"):
                self.values[fake] = real
                self.unknown.discard(fake.untyped_storage()._cdata)
                if assumed:
                    self.assumed[fake] = True
                else:
                    self.assumed.pop(fake, None)

    def _forget(self, func, args) -> None:
        """What `func` wrote in place is not known: the storages of its written arguments that were (a tensor is
        known from where it is made, so a view of a known one is known too)."""
        for i in written_positions(func):
            if i < len(args):
                for t in tree_flatten(args[i])[0]:  # a c10d op's lists of lists (all_gather's outputs) too
                    if isinstance(t, FakeTensor) and t in self.values:
                        self.unknown.add(t.untyped_storage()._cdata)

    # -- the recorder's hooks (`values.Answers`) --------------------------------------------------------------
    def after(self, func, args, kwargs, out) -> None:
        """`func` ran on fakes with results `out`: where its operands are known, run it on their values. On every
        op of the job: an op with an operand not known (the model's arithmetic) returns at that operand."""
        kind = _KINDS.get(func)
        if kind is None:
            kind = _KINDS[func] = _kind(func)
        if kind == _SKIP:
            return
        if kind == _COLLECTIVE:
            self.collective(func, args, out)
            return
        mutable = func._schema.is_mutable
        if kind == _RANDOM:
            if mutable:
                self._forget(func, args)
            return
        tensors = False
        for a in (*args, *(kwargs.values() if kwargs else ())):
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(t, torch.Tensor):
                    tensors = True
                    if kind != _SHAPE_ONLY and isinstance(t, FakeTensor) and self.value(t) is None:
                        if mutable:
                            self._forget(func, args)
                        return
        if not tensors and kind != _FACTORY:
            return
        if kind == _SHAPE_ONLY:  # its tensor's values do not matter: a stand-in of its shape
            with unset_fake_temporarily():
                args = (torch.empty(args[0].shape, dtype=args[0].dtype), *args[1:])
        outs = tree_flatten(out)[0]
        operands = self._operands(args, kwargs) if all(
            not isinstance(o, torch.Tensor) or (o.numel() <= LIMIT and o.device.type != "meta") for o in outs) else None
        if operands is None:
            if mutable:
                self._forget(func, args)
            return
        reals, spec, assumed = operands
        real_args, real_kwargs = tree_unflatten(reals, spec)
        try:
            with unset_fake_temporarily():
                real_out = func(*real_args, **real_kwargs)
        except Exception:  # noqa: BLE001 - a value this rank cannot compute is one it does not know
            if mutable:
                self._forget(func, args)
            return
        self._keep(outs, tree_flatten(real_out)[0], assumed)

    def read(self, func, args):
        """The value a read of known tensors returns (``_local_scalar_dense``, ``equal``), and whether it is
        assumed; None where an operand is not known."""
        operands = self._operands(args, None)
        if operands is None:
            return None
        reals, spec, assumed = operands
        real_args, _ = tree_unflatten(reals, spec)
        with unset_fake_temporarily():
            return func(*real_args), assumed

    def shaped(self, func, args, kwargs):
        """A fake output of the real shape for an op whose output's shape depends on values (``bincount``,
        ``nonzero``), from known operands; None where one is not known."""
        operands = self._operands(args, kwargs)
        if operands is None:
            return None
        reals, spec, assumed = operands
        real_args, real_kwargs = tree_unflatten(reals, spec)
        mode = next(a.fake_mode for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, FakeTensor))
        with unset_fake_temporarily():
            real_out = func(*real_args, **real_kwargs)
        out = tree_map(lambda r: mode.from_tensor(r) if isinstance(r, torch.Tensor) else r, real_out)
        self._keep(tree_flatten(out)[0], tree_flatten(real_out)[0], assumed)
        return out

    # -- collectives: every member as this rank -------------------------------------------------------------
    def collective(self, func, args, out) -> None:
        name = func._schema.name.split("::", 1)[1]
        try:
            with unset_fake_temporarily():  # values are computed on values: FakeTensorMode would fake them
                done = self._as_this_rank(name, args, out)
        except (RuntimeError, ValueError):
            done = False  # sizes this rule cannot fill (an uneven all-to-all): not known
        if not done:
            self._forget(func, args)

    def _as_this_rank(self, name: str, args, out) -> bool:
        if name == "wait_tensor":
            real = self.value(args[0])
            if real is not None and out is not args[0]:
                self._keep([out], [real], args[0] in self.assumed)
            return True
        if name in ("all_to_all_single", "alltoall_base_"):
            functional = name == "all_to_all_single"
            source, output = (args[0], out) if functional else (args[1], args[0])
            out_splits, in_splits = (args[1], args[2]) if functional else (args[3], args[4])
            group = process_group(args[3] if functional else args[2])
            real = self.value(source)
            if real is None:
                return False
            members, me = group.size(), group.rank()
            parts = real.split(list(in_splits)) if in_splits else real.chunk(members)
            mine = parts[me]
            sizes = list(out_splits) if out_splits else [mine.shape[0]] * members
            if any(s != mine.shape[0] for s in sizes):
                return False
            self._keep([output], [torch.cat([mine] * members)], True)
            return True
        if name in ("all_gather_into_tensor", "_allgather_base_"):
            functional = name == "all_gather_into_tensor"
            source, output = (args[0], out) if functional else (args[1], args[0])
            members = args[1] if functional else process_group(args[2]).size()
            real = self.value(source)
            if real is None:
                return False
            self._keep([output], [torch.cat([real] * members)], True)
            return True
        if name in ("all_reduce", "allreduce_"):
            functional = name == "all_reduce"
            tensors = [args[0]] if functional else list(args[0])
            results = [out] if functional else tensors
            op = _reduction(args[1] if functional else args[2])
            members = process_group(args[2] if functional else args[1]).size()
            reals = [self.value(t) for t in tensors]
            if any(r is None for r in reals):
                return False
            if op == "sum":
                reals = [r * members for r in reals]
            elif op == "product":
                reals = [r ** members for r in reals]
            elif op not in ("avg", "max", "min"):
                return False
            self._keep(results, [r.clone() for r in reals], True)
            return True
        if name in ("broadcast", "broadcast_"):
            functional = name == "broadcast"
            tensors = [args[0]] if functional else list(args[0])
            results = [out] if functional else tensors
            reals = [self.value(t) for t in tensors]
            if any(r is None for r in reals):
                return False
            self._keep(results, reals, True)
            return True
        return False

    # -- triton kernels ---------------------------------------------------------------------------------------
    def kernel(self, run, args, kwargs, launch=None) -> bool:
        """Run an interpreted triton kernel on the values of its FakeTensors (`run(args, kwargs)`) where all are
        known; else skip it, its tensors no longer known. False where it has no FakeTensor (run it as it is).

        A launch of the same kernel (`launch`: it and its grid) on the same values leaves what the first left:
        a triton kernel reaches memory only through its tensor arguments. Balanced routing gives every MoE
        layer of every microbatch the same counts, and triton's interpreter runs a kernel's every block op in
        Python: torchtitan's token permutation (models/moe/kernels.py:47) took 70 % of a Qwen3 30B-A3B rank's
        trace (py-spy, this project's box, 2026-12-07), 96 launches a microbatch on the same values."""
        fakes = [a for a in (*args, *kwargs.values()) if isinstance(a, FakeTensor)]
        if not fakes:
            return False
        reals = [self.value(f) for f in fakes]
        if any(r is None for r in reals):
            for f in fakes:
                self.unknown.add(f.untyped_storage()._cdata)
            return True
        swap = {id(f): r for f, r in zip(fakes, reals)}
        args, kwargs = tuple(swap.get(id(a), a) for a in args), {k: swap.get(id(v), v) for k, v in kwargs.items()}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        with _disable_current_modes():
            key = _launch_key(launch, args, kwargs, tensors)
            left = self.launches.get(key) if key is not None else None
            if left is not None:
                for tensor, value in zip(tensors, left):
                    tensor.copy_(value)
                return True
        with unset_fake_temporarily():
            run(args, kwargs)
        if key is not None:
            with _disable_current_modes():
                if len(self.launches) >= LAUNCHES:
                    del self.launches[next(iter(self.launches))]
                self.launches[key] = [tensor.clone() for tensor in tensors]
        return True


LAUNCHES = 64
"""Interpreted kernel launches `Known.kernel` keeps what they left of (each their tensors' values)."""


def _launch_key(launch, args, kwargs, tensors) -> tuple | None:
    """A launch by its kernel and grid, each argument (a tensor by its dtype, shape, strides and bytes; a
    number, string or None as it is) and which tensors share a storage; None where an argument is anything
    else, or the grid is not a tuple of numbers (a callable: computed at the launch)."""
    if launch is None or not all(isinstance(a, (torch.Tensor, int, float, bool, str, type(None)))
                                 for a in (*args, *kwargs.values())):
        return None
    kernel, grid = launch
    if not (isinstance(grid, tuple) and all(isinstance(g, int) for g in grid)):
        return None

    def read(a):
        if not isinstance(a, torch.Tensor):
            return a
        data = a.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        return (a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), hash(data))

    storages = [t.untyped_storage().data_ptr() for t in tensors]
    return (kernel, grid, tuple(read(a) for a in args), tuple((k, read(v)) for k, v in sorted(kwargs.items())),
            tuple(storages.index(s) for s in storages))


def _reduction(op) -> str:
    """A reduction's name: a functional collective's string, or a c10d op's ReduceOp (a ScriptObject whose
    ``op()`` is its ``RedOpType``'s number)."""
    import torch.distributed as dist

    if isinstance(op, str):
        return op.lower()
    return dist.ReduceOp.RedOpType(op.op()).name.lower()


known = Known()


def interpreted_kernels_on_known_values() -> None:
    """Triton's interpreter runs a kernel on the values of its known FakeTensors (`Known.kernel`)."""
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run
    if getattr(original, "__meshscope__", False):
        return

    def run(self, *args, grid, warmup, **kwargs):
        launch = None if warmup else (id(self), grid)
        if known.kernel(lambda a, k: original(self, *a, grid=grid, warmup=warmup, **k), args, kwargs, launch):
            return None
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run.__meshscope__ = True
    InterpretedFunction.run = run
