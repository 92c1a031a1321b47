"""Ranks forked from a warm process (`run.agent` for a real trace, `trace.fake.fork_server` for a fake
world): a traced script sees what a fresh interpreter would (its own random draws per rank, Python's
signal handlers, not the agent's), and a script stopped by ``--steps`` ends though a thread of its own
never would (without the agent's exit through ``os._exit`` the real case hangs until pytest's timeout)."""

from __future__ import annotations

import json

import pytest

from .helpers import ROOT, trace_json


@pytest.mark.parametrize("world", ["real", "fake"])
def test_a_forked_rank_starts_as_a_fresh_interpreter_would(tmp_path, world):
    ranks = ["--nproc-per-node", 2] if world == "real" else ["--fake-world", 2]
    proc, doc = trace_json(tmp_path / "run", *ranks, "--steps", 2, "--timeout", 60,
                           [str(ROOT / "tests" / "jobs" / "process_state.py"), "--steps", 100000])
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    # a real trace shows its ranks' output; a fake world's ranks write theirs to logs/
    output = proc.stderr if world == "real" else "".join(
        p.read_text() for p in sorted((tmp_path / "run" / "logs").glob("rank*.log")))
    states = sorted((json.loads(line.split("state ", 1)[1]) for line in output.splitlines()
                     if line.startswith("state ")), key=lambda s: s["rank"])
    assert [s["rank"] for s in states] == [0, 1], output[-3000:]
    assert all(s["sigint_python"] and s["sighup_default"] for s in states), states
    assert states[0]["random"] != states[1]["random"] and states[0]["numpy"] != states[1]["numpy"], states
