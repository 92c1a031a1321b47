"""Real gloo Flight Recorder dumps, made here by a 4-rank job under torch's elastic agent: the limits of
gloo's recorder on this torch, measured, and the doctor (not torchfrtrace) diagnosing them."""

from __future__ import annotations

import pickle
import pickletools
import subprocess
import sys

import pytest

from meshscope.doctor import diagnose

from .helpers import ROOT, TORCH, run_module

JOB = ROOT / "tests" / "jobs" / "flight_recorder_dumps.py"


@pytest.fixture(scope="module")
def skipped(tmp_path_factory):
    """Dumps of the job where rank 1 skips a world all_reduce (the others time out after 3 s and dump)."""
    out = tmp_path_factory.mktemp("fr")
    # torchrun's agent with the ranks forked, as `meshscope run` launches (torch imported once, not four times);
    # the recorder's size is read where the first process group is made, in the ranks
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_FR_BUFFER_SIZE", "200")
        proc = run_module("meshscope.run.agent", "--standalone", "--nproc-per-node", 4, "-m", JOB.stem, "--prefix",
                          out / "rank_", "--fault", "skip", cwd=JOB.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _dump(out, r) -> dict:
    return pickle.loads((out / f"rank_{r}").read_bytes())


def test_gloo_recorder_limits(skipped):
    for r in range(4):
        data = (skipped / f"rank_{r}").read_bytes()
        assert not {op.name for op, _, _ in pickletools.genops(data)} & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST",
                                                                        "OBJ", "NEWOBJ", "BUILD"}
        doc = pickle.loads(data)
        names = [e["profiling_name"] for e in doc["entries"]]
        assert doc["version"] == "2.10" and all(n.startswith("gloo:") for n in names)
        assert not [n for n in names if "send" in n or "recv" in n]  # rank 0 sent and rank 1 received
        assert {e["state"] for e in doc["entries"]} == {"scheduled"}
        # torch 2.13 lists no ranks; torch 2.15 lists [0, 1] for this world of 4: neither is the group
        assert doc["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]" if TORCH < (2, 15) else "[0, 1]"}}
        [a2a] = [e for e in doc["entries"] if e["profiling_name"] == "gloo:all_to_all"]
        assert a2a["input_sizes"] == [[8]] and a2a["output_sizes"] == [[8]]  # the totals, not the splits
    world = {r: [e["collective_seq_id"] for e in _dump(skipped, r)["entries"] if e["process_group"][1] == "default_pg"]
             for r in range(4)}
    assert world == {0: [1, 2, 3, 4], 1: [1, 2, 3], 2: [1, 2, 3, 4], 3: [1, 2, 3, 4]}


def test_doctor_names_the_rank_that_skipped(skipped):
    f = diagnose(skipped / "rank_").to_json()["findings"][0]
    assert (f["kind"], f["axis"], f["ranks"], f["evidence"]) == ("missing", "world", [1], "flight recorder")


def test_torchfrtrace_cannot_read_gloo_dumps(skipped):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(skipped),
                           "--prefix", "rank_"], capture_output=True, text=True, timeout=120, check=False)
    assert "KeyError: ('0', " in proc.stderr, proc.stderr[-2000:]
