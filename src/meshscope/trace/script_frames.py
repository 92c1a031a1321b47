"""Which frames of a traceback or a stack are the script's, and which are the libraries' below it.

A traced rank's error is shown as the script's (its own traceback, without the frames of meshscope and
runpy that ran it) and recorded with two places: ``where``, the script's own innermost frame (the
user's code: not the standard library, not an installed package, not meshscope), and ``origin``, the
frame that raised (inside torch or a framework, possibly). Two ranks failing "the same way" raise the
same exception type at the same ``where``. One rule for all of them, used by the rank program, the
device mapping and the fork server (which imports ahead only library modules).

A third place, ``meshscope_frame``, is meshscope's own frame when meshscope itself failed (`failed_in`):
then its traceback keeps meshscope's frames, for the bug report.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import sysconfig
import traceback
from pathlib import Path

MESHSCOPE = str(Path(__file__).resolve().parent.parent) + os.sep
"""meshscope's own package folder: its frames are never the script's."""

LIBRARY_ROOTS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})
"""Where the standard library and installed packages live."""


def _runner(filename: str) -> bool:
    """meshscope's or runpy's frame: what ran the script, not the script."""
    return os.path.abspath(filename).startswith(MESHSCOPE) or "runpy" in Path(filename).name  # "<frozen runpy>" too


@functools.cache  # asked per frame of every value read a fake rank answers (`fake.values`)
def is_library(filename: str) -> bool:
    """A frame of the standard library, an installed package or meshscope: not the user's own code."""
    return os.path.abspath(filename).startswith(LIBRARY_ROOTS) or _runner(filename)


def short(filename: str) -> str:
    """A frame's file as a one-line message names it: a library's from its package (``torch/nn/init.py``),
    the script's by its name."""
    path = os.path.abspath(filename)
    root = max((r for r in LIBRARY_ROOTS if path.startswith(r)), key=len, default=None)  # site-packages lies in a root
    return path[len(root):] if root else os.path.basename(filename)


def shown(frames) -> list[traceback.FrameSummary]:
    """The frames a user's traceback shows: all but meshscope's and runpy's."""
    return [f for f in frames if not _runner(f.filename)]


def place(frame: traceback.FrameSummary | None) -> str:
    return f"{frame.filename}:{frame.lineno}" if frame is not None else ""


def own(frames) -> traceback.FrameSummary | None:
    """The script's own innermost frame (of `frames`, outermost first): the innermost that is not a
    library's; when the job is all library code (``-m`` of an installed trainer), the innermost of the
    module it ran."""
    frames = shown(frames)
    mine = [f for f in frames if not is_library(f.filename)]
    if mine:
        return mine[-1]
    entry = [f for f in frames if f.filename == frames[0].filename] if frames else []
    return entry[-1] if entry else None


def where(frames) -> str:
    """``file:line`` of the script's own innermost frame (`own`)."""
    return place(own(frames))


def origin(frames) -> str:
    """``file:line`` of the innermost frame: where the error was raised."""
    frames = list(frames)
    return place(frames[-1] if frames else None)


def _below_the_runner(frames) -> list[traceback.FrameSummary]:
    """The frames from the script's first on: without those of meshscope and runpy that ran it."""
    frames = list(frames)
    first = next((i for i, f in enumerate(frames) if not _runner(f.filename)), len(frames))
    return frames[first:]


_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


def _running(frame: traceback.FrameSummary) -> str:
    """The part of its line a frame was running: the columns of its instruction (Python 3.11+, UTF-8 byte
    offsets), else the whole line."""
    line = linecache.getline(frame.filename, frame.lineno)
    if getattr(frame, "colno", None) is not None:
        raw = line.encode()
        line = raw[frame.colno:frame.end_colno if frame.end_lineno == frame.lineno else None].decode(errors="replace")
    return line.strip()


def _handed(code) -> tuple[str, ...]:
    """The names a function was handed: its arguments and its closure's variables."""
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) \
        + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:count] + code.co_freevars


def _passes_on(frame: traceback.FrameSummary, names: tuple[str, ...]) -> bool:
    """The frame was calling what it was handed (a wrapper's ``original``, a mode's ``func``: one of
    `names`, `_handed`), or raising on purpose (``raise unmapped(...)``: a fake world's refusal): the
    failure passed through it, it did not fail there."""
    text = _running(frame)
    if text.startswith("raise"):
        return True
    callee = _CALLEE.search(text)
    return callee is not None and callee.group(1) in names


def failed_in(exc: BaseException) -> str:
    """``file:line`` of meshscope's own frame where `exc` was raised or left a call meshscope made of its own
    (``json.dumps`` in its group log: nanotron's numpy ranks, before f17a67e), below the script's first
    frame; empty where meshscope only passed the script's call on (its wrappers and TorchFunctionMode
    call the function they were handed: a script's bad argument to ``all_reduce`` fails through them) or
    raised on purpose, or where no frame of meshscope's is below the script's."""
    frames = traceback.extract_tb(exc.__traceback__)
    below = len(frames) - len(_below_the_runner(frames))
    ours = [i for i in range(below, len(frames)) if os.path.abspath(frames[i].filename).startswith(MESHSCOPE)]
    if not ours:
        return ""
    i = ours[-1]
    code = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)][i].f_code
    if _passes_on(frames[i], _handed(code)):
        return ""
    return place(frames[i])


def script_traceback(exc: BaseException) -> str:
    """The script's traceback, as ``python SCRIPT`` would print it, without the frames that ran it; where
    meshscope failed (`failed_in`), with meshscope's frames below the script's, so that its report shows
    where."""
    tb = traceback.TracebackException.from_exception(exc)
    keep = _below_the_runner if failed_in(exc) else shown
    tb.stack = traceback.StackSummary.from_list(keep(tb.stack))
    return "".join(tb.format())


def raised_at(exc: BaseException) -> tuple[str, str, str]:
    """(where, origin, meshscope's frame) of an exception (`where`, `origin`, `failed_in`); where meshscope
    did not fail, its frames are not the origin either (its TorchFunctionMode forwards every torch call of
    a fake world's script: the origin was torch's C++, below the frame that called it)."""
    frames, ours = traceback.extract_tb(exc.__traceback__), failed_in(exc)
    raised = frames if ours else [f for f in frames if not os.path.abspath(f.filename).startswith(MESHSCOPE)]
    return where(frames), origin(raised), ours
