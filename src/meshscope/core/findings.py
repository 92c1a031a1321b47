"""The doctor's typed report: each `Finding` (a named root cause placed on its axis and ranks) and the
`Diagnosis` of a directory, written once by `doctor.diagnose` and read by the command line, the
trace's result and `--json` alike (docs/design.md, "Stable interfaces": ``doctor --json``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Finding:
    """One diagnosis: the group (axis and ranks) it is placed on, the entry where the ranks first diverge,
    and the cause in plain words."""

    kind: str
    axis: str
    group: list[int]
    ranks: list[int]
    """The ranks the finding is about (stuck, divergent, or offending)."""
    entry: str
    """The first divergent entry, e.g. 'collective #3: all_reduce 256 KiB'."""
    cause: str
    t: float = float("inf")
    """When the first divergent entry was issued; the earliest finding is the likeliest root cause."""
    derived: bool = False
    """Dated by the call a peer was blocked in instead: the wait follows from that block, so it sorts
    after a finding of the same date (load skews ranks on a busy host, so issue times alone can put a
    healthy group's wait before the fault that caused it)."""
    evidence: str = "flight log"
    """What the finding rests on: ``flight log`` (meshscope's own), ``flight recorder`` (torch's dumps),
    ``both`` (each source shows it on its own) or ``rank record`` (how a traced rank ended)."""
    where: str = ""
    """A ``straggler``'s: the phase and module where its extra time went (``forward, layers.1``)."""
    ms_per_step: float | None = None
    """A ``straggler``'s: the others' mean wait per steady step it caused, in ms."""
    steps: list[int] = field(default_factory=list)
    """A ``straggler``'s: the steady steps it held the others on."""

    def line(self) -> str:
        where = f"{self.axis}{self.group}" if self.group else self.axis
        source = "" if self.evidence == "flight log" else f" (evidence: {self.evidence})"
        return f"[{self.kind}] {where + ' ' if where else ''}ranks {self.ranks}: {self.entry} -- {self.cause}{source}"

    def to_json(self, root_cause: bool) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "t"}, "summary": self.line(),
                "root_cause": root_cause}

    @classmethod
    def from_json(cls, d: dict) -> Finding:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass
class RankError:
    """A rank's own account of how it failed (a run's ``errors/``, a trace's ``ranks/``)."""

    rank: int
    error: str
    status: str = "error"
    """``error`` (it failed), ``terminated`` (stopped from outside) or ``missing`` (no record)."""

    def line(self) -> str:
        how = {"terminated": "was stopped", "missing": "left no record"}.get(self.status, "failed")
        return f"rank {self.rank} {how}: {self.error}"

    def to_json(self) -> dict:
        return {"rank": self.rank, "error": self.error, "status": self.status}


@dataclass
class Diagnosis:
    """What the doctor found in one directory: findings earliest first (the first is the likely root
    cause), the ranks' errors, and where each rank last reported progress."""

    run_dir: str
    ranks: list[int]
    findings: list[Finding] = field(default_factory=list)
    errors: list[RankError] = field(default_factory=list)
    last_marks: dict[int, str | None] = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    """What it rests on: ``flight_log`` (bool), ``flight_recorder`` (source, version, backend, ranks)."""
    failure: str | None = None
    """Set when the doctor could not read the directory at all (the job's own failure stands)."""
    performance: list[Finding] = field(default_factory=list)
    """Findings about speed, not health (``straggler``): they leave `healthy` and the root cause alone."""
    time_note: str = ""
    """Why the time of a trace was not analysed, where it was not (a fake world, too few steps)."""

    @property
    def healthy(self) -> bool:
        return not self.findings and not self.errors and self.failure is None

    @property
    def root_cause(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def to_json(self) -> dict:
        if self.failure is not None:
            return {"run_dir": self.run_dir, "healthy": False, "error": self.failure}
        return {"run_dir": self.run_dir, "ranks": self.ranks, "healthy": self.healthy,
                "findings": [f.to_json(i == 0) for i, f in enumerate(self.findings)],
                "errors": [e.to_json() for e in self.errors],
                "last_marks": dict(self.last_marks), "sources": self.sources,
                "performance": [f.to_json(False) for f in self.performance], "time_note": self.time_note}

    @classmethod
    def from_json(cls, d: dict) -> Diagnosis:
        if "error" in d and "findings" not in d:
            return cls(d.get("run_dir", ""), [], failure=d["error"])
        return cls(d["run_dir"], list(d.get("ranks", [])), [Finding.from_json(f) for f in d.get("findings", [])],
                   [RankError(e["rank"], e["error"], e.get("status", "error")) for e in d.get("errors", [])],
                   {int(r): m for r, m in d.get("last_marks", {}).items()}, d.get("sources", {}),
                   performance=[Finding.from_json(f) for f in d.get("performance", [])],
                   time_note=d.get("time_note", ""))
