"""Where the C++ recorder (`native`) is compiled and kept, known without importing torch.

``meshscope trace`` makes sure the recorder is built before any rank starts (`ensure`); when it is
already in the cache, that check costs a hash and a directory listing, not torch's import (about
1.3 s on a 2-core box), so a trace's own process starts without torch. The cache holds one folder per
torch release, Python and source text (``~/.cache/meshscope/native/<key>``, ``MESHSCOPE_CACHE``
moves it); the torch release is read from the installed package's metadata, the same way in the
command and in every rank. It compiles without torch's import too (`command`).

A newcomer's first trace waits for the compiler, so the source includes only what it uses.
Measured on this project's 2-core AMD EPYC box, torch 2.13 CPU (2026-12-01), in CPU seconds, which
the machine's load changes less than the wall time: the source as it was (on <torch/extension.h>,
built by ``torch.utils.cpp_extension.load``) took 30-36 s, 26 s of them its compilation; measured
alone, reading <ATen/ATen.h> (which the process group's header includes) took 7 s, and pybind11's
bindings of the module's 8 functions 7 s. The source now (torch/library.h, Python's C API) takes 6.6-7.1 s,
compiled and linked in one command: 7-13 s of wall time at load 1.4-2.8. Its completion callbacks
need c10d's Work.hpp, which includes <ATen/ATen.h>: with that header whole, the callbacks alone
compiled apart took 11.8 s of CPU; with `HEADERS`' two in its place 7.6 s apart, and 9.1 s for the
whole file in one against 8.9 s without the callbacks (load 3-3.7); `ensure` then took 8.5 s of CPU,
9.2 s of wall time (load 2.1). A first trace of
``tests/jobs/ddp.py --steps 3`` on 2 ranks (`benchmarks/bench_first_trace.py`, medians of 3, a cold
cache vs a warm one) went from 32.8-41.5 s slower than a warm one (load 2.7-4.9) to 12.8 s (load
1.7-3.9), and 19.8 s with the machine at load 5-10 (docs/trace.md has the table).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

SOURCE = Path(__file__).with_name("native_recorder.cpp")
# ATen/ATen.h as the two headers the source's Work.hpp uses of it (the header says why).
HEADERS = Path(__file__).with_name("native_headers")
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
    text = SOURCE.read_bytes() + (HEADERS / "ATen" / "ATen.h").read_bytes()
    key = hashlib.sha256(text + torch_version().encode() + sys.version.encode()).hexdigest()[:16]
    root = Path(os.environ.get("MESHSCOPE_CACHE", Path.home() / ".cache" / "meshscope"))
    return root / "native" / key


def library() -> Path | None:
    """The compiled extension in the cache, None if it is not built for this torch yet."""
    built = sorted(build_dir().glob(f"{NAME}*.so"))
    return built[0] if built else None


def command(output: Path, headers: bool = True) -> list[str]:
    """The compiler command that builds `SOURCE` into `output`, found without importing torch
    (`headers`: with `HEADERS` before torch's own).

    What torch 2.13's ``torch.utils.cpp_extension.load`` runs for a C++ extension on Linux and macOS
    (torch/utils/cpp_extension.py): its compiler (``$CXX``, else ``c++``), ``-fPIC -std=c++20 -shared``,
    torch's ``-lc10 -ltorch_cpu -ltorch -ltorch_python``, ``-undefined dynamic_lookup`` on macOS and no
    pybind11 ABI flags (`_get_pybind11_abi_build_flags` returns none); with torch's and Python's include
    folders only (the source needs no ``torch/csrc/api/include``). One command: neither torch's import
    (about 2 s of CPU) nor ninja come before the compiler. ``-O2`` as `load` was given: ``-O1``
    compiled this source no faster (7.4 s of CPU vs 7.5 s), reading the headers is most of it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise NativeUnavailable("torch is not installed")
    torch = Path(spec.submodule_search_locations[0])
    return [os.environ.get("CXX", "c++"), "-O2", "-fPIC", "-std=c++20", "-shared",
            *(["-I", str(HEADERS)] if headers else []), "-isystem", str(torch / "include"), "-isystem", sysconfig.get_path("include"), str(SOURCE),
            "-o", str(output), f"-L{torch / 'lib'}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python",
            *(["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else [])]


def ensure(log=None) -> Path:
    """The compiled extension, compiling it first if this torch has none (`log` gets one progress line).

    Builds started at once (two traces, or the ranks of ``torchrun -m meshscope.trace``) take turns
    on a lock in the folder: the first compiles, the others find its library. The compiler writes to
    a name `library` does not match, renamed into place when complete, so an interrupted build leaves
    nothing a later one would load."""
    path = library()
    if path is not None:
        return path
    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
        return library() or _compile(folder, log)


def _compile(folder: Path, log) -> Path:
    if log is not None:
        log(f"building the C++ recorder for torch {torch_version()} (once; 10-20 s on 2 busy cores) in {folder}")
    partial, path = folder / f"{NAME}.{os.getpid()}.partial", folder / f"{NAME}.so"
    try:
        proc = subprocess.run(command(partial), capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:  # a torch whose Work.hpp needs more of ATen than HEADERS has
            proc = subprocess.run(command(partial, headers=False), capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
            error = next((line for line in lines if "error" in line), lines[-1])
            raise NativeUnavailable(f"the compiler failed: {error.strip()[:200]}")
        os.replace(partial, path)
    except OSError as exc:  # no compiler
        raise NativeUnavailable(f"{type(exc).__name__}: {str(exc).strip()[:200]}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path
