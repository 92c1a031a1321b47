"""The one typed result of a run: written once by the worker, read once by report, suite and doctor.

`RunResult` is the ``run --json`` contract of docs/design.md ("Stable interfaces") as a dataclass:
the layout the run used, the predicted and captured ledgers as `CommEvent` lists, the checks (and
`passed`, decided here only: every check held), per-rank counts derived from the ledgers, the
numerics and the mode's own sections (``experts``, ``timeline``, ``axes``, ``losses``...).
`to_json` writes the contract; `from_json` reads it back, including the documents of
``docs/results/`` that were written before the layout travelled in the result (their ``layout`` is
None).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import CommEvent, Word, counts
from .mesh import Layout


class CheckStatus(Word):
    """Whether a check passed, failed, or had nothing to look at."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_CHECKED = "not_checked"
"""A check held, found a fault, or could not run (too few steps, no calls): never a "yes" it did not earn."""


@dataclass
class Check:
    """One verified invariant: its name, whether it held, and the figure behind it; a check that could
    not run (`not_checked`) says why in `detail` and is neither passed nor failed."""

    name: str
    passed: bool
    detail: str
    checked: bool = True
    """False: the check did not run (what it needs was not there), whatever `passed` says."""

    @classmethod
    def not_checked(cls, name: str, why: str) -> Check:
        return cls(name, False, why, checked=False)

    @property
    def status(self) -> CheckStatus:
        """``passed``, ``failed`` or ``not_checked``."""
        if not self.checked:
            return CheckStatus.NOT_CHECKED
        return CheckStatus.PASSED if self.passed else CheckStatus.FAILED

    @property
    def failed(self) -> bool:
        return self.status == CheckStatus.FAILED

    def to_json(self) -> dict:
        return {"name": self.name, "passed": self.status == CheckStatus.PASSED, "status": self.status,
                "detail": self.detail}

    @classmethod
    def from_json(cls, d: dict) -> Check:
        value = d.get("status") or ("passed" if d["passed"] else "failed")
        if value not in set(CheckStatus):
            raise ValueError(f"check status {value!r} is not one of {', '.join(CheckStatus)}")
        status = CheckStatus(value)
        return cls(d["name"], status == CheckStatus.PASSED, d["detail"], checked=status != CheckStatus.NOT_CHECKED)


_CONTRACT = ("experiment", "backend", "world", "config", "layout", "axis_labels", "passed", "checks", "comm",
             "numerics", "kernels")
"""Keys `to_json` writes itself; every other key of a document is a mode section."""


@dataclass
class RunResult:
    """The verdict of one experiment run on every rank."""

    experiment: str
    """Registered experiment name (``tp_ar_b32``...)."""
    backend: str
    """``gloo`` or ``nccl``."""
    world: int
    """Number of ranks."""
    config: dict
    """The resolved configuration, field by field (the experiment's Config as a dict)."""
    layout: Layout | None
    """The mesh the run used; None in documents written before results carried it."""
    checks: list[Check]
    """Every verified invariant, the ledger comparison first."""
    predicted: list[CommEvent]
    """Every rank's predicted collectives of one step."""
    captured: list[CommEvent]
    """Every rank's captured collectives of the same step."""
    diff: list[str] = field(default_factory=list)
    """The first differences between the two ledgers (`events.diff`); empty when they match."""
    numerics: dict[str, float] = field(default_factory=dict)
    """Worst errors against the unsharded reference, over all ranks."""
    axis_labels: dict[str, str] = field(default_factory=dict)
    """Canonical axis -> the label tables show (``dp=ep`` where two axes share a communicator)."""
    kernels: dict | None = None
    """The NCCL kernel fingerprint section of a profiled run."""
    sections: dict = field(default_factory=dict)
    """Mode-specific sections, written as top-level keys (``experts``, ``timeline``, ``axes``...)."""

    @property
    def passed(self) -> bool:
        """The one place a run's verdict is decided: every check held."""
        return all(c.passed for c in self.checks)

    @property
    def match(self) -> bool:
        """Whether the captured ledger equals the predicted one."""
        return not self.diff

    def per_rank(self) -> list[dict]:
        """Per rank, the op counts of one step, predicted and captured."""
        return [{"rank": r, "predicted": counts(e for e in self.predicted if e.rank == r),
                 "captured": counts(e for e in self.captured if e.rank == r)} for r in range(self.world)]

    def to_json(self) -> dict:
        doc = {
            "experiment": self.experiment, "backend": self.backend, "world": self.world, "config": self.config,
            **({"layout": self.layout.brief()} if self.layout is not None else {}),
            "axis_labels": self.axis_labels, "passed": self.passed,
            "checks": [c.to_json() for c in self.checks],
            "comm": {"match": self.match, "diff": self.diff, "per_rank": self.per_rank(),
                     "events": {"predicted": [e.to_json() for e in self.predicted],
                                "captured": [e.to_json() for e in self.captured]}},
            "numerics": self.numerics,
            **({"kernels": self.kernels} if self.kernels else {}),
        }
        return doc | self.sections

    @classmethod
    def from_json(cls, d: dict) -> RunResult:
        comm = d.get("comm", {})
        events = comm.get("events", {})
        return cls(
            experiment=d["experiment"], backend=d["backend"], world=d["world"], config=d["config"],
            layout=Layout.from_json(d["layout"]) if "layout" in d else None,
            checks=[Check.from_json(c) for c in d["checks"]],
            predicted=[CommEvent.from_json(e) for e in events.get("predicted", [])],
            captured=[CommEvent.from_json(e) for e in events.get("captured", [])],
            diff=list(comm.get("diff", [])), numerics=dict(d.get("numerics", {})),
            axis_labels=dict(d.get("axis_labels", {})), kernels=d.get("kernels"),
            sections={k: v for k, v in d.items() if k not in _CONTRACT})


@dataclass
class SuiteResult:
    """The document of one suite launch: each configuration's `RunResult` by label, and what the suite
    adds around them (timing per configuration, the comparisons, the machine, the summary line)."""

    options: dict
    """The suite's options as launched (`suite.plan.SuiteOptions`)."""
    results: dict[str, RunResult]
    """Configuration label -> its verified run."""
    timing: dict
    """Configuration label -> timing method, host (and GPU) statistics and the raw per-rank steps."""
    comparisons: list[dict] = field(default_factory=list)
    """The parameter-change comparisons: structure next to timing and its verdict."""
    timing_method: str = ""
    """The one timing method of every configuration, or a pointer to each one's."""
    environment: dict = field(default_factory=dict)
    """The machine, versions and backend the suite ran on."""
    summary: dict = field(default_factory=dict)
    """Record counts and the one summary line (`suite.verdicts.summary`)."""

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results.values())

    def to_json(self) -> dict:
        return {"kind": "suite", "options": self.options, "timing_method": self.timing_method,
                "results": {k: r.to_json() for k, r in self.results.items()}, "timing": self.timing,
                "comparisons": self.comparisons, "environment": self.environment, "summary": self.summary}

    @classmethod
    def from_json(cls, d: dict) -> SuiteResult:
        return cls(options=d.get("options", {}), timing=d["timing"], comparisons=d.get("comparisons", []),
                   results={k: RunResult.from_json(r) for k, r in d["results"].items()},
                   timing_method=d.get("timing_method", ""), environment=d.get("environment", {}),
                   summary=d.get("summary", {}))
