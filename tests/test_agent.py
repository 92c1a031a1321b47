"""Ranks forked from a warm process (`run.agent` for a real trace, `trace.fake.fork_server` for a fake
world): a traced script sees what a fresh interpreter would (its own random draws per rank, Python's
signal handlers, not the agent's), and a script stopped by ``--steps`` ends though a thread of its own
never would (without the agent's exit through ``os._exit`` the real case hangs until pytest's timeout)."""

from __future__ import annotations

import json

import pytest

from .helpers import ROOT, run_module, trace_json


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


def test_the_rendezvous_event_names_its_method_as_torchs_own_lookup_did():
    """`run.agent` puts a frame lookup where torch's rendezvous called ``inspect.stack()`` for an event's name
    (torch 2.13 elastic/rendezvous/dynamic_rendezvous.py ``get_method_name``): the same name, for the same
    depths, as torch's own function gives."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from meshscope.run.agent import _method_name

    torchs = dynamic_rendezvous.get_method_name

    def record(lookup, depth=2):  # as a handler's _record calls it
        return lookup(depth) if depth != 2 else lookup()

    def next_rendezvous(lookup, depth=2):
        return record(lookup, depth)

    for depth in (1, 2, 3):
        assert next_rendezvous(_method_name, depth) == next_rendezvous(torchs, depth)
    assert next_rendezvous(_method_name) == "next_rendezvous"
    assert _method_name(10_000) == torchs(10_000) == "no_method_name"


def test_the_zygote_indexes_the_modules_for_its_children_before_it_forks():
    """`trace.rank.prefork`, which `run.zygote` and `run.agent` call after their imports: the rebinding index
    holds every loaded module, so a forked rank's patches scan only what it imported since."""
    import sys

    from meshscope.run.agent import before_forks
    from meshscope.trace import entry_points, rank

    before_forks(rank)
    assert set(sys.modules) <= entry_points._indexed


SIBLINGS = """
import os


def main(argv):
    # the agent's children now: each rank's first line, before it would connect to the agent's store
    agent = os.getppid()
    with open(f"/proc/{agent}/task/{agent}/children") as f:
        seen = len(f.read().split())
    # one write, so that the ranks' lines do not interleave (their output is unbuffered)
    os.write(1, f"siblings {os.environ['LOCAL_RANK']} {seen}\\n".encode())
    return 0
"""


def test_a_forked_rank_starts_once_the_agent_has_forked_every_rank_of_its_node(tmp_path):
    """`run.agent` holds each forked rank until the last is forked: the agent's store thread holds a C library
    lock while it names a new client, and a rank forked then kept it locked (`agent._after_every_fork`).
    Without the hold, rank 0 ran its program while the agent forked the rest (it saw 1 of the 4)."""
    (tmp_path / "siblings.py").write_text(SIBLINGS)
    proc = run_module("meshscope.run.agent", "--standalone", "--nproc-per-node", 4, "-m", "siblings", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = sorted(line.split()[1:] for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("siblings"))
    assert seen == [[str(r), "4"] for r in range(4)], proc.stdout[-3000:] + proc.stderr[-3000:]
