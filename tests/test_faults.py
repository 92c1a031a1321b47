"""Planted faults in unmodified scripts (tests/jobs/faults/), each traced once: `meshscope trace
--timeout 6` ends on its own within the timeout plus a grace of the moment the first rank got stuck,
leaves no process, fails, and the doctor's first finding names the fault and its axis; gloo's Flight
Recorder dumps in the run directory show the divergence independently of meshscope's flight log.
What is checked is `benchmarks/soak_faults.py`'s, which repeats it."""

from __future__ import annotations

import importlib.util
import json
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .helpers import ROOT, cli_here

_spec = importlib.util.spec_from_file_location("soak_faults", ROOT / "benchmarks" / "soak_faults.py")
soak = sys.modules.setdefault("soak_faults", importlib.util.module_from_spec(_spec))  # dataclasses need it
_spec.loader.exec_module(soak)

TIMEOUT_S = 6.0
NO_RECORDER = "group_size"
"""Traced with --no-flight-recorder: no dumps, the same diagnosis (meshscope's own flight log)."""


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """fault -> its `soak.Run`, three traces at a time (a hung job mostly waits)."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in soak.EXPECTED}  # here: mktemp is not thread-safe

    def run(name):
        flags = ("--no-flight-recorder",) if name == NO_RECORDER else ()
        return name, soak.trace_fault(name, dirs[name] / "run", TIMEOUT_S, flags)

    with ThreadPoolExecutor(3) as pool:
        return dict(pool.map(run, soak.EXPECTED))


@pytest.mark.parametrize("name", list(soak.EXPECTED))
def test_a_planted_fault_ends_on_its_own_and_the_doctor_names_it(faults, name):
    run = faults[name]
    kind, axis, hangs = soak.EXPECTED[name]
    assert run.returncode == 1 and not run.doc["passed"], run.stderr[-2000:]
    assert run.doc["complete"] is not hangs  # a rank stuck until the timeout ended with an error
    assert run.first["root_cause"] and (run.first["kind"], run.first["axis"]) == (kind, axis), run.first["summary"]
    again = json.loads(cli_here("doctor", run.run_dir, "--json").stdout)["findings"][0]  # the directory, afterwards
    assert (again["kind"], again["axis"]) == (kind, axis)
    assert run.orphans == []
    assert (soak.stuck_since(run.run_dir) is not None) == hangs
    assert run.late_by(TIMEOUT_S) is None, f"ended {run.ended - soak.stuck_since(run.run_dir):.1f} s after a rank got stuck"
    fr = run.run_dir / "fr"
    dumps = {p.name for p in fr.glob("rank_*")} if fr.exists() else set()
    if name == NO_RECORDER or not hangs:  # no recorder, or nothing failed: nothing dumped
        assert dumps == set()
    else:  # a rank that timed out dumped its recorder, as pickle and JSON
        assert {"rank_0", "rank_0.json"} <= dumps or {"rank_1", "rank_1.json"} <= dumps, dumps


def _recorded(run_dir: Path, rank: int) -> list[tuple[str, int]]:
    """(op, sequence number) of one rank's Flight Recorder dump, in order."""
    dump = pickle.loads((run_dir / "fr" / f"rank_{rank}").read_bytes())
    assert dump["version"] == "2.10"
    return [(e["profiling_name"], e["collective_seq_id"]) for e in dump["entries"]]


def test_the_recorder_dumps_show_the_skipped_collective(faults):
    """gloo's recorder, read directly: rank 0's last entry is the barrier rank 1 never called; at that
    sequence number rank 1 has its next all-reduce."""
    run_dir = faults["skip_collective"].run_dir
    last0, last1 = _recorded(run_dir, 0)[-1], _recorded(run_dir, 1)[-1]
    assert last0[0] == "gloo:barrier" and last1 == ("gloo:all_reduce", last0[1])


def test_both_sources_name_the_group_by_the_traces_axis(faults):
    """The skipped barrier is on a 1-D DeviceMesh that reuses the default group: the Flight Recorder's
    dumps call that group default_pg, the trace knows it is dp, and the doctor reports the finding once,
    on dp, resting on both sources."""
    from meshscope.doctor import diagnose

    report = diagnose(faults["skip_collective"].run_dir).to_json()
    assert [(f["kind"], f["axis"], f["evidence"]) for f in report["findings"]] == [("mismatch", "dp", "both")]
    # the position of the dp group where rank 0 waits in the barrier and rank 1 in its next all-reduce
    assert "rank 0 barrier" in report["findings"][0]["summary"] and "rank 1 all_reduce" in report["findings"][0]["summary"]
