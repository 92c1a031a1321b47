"""How each rank of a traced job ended (`RankEnd`, ``ranks/rank<R>.json``, written once by the rank
itself; a rank without that file is ``missing``), with the groups it used (`GroupUse`) and the value
reads a ``--fake-tensors`` rank answered (`Answered`), and how its error is classed: a collective's
timeout (`TIMED_OUT`), a collective cut off by its peers (`COLLECTIVE_FAILURE`), or the script's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from .clock import Clock

RANK_STATUSES = ("ok", "stopped", "error", "terminated", "missing")

TIMED_OUT = re.compile(r"timed out|timeout|watchdog", re.IGNORECASE)
"""An error of a collective that waited until its timeout: gloo's ``Timed out waiting ... for recv
operation`` (torch 2.13, third_party/gloo/gloo/transport/tcp/unbound_buffer.cc), the store's ``wait
timeout``, NCCL's watchdog."""

COLLECTIVE_FAILURE = re.compile(
    r"connection (closed|reset) by peer|abort|nccl error|ncclInternalError|ProcessGroup.*(shut ?down|destroyed)",
    re.IGNORECASE)
"""An error of a collective cut off by its peers (gloo's ``Connection closed by peer``, ``Connection reset
by peer`` when a peer's process ended; NCCL's communicator aborts): a consequence, not the script's
own logic, and not a wait either."""

CUDA_ONLY = re.compile(
    r"^Unmapped: |not compiled with CUDA|compiled without CUDA|without ATen_cuda library|"
    r"PyTorch is not linked with support for cuda|"
    r"module 'torch\._C[\w.]*' has no attribute '_cud|Tried to instantiate dummy base class|"
    r"Are you sure you have a CUDA build|requires CUDA support|must be a GPU or MTIA tensor")
"""An error of CUDA-only work where torch has no CUDA: what a CPU build of torch 2.13.0 says (read from its
source and its libraries' strings), and a fake world's own refusal (``Unmapped: ...``,
``trace.fake.devices``, which also words a GPU-less CUDA build's). ``torch/cuda/__init__.py:522``
(``_lazy_init``: "Torch not compiled with CUDA enabled", which libtorch_python says of ``torch.cuda.FloatTensor``
too) and ``:141`` ("PyTorch was compiled without CUDA support", its device properties);
``ATen/detail/CUDAHooksInterface.h:67-246`` ("Cannot get CUDA generator without ATen_cuda library",
"Cannot initialize CUDA ...", 21 in all); ``c10/core/impl/DeviceGuardImplInterface.h:417`` ("PyTorch is
not linked with support for cuda devices"); the ``torch._C._cuda*`` bindings a CPU build lacks
(``AttributeError: module 'torch._C' has no attribute '_cuda_getCurrentRawStream'``: bitsandbytes 0.50);
``torch/_utils.py:1034`` (the placeholders of CUDA's C++ types: "Tried to instantiate dummy base class
CUDAGraph"); ``torch/cuda/nvtx.py:15`` ("... Are you sure you have a CUDA build?") and
``torch/cuda/streams.py:40`` ("torch.cuda.Stream requires CUDA support"); and a kernel a library registers
for GPUs only, given the CPU tensors that stand for its GPU's (fbgemm-gpu-cpu 1.8.0's embedding lookups,
TorchRec's row-wise tables on their CUDA path: "weights[0] must be a GPU or MTIA tensor; it is currently on
device CPU", in its libraries' strings)."""

DIST_ERRORS = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
"""torch.distributed's own exception types (torch/distributed/__init__.py, torch 2.13)."""


def exit_code(exc: SystemExit) -> int:
    """The process exit status of a `SystemExit`, as the interpreter maps it: ``sys.exit()`` and
    ``sys.exit(None)`` 0, an int itself, anything else (a message) 1."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


@dataclass(frozen=True)
class GroupUse:
    """A process group a rank issued calls on."""

    name: str
    desc: str
    axis: str
    ranks: tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "desc": self.desc, "axis": self.axis, "ranks": list(self.ranks)}


@dataclass(frozen=True)
class Answered:
    """Value reads a ``--fake-tensors`` rank answered without data, by where they were read
    (``trace.fake.values``)."""

    at: str
    """``file:line`` of the frame that read (a library's, from its package: ``torch/nn/init.py:119``; or the
    script's own)."""
    script: str
    """``file:line`` of the script's own line that led there (the same as `at` for a read of the script's)."""
    answer: str
    """What the reads were given (``1.0``, ``False (a check that finds nothing)``, ``saved without data``)."""
    count: int
    sized: int = 0
    """Calls the function that read this integer issued after the read (an all-to-all: while it ran): their
    sizes are marked assumed (`CommEvent.assumed`)."""

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class RankEnd:
    """How one rank of a traced job ended (``ranks/rank<R>.json``, written once by the rank itself;
    a rank without that file is ``missing``)."""

    rank: int
    status: str
    """``ok`` (the script returned), ``stopped`` (``--steps`` reached), ``error`` (it failed on its own),
    ``terminated`` (SIGTERM from outside: another rank failed, the watchdog, the user) or ``missing``
    (no record: killed before it could write one, or never started)."""
    steps: int = 0
    """Step boundaries (outermost ``optimizer.step()`` returns) the rank passed."""
    error: str = ""
    """One line: what failed (``ValueError: bad batch``, ``the script exited with code 2``)."""
    exit_code: int | None = None
    """The status the rank's process exits with (None: unknown, a missing rank)."""
    exception: str = ""
    """The exception's type name, for a rank that raised."""
    where: str = ""
    """``file:line`` of the script's own innermost frame (not torch's, not a library's) when it raised."""
    origin: str = ""
    """``file:line`` of the frame that raised (inside a library, possibly)."""
    meshscope_frame: str = ""
    """``file:line`` of meshscope's own frame that failed (raised, or called what raised, of its own: not
    passing the script's call on), when meshscope itself broke the job (`trace.script_frames.failed_in`)."""
    note: str = ""
    mapped: tuple[str, ...] = ()
    """A fake world's CUDA calls mapped to the CPU on this rank (``trace.fake.devices``)."""
    patched: tuple[str, ...] = ()
    """A fake world's changes to torch active on this rank (the rows of ``trace.fake.patches``)."""
    files: str = ""
    """A fake world's rank: ``own`` when what it wrote below the working directory was its own
    (``trace.fake.files``), else why its files were shared with the other ranks."""
    wrote: tuple[str, ...] = ()
    """What that rank created, changed or removed in its own layer (discarded at its end), at most 20."""
    device: str = ""
    """A fake world's stand-in GPU on this rank where CUDA was mapped (a ``trace.fake.gpu.GPUS`` name), else empty."""
    device_calls: tuple[str, ...] = ()
    """The device and memory queries the stand-in GPU answered on this rank (``torch.cuda.get_device_name``...)."""
    answered: tuple[Answered, ...] = ()
    """Value reads this ``--fake-tensors`` rank answered without data."""
    stood_in: int = 0
    """A fake world's object collectives that got a stand-in for a rank not traced before (``trace.fake.objects``):
    the sizes of the calls they issued are assumed."""
    unheard: tuple[str, ...] = ()
    """The records (paths under the run directory, ``*`` for any rank) of P2P messages a fake world's rank
    received and did not find: an object message's (``trace.fake.objects``), or a tensor message's of
    integers, for which it took a stand-in (``trace.fake.replay``: what it sent its peer the other way, else
    zeros). A rank that then failed is traced again once one of them has been written (``trace.fake.world``)."""
    made_up: str = ""
    """A fake world's rank: the first receive of integers (a size, a count) whose sender's values were not
    known, so the fake world made them up (``trace.fake.replay``: zeros, or the rank's own), in words:
    ``recv on default_pg [0-1] at step 0 (rank 0 not traced before it): it held zeros``. A failure after it
    may be the fake world's, not the script's (``doctor.blame``)."""
    events: int = 0
    optimizer_steps: int = 0
    groups: tuple[GroupUse, ...] = ()
    decode_errors: tuple[tuple[str, str], ...] = ()
    undecoded: dict[str, int] = field(default_factory=dict)
    """c10d op -> calls of it no decoder of this meshscope reads (a newer torch's op): they ran, and are not in
    `events` (`capture.dispatch.undecoded`)."""
    time: float = 0.0
    """When the rank wrote its end (wall clock): the first failure is the earliest."""
    recorder: str = ""
    clock: Clock | None = None
    """Its place on the common clock (`trace.clock`); None in a fake world or before a default group."""
    unflushed: bool = False
    """Its flight log lacks what it issued after its last flush: it died of a signal its flusher could not
    answer (the C++ recorder wrote this record: ``trace.recording``)."""

    @property
    def ended(self) -> bool:
        return self.status in ("ok", "stopped")

    @property
    def timed_out(self) -> bool:
        """Its error is a collective's timeout (`TIMED_OUT`): it was blocked, waiting for peers that never
        came."""
        return self.status == "error" and bool(TIMED_OUT.search(self.error))

    @property
    def collective_failure(self) -> bool:
        """Its error came from a collective, not from its script: one that timed out, or one its peers cut
        off (`COLLECTIVE_FAILURE`), or any of torch.distributed's own errors."""
        return self.status == "error" and (self.timed_out or self.exception in DIST_ERRORS
                                           or bool(COLLECTIVE_FAILURE.search(self.error)))

    @property
    def cuda_only(self) -> bool:
        """Its error is one of CUDA-only work where torch has no CUDA (`CUDA_ONLY`)."""
        return self.status == "error" and bool(CUDA_ONLY.search(self.error))

    @property
    def script_error(self) -> bool:
        """It failed on its own, outside any collective: the script's exception or non-zero exit."""
        return self.status == "error" and not self.collective_failure

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("mapped", "patched", "wrote", "device_calls"):
            doc[name] = list(getattr(self, name))
        doc["answered"] = [a.to_json() for a in self.answered]
        doc["groups"] = [g.to_json() for g in self.groups]
        doc["decode_errors"] = [list(e) for e in self.decode_errors]
        doc["unheard"] = list(self.unheard)
        doc["undecoded"] = dict(self.undecoded)
        doc["clock"] = self.clock.to_json() if self.clock is not None else None
        return doc

    @classmethod
    def from_json(cls, d: dict) -> RankEnd:
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        for name in ("mapped", "patched", "wrote", "device_calls"):
            values[name] = tuple(d.get(name, ()))
        values["answered"] = tuple(Answered(**a) for a in d.get("answered", ()))
        values["groups"] = tuple(GroupUse(g["name"], g["desc"], g["axis"], tuple(g["ranks"])) for g in d.get("groups", ()))
        values["decode_errors"] = tuple(tuple(e) for e in d.get("decode_errors", ()))
        values["unheard"] = tuple(d.get("unheard", ()))
        values["undecoded"] = dict(d.get("undecoded", {}))
        values["clock"] = Clock.from_json(d["clock"]) if d.get("clock") else None
        if values["status"] not in RANK_STATUSES:
            raise ValueError(f"rank status {values['status']!r} is not one of {', '.join(RANK_STATUSES)}")
        return cls(**values)
