"""Which frames of a traceback or a stack are the script's, and which are the libraries' below it.

A traced rank's error is shown as the script's (its own traceback, without the frames of meshscope and
runpy that ran it) and recorded with two places: ``where``, the script's own innermost frame (the
user's code: not the standard library, not an installed package, not meshscope), and ``origin``, the
frame that raised (inside torch or a framework, possibly). Two ranks failing "the same way" raise the
same exception type at the same ``where``. One rule for all of them, used by the rank program, the
device mapping and the fork server (which imports ahead only library modules).
"""

from __future__ import annotations

import functools
import os
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


def script_traceback(exc: BaseException) -> str:
    """The script's traceback, as ``python SCRIPT`` would print it, without the frames that ran it."""
    tb = traceback.TracebackException.from_exception(exc)
    tb.stack = traceback.StackSummary.from_list(shown(tb.stack))
    return "".join(tb.format())


def raised_at(exc: BaseException) -> tuple[str, str]:
    """(where, origin) of an exception (`where`, `origin`)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return where(frames), origin(frames)
