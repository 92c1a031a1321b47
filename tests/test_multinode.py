"""Two torch elastic agents on 127.0.0.1 as two nodes of one 4-rank job, with each rendezvous kind.

Every rank runs ``-m meshscope run tp_ar_b32 --world 4 --json`` through the CLI and exits through
normal interpreter teardown. Before `RankContext.close` joined the gloo threads, 2 of 7 (and 2 of 8)
c10d launches lost a rank at exit to "terminate called without an active exception" (exit -6) after a
passing result. Each launch is bounded (120 s, then its process groups are killed), so a hang fails
the test instead of hanging CI. The two launches run at once (a c10d and a static pair) to keep the wall time down on 2 cores; the
load this adds is also what made the race show.
"""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from .helpers import ROOT

_spec = importlib.util.spec_from_file_location("soak_multinode", ROOT / "benchmarks" / "soak_multinode.py")
soak = sys.modules.setdefault("soak_multinode", importlib.util.module_from_spec(_spec))  # dataclasses need it
_spec.loader.exec_module(soak)

LAUNCHES = [(rdzv, 0) for rdzv in ("c10d", "static")]
"""One launch per rendezvous kind: the race it guards showed in 2 of 7 launches, so repeated launches are
`benchmarks/soak_multinode.py`'s (``--runs``), not CI's."""
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    base = tmp_path_factory.mktemp("multinode")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(soak.launch_pair, key[0], base / f"{key[0]}{key[1]}", TIMEOUT_S)
                   for key in LAUNCHES}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("rdzv,attempt", LAUNCHES, ids=[f"{r}-{a}" for r, a in LAUNCHES])
def test_two_agents_exit_cleanly_and_rank0_passes(outcomes, rdzv, attempt):
    outcome = outcomes[(rdzv, attempt)]
    tails = "\n".join(f"--- agent {a.node} (exit {a.returncode}):\n{a.stderr[-1500:]}" for a in outcome.agents)
    assert soak.problems(outcome) == [], tails
    assert [a.returncode for a in outcome.agents] == [0, 0]
    assert not any("terminate called" in a.stderr for a in outcome.agents)
    result = outcome.result
    assert result["passed"] and result["world"] == 4 and result["experiment"] == "tp_ar_b32"
    # exactly one agent holds rank 0 and prints the one result document
    assert sum(any(line.startswith("{") for line in a.stdout.splitlines()) for a in outcome.agents) == 1
