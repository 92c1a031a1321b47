"""Where the C++ recorder (`native`) is compiled and kept, known without importing torch.

``meshscope trace`` makes sure the recorder is built before any rank starts (`ensure`); when it is
already in the cache, that check costs a hash and a directory listing, not torch's import (about
1.3 s on a 2-core box), so a trace's own process starts without torch. The cache holds one folder per
torch release, Python and source text (``~/.cache/meshscope/native/<key>``, ``MESHSCOPE_CACHE``
moves it); the torch release is read from the installed package's metadata, the same way in the
command and in every rank.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib import metadata
from pathlib import Path

SOURCE = Path(__file__).with_name("native_recorder.cpp")
NAME = "meshscope_native_recorder"


class NativeUnavailable(RuntimeError):
    """The C++ recorder could not be built or loaded here (the message says why)."""


def torch_version() -> str:
    """The installed torch's version, from its package metadata (torch itself where it has none)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a source tree on sys.path
        import torch

        return torch.__version__


def build_dir() -> Path:
    """One folder per torch release, Python and source text: a change of any of them builds anew."""
    key = hashlib.sha256(SOURCE.read_bytes() + torch_version().encode() + sys.version.encode()).hexdigest()[:16]
    root = Path(os.environ.get("MESHSCOPE_CACHE", Path.home() / ".cache" / "meshscope"))
    return root / "native" / key


def library() -> Path | None:
    """The compiled extension in the cache, None if it is not built for this torch yet."""
    built = sorted(build_dir().glob(f"{NAME}*.so"))
    return built[0] if built else None


def ensure(log=None) -> Path:
    """The compiled extension, compiling it first if this torch has none (`log` gets one progress line)."""
    path = library()
    if path is not None:
        return path
    folder = build_dir()
    if log is not None:
        log(f"building the C++ recorder for torch {torch_version()} (once; about 30 s) in {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(NAME, [str(SOURCE)], build_directory=str(folder), extra_cflags=["-O2"], verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:  # no compiler, no ninja, headers missing
        raise NativeUnavailable(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}") from None
    path = library()
    if path is None:
        raise NativeUnavailable(f"the build left no {NAME}*.so in {folder}")
    return path
