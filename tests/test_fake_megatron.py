"""Megatron-core at 1,024 fake ranks: `initialize_model_parallel` with tp 8, pp 4, cp 2, ep 8, etp 1;
every group is labelled with its axis, and the layout reconstructed from the groups rank 0 saw created
is the one `meshscope layout` gives for Megatron's order."""

from __future__ import annotations

import importlib.metadata
import json

from .helpers import ROOT, cli, skip_unless_installed

skip_unless_installed("megatron.core")

SIZES = {"tp": 8, "pp": 4, "cp": 2, "ep": 8, "etp": 1}
FLAGS = [x for a, n in SIZES.items() for x in (f"--{a}", str(n))]
# the job's per-step all_reduces, one per getter, in order (tests/jobs/megatron_groups.py), with the size
# of this layout's group: dp = 1024 / (tp pp cp) = 16, edp = 1024 / (etp ep pp) = 32
CALLS = [("tp", 8), ("pp", 4), ("dp", 16), ("dp-cp", 32), ("cp", 2), ("tp-pp", 32), ("tp-dp", 128),
         ("tp-dp-cp", 256), ("tp-cp", 16), ("ep", 8), ("etp", 1), ("etp-ep", 8), ("etp-ep-pp", 32), ("edp", 32)]
NAMED = {"embedding", "position_embedding", "dp-cp.instance"}
"""Megatron's groups that are not mesh axes: named, never left as `group`."""
NEWER = {"0.19.2": {"etp-ep-egtp-pp"}}
"""Kinds of group a later megatron-core creates beyond 0.16.1's, labelled by `core/axes.py`
(EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP: tests/test_trace_rules.py's list of 0.19.2)."""


def test_megatron_core_at_1024_fake_ranks(tmp_path):
    """Ranks 0 and 1023 (the two ends of every group kind) stand for the 54 classes: rank 0's process sees
    every group created, which is all the layout needs (auto would trace 54 classes, minutes on 2 cores)."""
    proc = cli("trace", "--fake-world", 1024, "--nproc-per-node", 8, "--ranks", "0,1023", "--out", tmp_path / "t",
               "--json", "--", ROOT / "tests" / "jobs" / "megatron_groups.py", *FLAGS, "--steps", "1", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["passed"] and doc["fake_world"]["traced"] == [0, 1023]
    layout = json.loads(cli("layout", "--world", 1024, *FLAGS, "--json").stdout)
    assert layout["order"] == "tp-cp-ep-dp-pp"
    assert doc["layout"]["layout"] == {"world": 1024, "order": layout["order"], "sizes": layout["sizes"]}
    for axis, groups in layout["groups"].items():
        assert doc["axes"][axis] == sorted(groups), axis
    newer = NEWER.get(importlib.metadata.version("megatron-core"), set())
    assert "group" not in doc["axes"] and set(doc["axes"]) - {a for a, _ in CALLS} == NAMED | newer
    for rank in doc["per_rank"]:
        (step,) = rank["steps"]
        mine = [(e["axis"], len(e["group"])) for e in step["events"] if e["op"] == "all_reduce"]
        assert mine == CALLS, rank["rank"]
    record = json.loads((tmp_path / "t" / "ranks" / "rank0.json").read_text())
    assert "group" not in {g["axis"] for g in record["groups"]}
