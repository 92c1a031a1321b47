"""Each rank of a fake world sees the working directory as it was when the trace began, and its own
changes only.

A real job's ranks start together; a fake world's run one after another (one per core at a time, forked
by `fork_server`) in the same working directory. So what one rank writes would steer the ranks started
after it: pytorch/examples' ``ddp-tutorial-series/multigpu_torchrun.py`` resumes from the ``snapshot.pt``
rank 0 saved at its end and runs fewer epochs; ``FSDP2/example.py`` loads rank 0's
``checkpoints/dtensor_api/<time>/`` and issues 1080 calls where ranks 0 and 1 issued 705.

How (`isolate`, in the forked rank while it has one thread): the rank enters a mount namespace of its
own (``unshare(CLONE_NEWNS)``; without ``CAP_SYS_ADMIN``, inside a user namespace of its own that maps
its uid and gid to themselves) and mounts over the working directory an overlayfs whose lower layer is
the directory and whose upper layer is a tmpfs of its own, mounted on the directory itself first (the
overlay hides it). Reads see the directory as it is; what the rank creates, changes (copied up whole
when first opened for writing) or removes lands in its tmpfs, which no other process sees and which is
gone with the rank's namespace. The run directory, and any file system mounted below the working
directory, are bound back at their place, so the rank's records reach the real run directory and what
is mounted there stays what it is (shared). This sees every write the rank and its children make,
whatever makes it: ``torch.save`` of a path writes from C++ (``PyTorchFileWriter``, torch 2.13
``serialization.py`` ``_open_zipfile_writer_file``), as do safetensors, mmap loads and subprocesses,
which a redirection of Python's ``open``/``os``/``pathlib`` calls would miss.

Covered: the working directory and everything below it: where the two jobs above keep their
checkpoints, and where torchtitan (``./outputs``) and Lightning (``default_root_dir``) keep theirs by
default.
Not covered: ``/tmp`` and the home directory. They hold what the ranks of a real node share, and every
rank would otherwise make again: torch.compile's compiled graphs and kernels (``/tmp/torchinductor_<user>``,
keyed by their content: torch 2.13 ``_inductor/runtime/cache_dir_utils.py``), downloaded weights and
datasets; torch's DDP tutorial saves a checkpoint to ``tempfile.gettempdir()`` on rank 0 for the others
to load after a barrier. `probe` tries it once in a child of the server; where it fails (no mount
namespace, no user namespace, no overlayfs) the ranks share their files as before and the result says
why, in one line (`note`).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import stat
import sys
from pathlib import Path

# <linux/sched.h> and <linux/mount.h>, called through libc: Python's os has unshare from 3.12 only, and
# no mount at all
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
OWN = "own"
"""`RankEnd.files` of a rank whose files were its own."""
LISTED = 20
"""Paths a rank's record lists of what it wrote (its count says how many more)."""

_scratch: int | None = None
"""This rank's tmpfs below its overlay (a descriptor): ``upper/`` holds what it wrote."""
_shared = ""
"""Why this rank's files were shared ("" where they were its own or no fake world asked)."""


def covered(keep: Path) -> Path:
    """The folder each rank gets its own layer over: the working directory; OSError where it is ``/`` or
    lies inside the run directory `keep`."""
    cwd = Path.cwd().resolve()
    if cwd == Path("/"):
        raise OSError(errno.EINVAL, "the working directory is /, which a mount namespace cannot lay over")
    if cwd.is_relative_to(keep.resolve()):
        raise OSError(errno.EINVAL, f"the working directory {cwd} lies inside the run directory")
    return cwd


def probe(keep: Path) -> str:
    """Whether `isolate` works here, tried in a child forked for it: "" or why not, in one line."""
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux's"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            isolate(keep)
            code = 0
        except BaseException as exc:  # noqa: BLE001 - any failure is the reason, reported by the server
            said = (f"{exc.strerror}{f' ({exc.filename})' if exc.filename else ''}"
                    if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}")
            os.write(write, said.encode()[:300])
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as said:
        reason = said.read().decode(errors="replace").strip()
    _, status = os.waitpid(pid, 0)
    return "" if os.waitstatus_to_exitcode(status) == 0 else reason or f"its probe exited with {status}"


def shared(reason: str) -> None:
    """This rank shares its files with the others (`probe`'s `reason`), as its record says."""
    global _shared
    _shared = reason


def isolate(keep: Path) -> None:
    """Give this process (a forked rank, one thread) its own layer over the `covered` folder, with the
    run directory `keep` bound through; OSError if the system refuses a step."""
    global _scratch
    root, keep = covered(keep), keep.resolve()
    through = _outermost([p for p in (keep, *_mounts_below(root)) if p.is_relative_to(root)])
    user = _enter_namespace()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the other ranks or the host
    kept = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in through]
    lower = os.open(root, os.O_PATH | os.O_DIRECTORY)
    _mount("meshscope", root, "tmpfs", 0, "mode=0700")
    _scratch = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for name in ("upper", "work"):
        os.mkdir(name, dir_fd=_scratch)
    _as_lower(lower, _scratch)
    # Descriptors name the layers: a path in mount's options would need its commas and colons escaped
    _mount("overlay", root, "overlay", 0, f"lowerdir=/proc/self/fd/{lower},upperdir=/proc/self/fd/{_scratch}/upper,"
           f"workdir=/proc/self/fd/{_scratch}/work" + (",userxattr" if user else ""))  # no trusted.* xattrs there
    os.close(lower)
    for path, fd in kept:
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    os.chdir(root)  # into the overlay: the old working directory is the folder below it


def record() -> dict:
    """This rank's `RankEnd` fields: ``files`` (`OWN`, or why they were shared) and ``wrote`` (what it
    created, changed or removed in its layer, at most `LISTED`, then how many more)."""
    if _scratch is None:
        return {"files": _shared} if _shared else {}
    wrote = _written(_scratch)
    more = [f"and {len(wrote) - LISTED} more"] if len(wrote) > LISTED else []
    return {"files": OWN, "wrote": tuple(wrote[:LISTED] + more)}


def note(ends) -> str | None:
    """The result's line about the ranks' files (their `RankEnd`s): why they were shared, or what each
    kept to itself; None when no rank wrote anything."""
    reasons = sorted({e.files for e in ends if e.files and e.files != OWN})
    if reasons:
        return (f"fake world: the ranks shared their files, so a rank saw what the ranks started before it wrote "
                f"(no rank could have its own layer over the working directory: {reasons[0]})")
    wrote = [f"rank {e.rank}: {', '.join(e.wrote)}" for e in ends if e.wrote]
    if not wrote:
        return None
    return ("fake world: each rank saw the working directory as it was when the trace began, and its own changes "
            "only, discarded at its end (" + "; ".join(wrote) + ")")


def _enter_namespace() -> bool:
    """A mount namespace of this process's own; True if it took a user namespace to get one."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) == 0:
        return False
    if ctypes.get_errno() != errno.EPERM:
        _check("unshare(CLONE_NEWNS)", -1)
    uid, gid = os.getuid(), os.getgid()
    _check("unshare(CLONE_NEWUSER | CLONE_NEWNS)", libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:  # the same ids inside, so the script sees no change
            f.write(text)
    return True


def _as_lower(lower: int, scratch: int) -> None:
    """The overlay's root shows its upper folder's owner, mode and times: make them the covered folder's."""
    was = os.stat(lower)
    try:
        os.chown("upper", was.st_uid, was.st_gid, dir_fd=scratch)
    except OSError:  # a user namespace maps only this user: a folder of another's shows as this user's
        pass
    os.chmod("upper", stat.S_IMODE(was.st_mode), dir_fd=scratch)
    os.utime("upper", ns=(was.st_atime_ns, was.st_mtime_ns), dir_fd=scratch)


def _written(scratch: int) -> list[str]:
    """What the rank created or changed (files) and removed (overlayfs's whiteouts), relative to the
    working directory, as the script names them."""
    found = []
    for folder, _, names, fd in os.fwalk("upper", dir_fd=scratch):
        if "__pycache__" in Path(folder).parts:  # Python's bytecode of the script's own modules
            continue
        for name in sorted(names):
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            whiteout = stat.S_ISCHR(info.st_mode) and info.st_rdev == 0
            path = str(Path(folder).relative_to("upper") / name)
            found.append(f"{path} (removed)" if whiteout else path)
    return found


_ESCAPED = re.compile(r"\\([0-7]{3})")


def _mounts_below(root: Path) -> list[Path]:
    """Mount points strictly below `root` (`/proc/self/mountinfo`'s fifth field, octal-escaped)."""
    with open("/proc/self/mountinfo") as info:
        points = [Path(_ESCAPED.sub(lambda m: chr(int(m[1], 8)), line.split()[4])) for line in info]
    return [p for p in points if p != root and p.is_relative_to(root)]


def _outermost(paths: list[Path]) -> list[Path]:
    return [p for p in dict.fromkeys(paths) if not any(o != p and p.is_relative_to(o) for o in paths)]


@functools.cache
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    return libc


def _mount(source: str | None, target, fstype: str | None, flags: int, data: str | None = None) -> None:
    def raw(text):
        return None if text is None else os.fsencode(str(text))
    _check(f"mount {fstype or 'bind'} on {target}",
           _libc().mount(raw(source), raw(target), raw(fstype), flags, raw(data)))


def _check(what: str, result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
