"""The process torchrun starts for every rank: ``python -m meshscope.cli.worker RUN_DIR``.

It sits at the top of the package because it picks the rank program of the spec's kind, and those
programs live in the layers that own them (`run.worker` for experiments, `suite.rank` for the suite,
`timing.sweep` for the collective sweep); `run.worker.execute` runs whichever it is given.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core.rundir import RunDir
from ..run.worker import Program, execute, run_experiments
from ..suite.rank import suite_program
from ..timing.sweep import sweep_program

PROGRAMS: dict[str, Program] = {"run": run_experiments, "suite": suite_program, "sweep": sweep_program}
"""Spec kind -> rank program; a spec without a kind is a ``run``."""


def program_of(spec: dict) -> Program:
    return PROGRAMS[spec.get("kind", "run")]


def main(argv: list[str]) -> int:
    """Run the spec in the run directory ``argv[0]`` as this rank; its exit code."""
    directory = Path(argv[0])
    spec = RunDir(directory).read_spec()
    code = execute(directory, spec, program_of(spec))
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    # The abort once seen here after a clean run ("terminate called without an active exception")
    # was a gloo worker thread taking the GIL during interpreter finalisation, not a static
    # destructor; `RankContext.close` now joins those threads before returning (its docstring has
    # the evidence), and `meshscope run` inside a user's torchrun exits through normal teardown.
    # This process still leaves through os._exit: the work is done and the result written.
    os._exit(main(sys.argv[1:]))
