"""The dispatcher recorder in C++ (`native_recorder.cpp`): `dispatch`'s kernel without Python per call.

Entering Python from the dispatcher is what the Python kernel costs: about 15 us per collective on
this project's 2-core CPU box, and on a GPU's autograd device thread about 125 us (docs/trace.md,
"What it costs"). The C++ kernel sits at the same ``BackendSelect`` key, so it sees exactly the same
calls, and writes a numbers-only summary of each call's arguments into a buffer. `NativeRecorder.drain`
turns the summaries back into the argument shapes `dispatch.DECODERS` read (stand-in tensors with
``nbytes``, ``dtype``, ``shape[0]`` and ``dim()``), so every c10d schema is decoded in one place.

The extension is compiled the first time, once per torch release and source version, by one compiler
command with `torch.utils.cpp_extension`'s flags, into ``~/.cache/meshscope/native``
(``MESHSCOPE_CACHE`` moves it; `native_build`): about 7 s of CPU, and a first trace 13-20 s slower
than the next, on this project's 2-core AMD EPYC box at load 2-10 (torch 2.13 CPU, 2026-12-01; 30-36 s
of CPU and 33-42 s slower before the source shed <torch/extension.h>). ``meshscope trace`` makes sure it
is built before it launches the ranks (`native_build.ensure`, without importing torch); a rank then
only loads it (`build` finds it in the cache), never compiling while the job waits.
``MESHSCOPE_RECORDER=python`` (``meshscope trace --recorder python``) skips it; without a C++
compiler the trace falls back to the Python kernel and says so.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import signal
import sys

import torch

from . import dispatch
from .dispatch import DECODERS, comm_ops, count_undecoded, decode
from .native_build import NAME, NativeUnavailable, build_dir, ensure, library, torch_version

# Argument tags of native_recorder.cpp's flat summaries.
_NONE, _TENSOR, _TENSORS, _TENSOR_LISTS, _INT, _INTS, _GROUP = range(7)


def build(log=None):
    """The compiled module, building it if this torch has none yet (`log` gets one progress line)."""
    ensure(log)
    return load()


def load():
    """The module built earlier by `build`; `NativeUnavailable` if there is none."""
    path = library()
    if path is None:
        raise NativeUnavailable(f"not built for torch {torch_version()} (no {NAME}*.so in {build_dir()})")
    if torch.__version__.split("+")[0] != torch_version().split("+")[0]:  # the cache is keyed by the package
        raise NativeUnavailable(f"the imported torch {torch.__version__} is not the installed package "
                                f"{torch_version()} the cache is keyed by")
    if NAME in sys.modules:
        return sys.modules[NAME]
    spec = importlib.util.spec_from_file_location(NAME, path, loader=importlib.machinery.ExtensionFileLoader(NAME, str(path)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[NAME] = module
    return module


def uninstall() -> None:
    """Remove the C++ kernels if this process loaded them: the dispatcher then runs as without meshscope."""
    if NAME in sys.modules:
        sys.modules[NAME].uninstall()


def installed() -> bool:
    return NAME in sys.modules and sys.modules[NAME].installed()


class _Tensor:
    """What the decoders read of a tensor, rebuilt from its summary."""

    __slots__ = ("nbytes", "dtype", "shape", "_dim")

    def __init__(self, nbytes, dtype, rows, dim):
        self.nbytes, self.dtype, self.shape, self._dim = nbytes, dtype, (rows,), dim

    def dim(self) -> int:
        return self._dim


class NativeRecorder:
    """Records every collective of this process in C++ while active (a context manager); `drain`
    returns the calls since the last drain.

    `context` (a `JobContext`) tells the kernel where the job is: at each of its moves it calls `move`
    with its state's number (`JobContext.states`); the kernel notes the move's time and stamps each call
    after it with that number. Its listener from `__enter__` to `__exit__`; one JobContext at a time (the
    kernel's state is the process's)."""

    def __init__(self, module, context):
        self.module, self.context = module, context
        self._names = comm_ops()  # every c10d op that moves data: those without a decoder are counted
        self._dtypes: dict[int, torch.dtype] = {}
        self._decoded: dict[tuple, tuple] = {}
        self._step = 0
        module.moves()  # what an earlier recorder in this process noted and nobody took: not this job's

    def __enter__(self) -> NativeRecorder:
        dispatch.uninstall()  # one kernel per op and key: the Python one would shadow this one
        self.module.install(self._names)
        self.context.listener = self.module.move
        self.context.moved()  # the state the calls start in: not active yet, so not noted as a move of the job's
        self.module.set_active(True)
        return self

    def __exit__(self, *exc) -> None:
        self.module.set_active(False)
        self.context.listener = None

    def mark(self, step: int) -> None:
        """A step boundary, in order with the calls around it."""
        self.module.mark(step)

    # -- back to Python ----------------------------------------------------------------------------
    def _args(self, flat, groups) -> list:
        out, i = [], 0

        def tensor(j):
            st = flat[j + 1]
            dtype = self._dtypes.get(st) or self._dtypes.setdefault(st, self.module.dtype_of(st))
            return _Tensor(flat[j], dtype, flat[j + 2], flat[j + 3]), j + 4

        while i < len(flat):
            tag = flat[i]
            i += 1
            if tag == _TENSOR:
                t, i = tensor(i)
                out.append(t)
            elif tag == _TENSORS:
                n, i, ts = flat[i], i + 1, []
                for _ in range(n):
                    t, i = tensor(i)
                    ts.append(t)
                out.append(ts)
            elif tag == _TENSOR_LISTS:
                n, i, lists = flat[i], i + 1, []
                for _ in range(n):
                    m, i, ts = flat[i], i + 1, []
                    for _ in range(m):
                        t, i = tensor(i)
                        ts.append(t)
                    lists.append(ts)
                out.append(lists)
            elif tag == _INT:
                out.append(flat[i])
                i += 1
            elif tag == _INTS:
                n = flat[i]
                out.append(list(flat[i + 1:i + 1 + n]))
                i += 1 + n
            elif tag == _GROUP:
                out.append(groups[flat[i]])
                i += 1
            else:
                out.append(None)
        return out

    def drain(self) -> list[tuple]:
        """The calls since the last drain as the trace's raw records: ``(op, group, dtype, b_in, b_out,
        peer, input_splits, output_splits, phase, region, step, t, call id)``, and ``("#step", step, t)``
        marks. A training step repeats its calls, so each distinct summary is decoded once."""
        out, seen = [], self._decoded
        for op, t, state, backward, main, flat, groups, call_id in self.module.drain():
            if op == -1:  # a step mark
                self._step = flat[0]
                out.append(("#step", self._step, t))
                continue
            if op < 0:  # an op it was not registered for, or arguments it could not summarise
                dispatch.errors.append(("c10d op" if op == -2 else "arguments", "the C++ recorder could not read the call"))
                continue
            if self._names[op] not in DECODERS:  # a newer torch's op: counted, every call
                count_undecoded(self._names[op])
                continue
            key = (op, flat, *groups)
            call = seen.get(key)
            if call is None:
                call = decode(self._names[op], self._args(flat, groups))
                if call is None:
                    continue
                seen[key] = call
            _, module, optimizer = self.context.states[state]
            phase, region = self.context.phase_of(backward, optimizer, module if main else "")
            out.append((*call, phase, region, self._step, t, call_id))
        return out

    def gpu_arrivals(self, wait_s: float) -> tuple[list[tuple[int, float]], int]:
        """(call id, t) of every call timed on the GPU (native_recorder.cpp's CUDA events), and how many
        were left without one; waits up to `wait_s` for the GPU to pass the last. Once, at the end."""
        return self.module.gpu_arrivals(wait_s)

    FATAL = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)
    """The signals the C++ recorder watches (native_recorder.cpp's ``FATAL``)."""

    def watch_fatal(self, wake: int, answer: int, end_path: str, ends: dict[int, str]) -> None:
        """On a fatal signal, write its number to fd `wake` and wait (2 s at most) for a byte on fd
        `answer`; without one, write ``ends[signal]`` to `end_path`; then the process ends as it would
        have (native_recorder.cpp, "a fatal signal")."""
        self.module.watch_fatal((wake, answer, end_path, {int(s): text for s, text in ends.items()}))

    def moves(self) -> tuple[float, str, str] | None:
        """The job's moves since the last time asked, as the flight log's ``"x"`` line has them: (the first
        one's time, each one's microseconds after it joined by commas, their state numbers joined by
        commas), None without any: made in C++, with no Python object per move."""
        return self.module.moves()

    def completions(self) -> list[tuple[int, float]]:
        """(call id, t) of every call whose work completed since the last time asked (drain first: a
        call's completion never comes before its record)."""
        return self.module.completions()
