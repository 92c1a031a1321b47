"""A value read without data under ``--fake-tensors``: answered where the answer cannot mislead the
ledger, one line naming both places where it could.

A FakeTensor has a shape and no values, so torch 2.13's FakeTensorMode raises on every read of one
(``DataDependentOutputException`` from ``aten._local_scalar_dense``: ``.item()``, ``int()``,
``float()``, ``bool()``, ``if tensor:``, ``.tolist()``; and ``torch.equal``, ``allclose``). Training
code reads values all the time without any of them deciding a collective: a loss logged, a grad norm
turned into a float, torchtitan's global token count (``distributed/utils.py:58``), Megatron's check
that the CPU generator was left alone (``tensor_parallel/random.py:264``), torch's own
``nn.init.trunc_normal_`` rejection loop (``torch/nn/init.py:119``). The dispatch mode that records
the calls (`capture.dispatch.ModeRecorder`) answers those reads with a placeholder (`Answers`,
`recorder`):

- a check for trouble finds none: a read of what ``any``, ``isnan`` / ``isinf`` / ``isposinf`` /
  ``isneginf`` made, or of the ``found_inf`` AMP's unscale fills, is ``False`` / ``0`` (so a
  rejection loop ``while mask.any()`` ends after one draw, and ``GradScaler`` takes its step);
- every other read is ``True`` / ``1`` / ``1.0`` (``torch.all(a == b)``, ``torch.equal`` hold; a count
  or a norm is nonzero, so a division by it stands);
- an integer can size a collective (split sizes, a buffer allocated for what peers send), so a call
  that a function issues after it read an integer (in the same run of it) has its sizes marked
  assumed (``CommEvent.assumed``: ``bytes_in`` and ``bytes_out``), and an all-to-all its splits and
  sizes while any such function runs (splits are numbers a caller passes down to the layer that
  exchanges them); ``meshscope diff`` compares those calls on their other fields only. Calls that
  torch's parallel APIs issue below the function (DDP's buckets in ``backward()``, FSDP's gathers)
  are sized by parameters, not by the read, and are not marked. A size returned to a caller that
  allocates a buffer for a collective of its own is not followed.

Every answer is counted by where it was read (`core.rank_end.Answered`: the frame that read it,
a library's file and line or the script's own, and the script's line that led there), in the rank's
end and the result's note. What FakeTensorMode answers itself (a tensor made from a Python number
keeps its value) is not counted.

What still stops the rank, with one line naming both places (`value_read`): an op whose output
*shape* depends on values (``nonzero``, ``bincount``, ``unique``, ``masked_select``, indexing by a
boolean mask): MoE routing counts from a router's choices decide an all-to-all's splits, and a shape
made up there would be a routing made up; and code that reads a tensor's memory itself (``numpy()``,
a C++ extension: "data is not allocated yet"). Such a script runs in a fake world without
``--fake-tensors``. A teardown error raised while that failure unwound (Lightning's "Please call
iter(combined_loader) first") does not hide it: the first cause is reported.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections import Counter

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils.weak import WeakIdKeyDictionary

from ...capture.dispatch import ModeRecorder
from ...core.rank_end import Answered
from ..script_frames import MESHSCOPE, own, short
from .known import AS_THIS_RANK, known

_TORCH = os.path.dirname(torch.__file__) + os.sep
MACHINERY = (MESHSCOPE,) + tuple(_TORCH + p for p in (
    "_tensor.py", "overrides.py", "_ops.py", "_compile.py", "_subclasses" + os.sep, "_dynamo" + os.sep,
    "_refs" + os.sep, "_decomp" + os.sep, "_prims" + os.sep, "_prims_common" + os.sep,
    os.path.join("utils", "_python_dispatch.py"), os.path.join("utils", "_stats.py"),
    os.path.join("utils", "_device.py"), os.path.join("distributed", "tensor", "_api.py"),
    os.path.join("distributed", "tensor", "_dispatch.py")))
"""Frames that turn a call into a fake op (torch's dispatch, FakeTensorMode, DTensor's dispatch,
meshscope's modes): the frame that *read* is the first one outside them."""


CALLING = MACHINERY + tuple(_TORCH + os.path.join(*p) for p in (
    ("distributed", "distributed_c10d.py"), ("distributed", "c10d_logger.py"),
    ("distributed", "_functional_collectives.py"), ("distributed", "nn", ""), ("autograd", "function.py")))
"""Frames between a function and the collective it calls (torch.distributed's API, its autograd wrappers)."""


HANDLERS = ("__torch_function__", "__torch_dispatch__")
"""A mode's or a tensor subclass's handler (the script's own too) is machinery as well: it passes the call on."""


@functools.cache
def _machinery_file(filename: str) -> bool:
    return filename.startswith(MACHINERY)


def _machinery(filename: str, function: str) -> bool:
    return function in HANDLERS or _machinery_file(filename)


@functools.cache
def _torch_api(filename: str) -> bool:
    """A frame of torch that is not how a call reaches a collective: DDP, FSDP, DTensor, autograd, nn."""
    return filename.startswith(_TORCH) and not filename.startswith(CALLING)


_aten = torch.ops.aten
_FINDINGS = {id(getattr(packet, name)) for packet in (_aten.any, _aten.isnan, _aten.isinf, _aten.isposinf,
                                                       _aten.isneginf) for name in packet.overloads()}
"""Ops whose output says whether something is wrong (a NaN, an out-of-range draw): read as 'nothing'."""
_FOUND_INF = {id(getattr(_aten._amp_foreach_non_finite_check_and_unscale_, name))
              for name in _aten._amp_foreach_non_finite_check_and_unscale_.overloads()}
"""AMP's unscale, which fills its second argument (``found_inf``) with whether a gradient was not finite."""

_COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<setcomp>", "<dictcomp>")
SIZES = ("bytes_in", "bytes_out")
SPLITS = ("input_splits", "output_splits") + SIZES


class Reads:
    """This rank's answered reads (one per process: the rank's), and the calls they may have sized."""

    def __init__(self):
        self.counts: Counter = Counter()
        """(at, script, answer) -> reads."""
        self.sized: Counter = Counter()
        """(at, script, answer) -> calls the function that read it issued after the read (all-to-alls: any
        issued while it ran), whose sizes are marked assumed."""
        self.sizing: list[tuple] = []
        """(frame, key) of the functions that read an integer and may still be running."""
        self.assumed: dict[int, tuple[str, ...]] = {}
        """Index of a call in this rank's order -> its fields a read may have sized."""
        self.calls = 0

    def count(self, frame, answer: str, sizes: bool) -> None:
        """One read answered with `answer`, made below `frame` (the innermost frame of the read)."""
        while frame is not None and _machinery(frame.f_code.co_filename, frame.f_code.co_name):
            frame = frame.f_back
        reader = frame
        stack = traceback.StackSummary.extract(traceback.walk_stack(reader), lookup_lines=False)[::-1]
        key = (_site(stack[-1] if stack else None), _site(own(stack)), answer)
        self.counts[key] += 1
        while reader is not None and reader.f_code.co_name in _COMPREHENSIONS:
            reader = reader.f_back  # a comprehension's value is its function's
        if sizes and reader is not None and all(f is not reader or k != key for f, k in self.sizing):
            self.sizing.append((reader, key))

    def issued(self, op: str) -> None:
        """A call is being issued: its sizes are assumed when the function that issued it read an integer
        earlier in this run of it; an all-to-all's splits and sizes, while any such function runs (its
        splits are numbers callers pass down)."""
        if self.sizing:
            on_stack, direct = callers(sys._getframe(1))
            self.sizing = [(f, key) for f, key in self.sizing if id(f) in on_stack]  # those still running
            sizers = [key for f, key in self.sizing if op == "all_to_all" or id(f) in direct]
            if sizers:
                self.assumed[self.calls] = SPLITS if op == "all_to_all" else SIZES
                for key in sizers:
                    self.sized[key] += 1
        self.calls += 1

    def records(self) -> tuple[Answered, ...]:
        return tuple(Answered(at, script, answer, n, self.sized[(at, script, answer)])
                     for (at, script, answer), n in self.counts.items())


reads = Reads()


def callers(frame) -> tuple[set[int], set[int]]:
    """The ids of the frames on the stack from `frame` outwards, and of those among them that called it
    directly: through torch.distributed's API and code outside torch only, not through torch's own parallel
    APIs or autograd (a call DDP or FSDP issues is sized by parameters). `Reads.issued` and
    `replay.Replay` mark the calls a function issues directly after it read or received an integer."""
    on_stack, direct, through_torch = set(), set(), False
    while frame is not None:
        on_stack.add(id(frame))
        if not through_torch:
            direct.add(id(frame))
            through_torch = _torch_api(frame.f_code.co_filename)
        frame = frame.f_back
    return on_stack, direct


def issuer(frame):
    """The function that issued the collective `frame` is inside: the first frame outside `CALLING` (torch.distributed's
    API, its autograd wrappers, meshscope's own), or None."""
    while frame is not None and (frame.f_code.co_name in HANDLERS or frame.f_code.co_filename.startswith(CALLING)):
        frame = frame.f_back
    return frame


def _site(frame: traceback.FrameSummary | None) -> str:
    return f"{short(frame.filename)}:{frame.lineno}" if frame is not None else ""


class Answers:
    """What `capture.dispatch.ModeRecorder` gives a value read of a FakeTensor (module doc): a known tensor's
    value (`known`), else a placeholder; and the outputs it watches: those that say whether something is wrong."""

    watched = frozenset(_FINDINGS | _FOUND_INF)

    def __init__(self):
        self.findings = WeakIdKeyDictionary()
        """FakeTensors that say whether something is wrong (`_FINDINGS`)."""

    def after(self, func, args, kwargs, out) -> None:
        """Every op and call of the job, after it ran on fakes."""
        if id(func) in self.watched:
            self.findings[args[1] if id(func) in _FOUND_INF else out] = True
        known.after(func, args, kwargs, out)

    def shaped(self, func, args, kwargs, exc: DynamicOutputShapeException):
        """An op whose output's shape depends on values: its output from known operands, else the rank stops."""
        out = known.shaped(func, args, kwargs)
        if out is None:
            raise exc
        return out

    def answer(self, func, args, exc: DataDependentOutputException):
        read = known.read(func, args)
        if read is not None:
            value, assumed = read
            if assumed:  # what a collective's rule filled in (`known`): it may size calls, as a placeholder may
                reads.count(sys._getframe(), f"{value} ({AS_THIS_RANK})", sizes=type(value) is int)
            return value
        returns = func._schema.returns
        kind = str(returns[0].type) if len(returns) == 1 else ""
        finding = bool(args) and isinstance(args[0], torch.Tensor) and args[0] in self.findings
        if kind == "bool":  # torch.equal, allclose
            value = True
        elif kind == "number" and args and isinstance(args[0], torch.Tensor):  # _local_scalar_dense, item
            value = _placeholder(args[0].dtype, finding)
        else:
            raise exc  # not a number read: FakeTensorMode's own error stands
        reads.count(sys._getframe(), f"{value} (a check that finds nothing)" if finding else str(value),
                    sizes=type(value) is int)
        return value


def recorder(sink, work=None) -> ModeRecorder:
    """The dispatch mode of a ``--fake-tensors`` rank: its calls to `sink`, each counted for the reads that may
    have sized it (`Reads.issued`), its value reads answered (`Answers`), and every op counted by `work` (a
    `capture.work.WorkCounter`, ``meshscope forecast``) where given."""
    def issue(*call):
        reads.issued(call[0])
        return sink(*call)
    return ModeRecorder(issue, Answers(), work)


def _placeholder(dtype: torch.dtype, finding: bool):
    if dtype == torch.bool:
        return not finding
    if dtype.is_complex:
        return complex(not finding)
    if dtype.is_floating_point:
        return 0.0 if finding else 1.0
    return 0 if finding else 1


_STOPS = {"DynamicOutputShapeException": "its output's shape depends on tensor values",
          "DataDependentOutputException": "it reads a tensor's value"}
_MEMORY = ("data is not allocated yet", ".numpy() is not supported for tensor subclasses")


def _what(exc: BaseException) -> str | None:
    """What a value-read failure did, else None."""
    name = type(exc).__name__
    if name in _STOPS:
        return f"{exc} ({_STOPS[name]})"
    text = str(exc)
    if isinstance(exc, RuntimeError) and any(m in text for m in _MEMORY):
        return f"{text.splitlines()[0]} (it reads a tensor's memory)"
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what it was raised while handling (or from), outermost first."""
    out = []
    while exc is not None and all(exc is not e for e in out):
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def value_read(exc: BaseException) -> tuple[str, BaseException] | None:
    """(the one-line error, the exception it is about) when `exc` is, or was raised while handling, a
    value read that has no answer (module doc); the first such cause, so a teardown error does not
    hide it. The line names the frame that read (a library's file and line) and the script's line."""
    cause = next((e for e in reversed(_chain(exc)) if _what(e)), None)
    if cause is None:
        return None
    frames = list(traceback.extract_tb(cause.__traceback__))
    if cause is not exc and frames:
        # A cause's traceback begins where it was caught (inside a framework, for a masked one); the frames
        # above that are those of the exception that reached the script.
        outer = list(traceback.extract_tb(exc.__traceback__))
        caught = next((i for i, f in enumerate(outer) if (f.filename, f.name) == (frames[0].filename, frames[0].name)),
                      len(outer))
        frames = outer[:caught] + frames
    inner = len(frames)
    while inner and _machinery(frames[inner - 1].filename, frames[inner - 1].name):
        inner -= 1
    reader = frames[inner - 1] if inner else None
    script = own(frames[:inner])

    def said(f) -> str:
        text = (f.line or "").strip()
        return f"{short(f.filename)}:{f.lineno}" + (f" ({text})" if text else "")

    where = ""
    if reader is not None:
        where = f" at {said(reader)}" + (f", from {said(script)}" if script is not None and script is not reader else "")
    line = (f"{_what(cause)}{where}: with --fake-tensors tensors have no values, and what they decide here cannot "
            f"be made up: trace it in a fake world without --fake-tensors")
    return line, cause
