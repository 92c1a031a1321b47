"""The PP timeline files of a run directory, for `meshscope run`, `suite` and `report` alike.

Each result with a ``timeline`` section has its Chrome trace and Gantt PNG in one place under one
name, ``figures/LABEL.timeline.{json,png}`` (`models.pipeline.timeline.paths`), the label being the
suite configuration's or, for `meshscope run`, the experiment's plus the options given
(`Experiment.label`). The ranks only measure; the files are drawn here, once after the run, and
again by ``meshscope report DIR`` from result.json alone.
"""

from __future__ import annotations

from pathlib import Path

from ..core.result import RunResult
from ..models.pipeline.timeline import paths, write_files


def label_of(result: RunResult) -> str:
    """The run's label; documents written before results carried one are named after the experiment."""
    return result.sections.get("label") or result.experiment


def write_timelines(run_dir: Path, results: dict[str, RunResult]) -> list[str]:
    """Draw the timeline of every result (label -> result) that has one; return the paths written.

    The names come from the label, not from the section's ``files``: documents of earlier versions
    list absolute paths on the machine they ran on."""
    written = []
    for label, result in results.items():
        if result.sections.get("timeline"):
            written += write_files(run_dir, label, result.sections["timeline"])
    return written


def write_run(result: RunResult, run_dir: Path) -> list[str]:
    """The timeline files of one `meshscope run` result."""
    return write_timelines(run_dir, {label_of(result): result})


def files_of(result: RunResult) -> list[str]:
    """Where `write_run` puts the result's timeline, relative to the run directory (none without one)."""
    return paths(label_of(result)) if result.sections.get("timeline") else []
