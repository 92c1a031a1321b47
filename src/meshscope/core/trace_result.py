"""The one verdict of a traced job (`TraceResult`, ``result.json`` and ``trace --json``, one writer and one
reader), with why it did not pass (`TraceError`, `LastLines`). What was asked is `core.trace_spec`, how
each rank ended `core.rank_end`, a fake world's section `core.fake_world`.

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

from dataclasses import dataclass, field

from .events import CommEvent, Word
from .fake_world import FakeWorld
from .findings import Diagnosis
from .rank_end import RankEnd
from .result import Check
from .steady import Steady, of_ranks
from .time_result import TimeSection

class Outcome(Word):
    """A trace's one verdict (the module docstring defines each)."""

    PASSED = "passed"
    FAILED = "failed"
    EMPTY = "empty"
    INCOMPLETE = "incomplete"


EXIT_CODES = {Outcome.PASSED: 0, Outcome.FAILED: 1, Outcome.INCOMPLETE: 1, Outcome.EMPTY: 3}


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
    created: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(description, ranks) of every group rank 0 created, member or not, in order (``groups/rank0.jsonl``,
    `trace.created`): the order a budget holds, read once by `assemble`."""
    steady: dict[int, Steady] = field(default_factory=dict)
    """Traced rank -> its steady steps, found once from its calls (`core.steady`): what the checks, the
    time section, the budgets and ``place --from-trace`` read."""

    @property
    def outcome(self) -> Outcome:
        """The one verdict (the module docstring defines each)."""
        if any(r.status == "error" for r in self.ranks) or any(c.failed for c in self.checks):
            return Outcome.FAILED
        if not self.complete:
            return Outcome.INCOMPLETE
        return Outcome.PASSED if self.events else Outcome.EMPTY

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED

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
        doc["created"] = [[desc, list(ranks)] for desc, ranks in self.created]
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
                   time=TimeSection.from_json(d["time"]) if d.get("time") else None, steady=steady,
                   created=tuple((desc, tuple(ranks)) for desc, ranks in d.get("created", ())))
