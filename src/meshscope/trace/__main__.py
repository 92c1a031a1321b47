"""``torchrun [torchrun's flags] -m meshscope.trace SCRIPT [ARGS...]``: the trace inside a launch the
user already has (multi-node included), the same as `meshscope trace` does inside its own.

Each rank writes into the run directory ``$MESHSCOPE_TRACE_DIR`` (default
``traces/<TORCHELASTIC_RUN_ID>``); on several nodes each node has its own unless that path is on a
shared file system. When the job ends, local rank 0 of each node waits for its node's ledgers and
writes ``result.json``; ``meshscope report DIR`` renders the tables, ``report.md`` and the Chrome
trace from it (the renderers sit above this layer).
Environment: ``MESHSCOPE_TRACE_STEPS``, ``MESHSCOPE_TRACE_TIMEOUT`` and ``MESHSCOPE_STEP_OPTIMIZER``
stand for the options of `meshscope trace`; ``MESHSCOPE_TRACE_FLIGHT_RECORDER=0`` for
``--no-flight-recorder``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..core.rundir import RunDir
from ..core.trace_spec import TraceSpec
from . import rank
from .options import RECORDER_ENV, RankOptions


def _run_dir() -> Path:
    return Path(os.environ.get("MESHSCOPE_TRACE_DIR") or Path("traces") / os.environ.get("TORCHELASTIC_RUN_ID", "torchrun"))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: torchrun ... -m meshscope.trace SCRIPT [ARGS...]  (or -m MODULE [ARGS...])", file=sys.stderr)
        return 2
    run_dir = _run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if os.environ.get("LOCAL_RANK", "0") == "0":  # one writer per node
        _clear_earlier_runs(run_dir)
        RunDir(run_dir).write_spec(TraceSpec(world=world, command=tuple(argv), traced=local,
                                             expected=tuple(range(world)) if local == world else None,
                                             nproc_per_node=local).to_json())
    env = os.environ
    options = RankOptions(run_dir=run_dir, target=tuple(argv),
                          steps=int(env["MESHSCOPE_TRACE_STEPS"]) if env.get("MESHSCOPE_TRACE_STEPS") else None,
                          timeout=float(env["MESHSCOPE_TRACE_TIMEOUT"]) if env.get("MESHSCOPE_TRACE_TIMEOUT") else None,
                          step_optimizer=env.get("MESHSCOPE_STEP_OPTIMIZER") or None,
                          recorder=env.get(RECORDER_ENV, "native"),
                          flight_recorder=env.get("MESHSCOPE_TRACE_FLIGHT_RECORDER", "1") != "0")
    code = rank.main(options.to_argv(), on_end=_assemble_on_local_zero(run_dir, local))
    return code


STALE_S = 30.0
"""Files older than this when a node's local rank 0 starts belong to an earlier job: torchrun's
default ``--rdzv-id`` is ``none``, so the default directory ``traces/none`` is reused by every
launch without ``--standalone`` (set MESHSCOPE_TRACE_DIR to keep runs apart)."""


def _clear_earlier_runs(run_dir: Path) -> None:
    import time

    cutoff = time.time() - STALE_S
    for path in [*run_dir.glob("*/rank*.json*"), *run_dir.glob("*.json"), run_dir / "report.md"]:
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
        except OSError:  # another node's rank 0 removed it first
            continue


def _assemble_on_local_zero(run_dir: Path, local: int):
    """After the script: local rank 0 waits for this node's ledgers, then writes the node's result."""
    def on_end() -> None:
        if os.environ.get("LOCAL_RANK", "0") != "0":
            return
        import time

        deadline = time.monotonic() + 60
        directory = RunDir(run_dir)
        while len(directory.ranks_with("ranks")) < local and time.monotonic() < deadline:
            time.sleep(0.1)
        from .assemble import assemble

        result = assemble(directory)
        directory.conclude(result.to_json())
        print(f"meshscope trace: {result.outcome}: {directory.result} (meshscope report {run_dir} for the tables)",
              file=sys.stderr)

    return on_end


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))  # without the interpreter's teardown, as `rank`'s own entry leaves
