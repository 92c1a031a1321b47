"""The typed records of a traced job: what was asked (`TraceSpec`, ``spec.json``), how each rank ended
(`RankEnd`, ``ranks/rank<R>.json``) and the one verdict (`TraceResult`, ``result.json`` and ``trace
--json``), each with one writer and one reader.

The verdict is decided here only (`TraceResult.outcome`), from the ranks' ends and the checks:

- ``failed``: a rank failed on its own (an exception, a non-zero exit, a collective that timed out
  or was aborted), or a check found a fault;
- ``incomplete``: nothing failed, but not every expected rank finished: one is ``missing`` (killed
  without a record, by a signal or the OOM killer, or never started; a fake world's server that died)
  or was ``terminated`` from outside (SIGTERM: the launcher's watchdog, the user);
- ``empty``: every rank ended (``ok``, or ``stopped`` by ``--steps``) without a single collective: a
  script that exits at its GPU-count check issues nothing, which is not a pass;
- ``passed``: every rank ended, at least one collective, and no check failed.

`EXIT_CODES` maps them to the command's exit status (0 passed, 1 failed or incomplete, 3 empty; 2 is
bad input).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from .clock import Clock
from .events import CommEvent
from .findings import Diagnosis
from .result import Check
from .steady import Steady, of_ranks
from .time_result import TimeSection

OUTCOMES = ("passed", "failed", "empty", "incomplete")
EXIT_CODES = {"passed": 0, "failed": 1, "incomplete": 1, "empty": 3}

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

DIST_ERRORS = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
"""torch.distributed's own exception types (torch/distributed/__init__.py, torch 2.13)."""


def exit_code(exc: SystemExit) -> int:
    """The process exit status of a `SystemExit`, as the interpreter maps it: ``sys.exit()`` and
    ``sys.exit(None)`` 0, an int itself, anything else (a message) 1."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


@dataclass(frozen=True)
class TraceSpec:
    """What a trace directory was asked to hold (``spec.json``): written by `RunDir.begin` before any
    rank starts, read by the assembler and the doctor."""

    world: int
    command: tuple[str, ...]
    """The script (or ``-m MODULE``) and its arguments."""
    traced: int
    """Ranks this directory should hold (one node's workers; a fake world's chosen ranks)."""
    expected: tuple[int, ...] | None = None
    """Which ranks those are, where known before they start (None: a node of several, whose global ranks
    the rendezvous assigns)."""
    nproc_per_node: int = 1
    nnodes: int = 1
    steps: int | None = None
    timeout: float | None = None
    fake_world: bool = False
    ranks: str | None = None
    """A fake world's ``--ranks`` as given (``auto`` or a list)."""

    def to_json(self) -> dict:
        doc = {"kind": "trace", **{f.name: getattr(self, f.name) for f in fields(self)}}
        doc["command"] = list(self.command)
        doc["expected"] = list(self.expected) if self.expected is not None else None
        return doc

    @classmethod
    def from_json(cls, d: dict) -> TraceSpec:
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        values["command"] = tuple(d.get("command", ()))
        values["expected"] = tuple(d["expected"]) if d.get("expected") is not None else None
        values.setdefault("traced", d.get("world", 1))
        return cls(**values)


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
    """The records (paths under the run directory, ``*`` for any rank) a fake world's rank looked for in a P2P
    object message and did not find (``trace.fake.objects``): a rank that then failed is traced again once
    one of them has been written (``trace.fake.world``)."""
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


@dataclass(frozen=True)
class TraceError:
    """Why a traced job did not pass, in one line: the first rank that failed on its own, or what the
    launcher saw when no rank could say (a rank killed without a record, a fork server that died)."""

    message: str
    rank: int | None = None
    log: str = ""
    """The failing rank's output (``logs/rank<R>.log``), where it was kept."""
    exit_code: int | None = None

    def line(self) -> str:
        who = f"rank {self.rank}: " if self.rank is not None else ""
        return f"{who}{self.message}" + (f" (its output: {self.log})" if self.log else "")

    def to_json(self) -> dict:
        return {"message": self.message, "rank": self.rank, "log": self.log, "exit_code": self.exit_code}

    @classmethod
    def from_json(cls, d: dict) -> TraceError:
        return cls(d["message"], d.get("rank"), d.get("log", ""), d.get("exit_code"))


@dataclass(frozen=True)
class LastLines:
    """What the rank that explains a job's outcome printed last (the failing rank; for an empty job, the
    lowest): its exit code and the end of its output (``logs/rank<R>.log``)."""

    rank: int
    exit_code: int | None
    log: str
    lines: tuple[str, ...]
    total: int
    """Lines in the whole log."""

    def to_json(self) -> dict:
        return {"rank": self.rank, "exit_code": self.exit_code, "log": self.log, "lines": list(self.lines),
                "total": self.total}

    @classmethod
    def from_json(cls, d: dict) -> LastLines:
        return cls(d["rank"], d.get("exit_code"), d["log"], tuple(d["lines"]), d.get("total", len(d["lines"])))


@dataclass(frozen=True)
class RankClass:
    """A fake world's class of ranks that issue the same ledger up to relabelling."""

    representative: int
    ranks: str
    """The members as ranges: ``0-7,16``."""
    size: int

    def to_json(self) -> dict:
        return {"representative": self.representative, "ranks": self.ranks, "size": self.size}


@dataclass(frozen=True)
class FakeDevice:
    """The stand-in GPU a fake world's torch.cuda answered as (``--fake-device``), where CUDA was mapped."""

    key: str
    """Its ``--fake-device`` name (``H100``)."""
    name: str
    """As ``torch.cuda.get_device_name`` says it (``NVIDIA H100 80GB HBM3``)."""
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    answered: tuple[str, ...] = ()
    """The device and memory queries it answered on any traced rank; memory statistics are zeros."""

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "answered": list(self.answered)}

    @classmethod
    def from_json(cls, d: dict) -> FakeDevice:
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        return cls(**{**values, "answered": tuple(d.get("answered", ()))})


@dataclass(frozen=True)
class FakeWorld:
    """What a fake world traced of its N ranks, and why those (``fake_world`` of the result)."""

    world: int
    traced: tuple[int, ...]
    classes: tuple[RankClass, ...] | None
    """One per class of rank 0's group creations (``--ranks auto``); None for the ranks given."""
    how: str
    patched: tuple[str, ...] = ()
    """The changes to torch active on any traced rank (the rows of ``trace.fake.patches``)."""
    device: FakeDevice | None = None
    """The stand-in GPU, where CUDA was mapped to the CPU; None on a machine whose torch has CUDA."""

    def to_json(self) -> dict:
        return {"world": self.world, "traced": list(self.traced), "how": self.how,
                "classes": [c.to_json() for c in self.classes] if self.classes is not None else None,
                "patched": list(self.patched), "device": self.device.to_json() if self.device else None}

    @classmethod
    def from_json(cls, d: dict) -> FakeWorld:
        classes = d.get("classes")
        return cls(d["world"], tuple(d["traced"]), tuple(RankClass(**c) for c in classes) if classes is not None else None,
                   d.get("how", ""), tuple(d.get("patched", ())),
                   FakeDevice.from_json(d["device"]) if d.get("device") else None)


@dataclass
class TraceResult:
    """The ledger of a user's job, traced (`meshscope trace`), with the checks that need no prediction.

    The sibling of `core.result.RunResult`: the same `CommEvent`s and `Check`s, but per step and
    without a predicted ledger. `to_json` is the ``trace --json`` document."""

    world: int
    command: list[str]
    """The script (or ``-m MODULE``) and its arguments."""
    events: list[CommEvent]
    """Every traced rank's calls, each with its step."""
    axes: dict[str, list[list[int]]]
    """Axis label -> its groups (member ranks), from the groups the job's calls used."""
    layout: dict
    """The reconstructed layout: ``order``, ``sizes``, ``fits`` and ``text`` (`core.mesh_fit`)."""
    checks: list[Check]
    ranks: list[RankEnd]
    """Every rank the directory should hold (those without a record ``missing``), by rank."""
    run_dir: str = ""
    notes: list[str] = field(default_factory=list)
    expected: int = 0
    """How many ranks the directory should hold (`TraceSpec`): fewer ended ranks make it incomplete."""
    error: TraceError | None = None
    last_lines: LastLines | None = None
    """For a job that did not pass: what the rank that explains it printed last."""
    doctor: Diagnosis | None = None
    """The doctor's findings, for a job that did not pass."""
    fake_world: FakeWorld | None = None
    undecoded: dict[str, int] = field(default_factory=dict)
    """c10d op -> calls of it, over every rank, that no decoder reads (`RankEnd.undecoded`): not in `events`."""
    time: TimeSection | None = None
    """Where the time went: waits per axis, waits each rank caused, stragglers (`timing.stragglers`)."""
    steady: dict[int, Steady] = field(default_factory=dict)
    """Traced rank -> its steady steps, found once from its calls (`core.steady`): what the checks, the
    time section, the budgets and ``place --from-trace`` read."""

    @property
    def outcome(self) -> str:
        """The one verdict (the module docstring defines each)."""
        if any(r.status == "error" for r in self.ranks) or any(c.failed for c in self.checks):
            return "failed"
        if not self.complete:
            return "incomplete"
        return "passed" if self.events else "empty"

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def complete(self) -> bool:
        """Every expected rank ended (ok or stopped), whatever it issued."""
        ended = [r for r in self.ranks if r.ended]
        return bool(ended) and len(ended) == len(self.ranks) and len(ended) >= self.expected

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    @property
    def answered(self) -> dict[str, int]:
        """``file:line`` -> value reads answered there without data, over the traced ranks (`RankEnd.answered`)."""
        out: dict[str, int] = {}
        for r in self.ranks:
            for a in r.answered:
                out[a.at] = out.get(a.at, 0) + a.count
        return out

    def steps_of(self, rank: int) -> dict[int, list[CommEvent]]:
        out: dict[int, list[CommEvent]] = {}
        for e in self.events:
            if e.rank == rank:
                out.setdefault(e.step or 0, []).append(e)
        return out

    def to_json(self) -> dict:
        doc = {"kind": "trace", "world": self.world, "outcome": self.outcome, "passed": self.passed,
               "complete": self.complete, "command": self.command, "layout": self.layout, "axes": self.axes,
               "checks": [c.to_json() for c in self.checks],
               "per_rank": [{"rank": r.rank, "status": r.status,
                             "steps": [{"step": s, "events": [e.to_json() for e in evs]}
                                       for s, evs in sorted(self.steps_of(r.rank).items())]} for r in self.ranks],
               "ranks": [r.to_json() for r in self.ranks], "expected": self.expected, "notes": self.notes,
               "run_dir": self.run_dir, "undecoded": dict(self.undecoded), "answered": self.answered}
        if self.error is not None:
            doc["error"], doc["failure"] = self.error.line(), self.error.to_json()
        if self.last_lines is not None:
            doc["last_lines"] = self.last_lines.to_json()
        if self.doctor is not None:
            doc["doctor"] = self.doctor.to_json()
        if self.fake_world is not None:
            doc["fake_world"] = self.fake_world.to_json()
        if self.time is not None:
            doc["time"] = self.time.to_json()
        doc["steady"] = {str(r): s.to_json() for r, s in sorted(self.steady.items())}
        return doc

    @classmethod
    def from_json(cls, d: dict) -> TraceResult:
        events = [CommEvent.from_json(e) for r in d["per_rank"] for s in r["steps"] for e in s["events"]]
        ranks = [RankEnd.from_json(r) for r in d.get("ranks", [])]
        # a result written before the steady steps were recorded: found from its calls as `assemble` does
        steady = ({int(r): Steady.from_json(s) for r, s in d["steady"].items()} if "steady" in d
                  else of_ranks(events, {r.rank: r.steps for r in ranks if r.status != "missing"}))
        return cls(world=d["world"], command=d.get("command", []), events=events, axes=d["axes"], layout=d["layout"],
                   checks=[Check.from_json(c) for c in d["checks"]],
                   ranks=ranks, run_dir=d.get("run_dir", ""),
                   notes=d.get("notes", []), expected=d.get("expected", 0),
                   error=TraceError.from_json(d["failure"]) if "failure" in d else None,
                   last_lines=LastLines.from_json(d["last_lines"]) if d.get("last_lines") else None,
                   doctor=Diagnosis.from_json(d["doctor"]) if d.get("doctor") else None,
                   fake_world=FakeWorld.from_json(d["fake_world"]) if d.get("fake_world") else None,
                   undecoded=dict(d.get("undecoded", {})),
                   time=TimeSection.from_json(d["time"]) if d.get("time") else None, steady=steady)
