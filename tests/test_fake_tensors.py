"""`meshscope trace --fake-world N --fake-tensors`: a fake world's ranks whose tensors have no data.

Oracles: the real c10d kernels recorded at BackendSelect (the functional collectives' decoders), the
hand counts of tests/jobs/transformer.py's docstring, DDP's bucket structure (as in
tests/test_fake_world.py), the fake world with real tensors (itself held against gloo there), and
torch's 1F1B order of sends and receives. (By hand, docs/trace.md: fsdp2.py, fsdp_tp.py,
dtensor_tp.py with SP, megatron_groups.py and pipeline_3d.py gave the same ledgers with and without
fake tensors.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

from .helpers import ROOT, cli, trace_json

JOBS = ROOT / "tests" / "jobs"

# Every functional collective DTensor issues, on real tensors (recorded at BackendSelect: the c10d op
# each kernel issues) and again under FakeTensorMode (recorded by ModeRecorder from the functional op).
FUNCTIONAL = r"""
import json, sys
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore
from meshscope.capture import dispatch

dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
sub = dist.new_group([1, 3])

def calls():
    x = torch.ones(8, 3)
    outs = [funcol.all_reduce(x, "sum", dist.group.WORLD),
            *funcol.all_reduce_coalesced([x, x[:2]], "sum", sub),
            funcol.all_gather_tensor(x, 0, dist.group.WORLD),
            *funcol.all_gather_into_tensor_coalesced([x, x[:4]], sub),
            funcol.reduce_scatter_tensor(x, "sum", 0, dist.group.WORLD),
            *funcol.reduce_scatter_tensor_coalesced([x, x[:4]], "sum", [0, 0], sub),
            funcol.all_to_all_single(x, None, None, dist.group.WORLD),
            funcol.all_to_all_single(x[:6], [1, 5], [2, 4], sub),
            funcol.broadcast(x, 1, sub)]
    for out in outs:
        funcol.wait_tensor(out)

real, fake = [], []
with dispatch.Recorder(lambda *call: real.append(call)):
    calls()
with FakeTensorMode(allow_non_fake_inputs=True), dispatch.ModeRecorder(lambda *call: fake.append(call)):
    calls()
show = lambda cs: [[c[0], c[1].name, list(c[1].ranks), *c[2:]] for c in cs]
print(json.dumps({"real": show(real), "fake": show(fake), "errors": dispatch.errors}))
"""


def test_functional_collectives_under_fake_tensors_decode_as_their_c10d_calls(tmp_path):
    proc = subprocess.run([sys.executable, "-c", FUNCTIONAL], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not doc["errors"]
    assert len(doc["real"]) == 9 and doc["fake"] == doc["real"]
    assert doc["fake"][7][-2:] == [[2, 4], [1, 5]]  # uneven splits: rows sent, rows received



def _counts(doc, rank: int, step: int) -> Counter:
    steps = {s["step"]: s["events"] for r in doc["per_rank"] if r["rank"] == rank for s in r["steps"]}
    return Counter((e["axis"], e["op"]) for e in steps[step])


def test_fsdp2_tp_sp_without_data_issues_the_hand_counted_ledger(tmp_path):
    """torch's test Transformer, FSDP2 x TP 2 + SP, world 4: the steady step is the docstring's count,
    and the ledgers of ranks 0 and 3 (first and last of both axes) equal the fake world's with real
    tensors, call for call."""
    job = [str(JOBS / "transformer.py"), "--sequence-parallel", "--dp-mode", "fsdp", "--steps", "3"]
    proc, doc = trace_json(tmp_path / "shapes", "--fake-world", 4, "--fake-tensors", "--ranks", "0,3", job)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    # L = 2: tp 2L+2 + 2L+2 all-gathers, 2L+2 + 2L+1 reduce-scatters, 4L+2 all-reduces; dp 2L+1 and L+1
    assert _counts(doc, 3, 2) == {("tp", "all_gather"): 12, ("tp", "reduce_scatter"): 11, ("tp", "all_reduce"): 10,
                                  ("dp", "all_gather"): 5, ("dp", "reduce_scatter"): 3}
    proc, _ = trace_json(tmp_path / "values", "--fake-world", 4, "--ranks", "0,3", job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same = cli("diff", tmp_path / "values", tmp_path / "shapes", "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["same"], same.stdout[-3000:]


def test_ddp_and_pipelining_without_data(tmp_path):
    """DDP (its C++ checks and bucket rebuild run on real bookkeeping tensors) keeps its bucket structure;
    1F1B over 2 stages keeps torch's order of sends and receives (the warm-up vote is real data)."""
    proc, doc = trace_json(tmp_path / "ddp", "--fake-world", 2, "--fake-tensors", "--ranks", "0,1",
                       [str(JOBS / "ddp.py"), "--steps", "3"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    steps = {s["step"]: [e["op"] for e in s["events"] if e["phase"] != "other"] for s in doc["per_rank"][0]["steps"]}
    assert steps[0] == ["all_reduce"] and steps[1] == ["broadcast"] * 2 + ["all_reduce"] * 4
    assert steps[2] == ["all_reduce"] * 4
    proc, doc = trace_json(tmp_path / "pp", "--fake-world", 2, "--fake-tensors", "--ranks", "0,1",
                       [str(JOBS / "pipelining.py"), "--schedule", "1f1b", "--steps", "2"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    steady = {r["rank"]: [e["op"] for s in r["steps"] if s["step"] == 1 for e in s["events"] if e["op"] in ("send", "recv")]
              for r in doc["per_rank"]}
    micro = 4  # pipelining.py's default microbatches: stage 0 sends each activation and receives its gradient
    assert Counter(steady[0]) == {"send": micro, "recv": micro} and Counter(steady[1]) == {"send": micro, "recv": micro}


def test_a_script_reading_a_value_gets_one_line_naming_its_line(tmp_path):
    """MoE routing counts (bincount of the router's choices) are data: without data the rank fails with
    one line naming the script's line, and no traceback of meshscope's."""
    proc, doc = trace_json(tmp_path / "moe", "--fake-world", 2, "--fake-tensors", "--ranks", "0",
                       [str(JOBS / "moe_a2a.py")])
    assert proc.returncode == 1 and not doc["passed"]
    end = json.loads((tmp_path / "moe" / "ranks" / "rank0.json").read_text())
    assert end["error"].startswith("the script reads a tensor's value at moe_a2a.py:")
    assert "without --fake-tensors" in end["error"] and "\n" not in end["error"]
    assert "moe_a2a.py" in proc.stderr and "meshscope/trace" not in proc.stderr  # the script's traceback only
