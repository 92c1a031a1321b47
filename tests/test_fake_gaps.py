"""What nanotron 2411b02 and Colossal-AI 0.5.0 met in a fake world (/work/stacks/REPORT.md sections 2 and 3):
a CUDA generator (`trace.fake.cuda_build`), torch._C's CUDA bindings read at import, NCCL's availability, the
backend ``get_backend`` names (`trace.fake.backend.backend_as_asked`), and a DDP comm hook of the script's
(`trace.fake.backend.hook_ddp`).

Oracles: torch's own answers on this machine (a CPU generator seeded alike draws alike; a real gloo group's
``get_backend``), torch's rules for a group's backend read from distributed_c10d.py (cited per case), and the
gloo trace of the same DDP job under `meshscope diff` with the docstring's hand counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import meshscope

from .helpers import ROOT, fake_equals_real, trace_json

JOBS = ROOT / "tests" / "jobs"

MISSING = r"""
import json, os
os.environ.update(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
import torch, torch.distributed as dist
from meshscope.trace.fake import patches
patches.apply({patches.CUDA_MAP})
answers = {}
g = torch.Generator(device="cuda")  # nanotron data/dataloader.py:134
cpu = torch.Generator()
answers["generator"] = [str(g.device), isinstance(g, torch.Generator), isinstance(torch.default_generator, torch.Generator),
                        torch.equal(torch.randint(0, 99, (8,), generator=g.manual_seed(5), device="cuda"),
                                    torch.randint(0, 99, (8,), generator=cpu.manual_seed(5)))]
raw = torch._C._cuda_getCurrentRawStream  # bitsandbytes 0.50.2 backends/cuda/ops.py:69, at import
try:
    raw(0)
except RuntimeError as exc:
    answers["binding"] = [type(exc).__name__, str(exc).split(",")[0], hasattr(torch._C, "_cuda_getDeviceCount")]
answers["nccl"] = [dist.is_nccl_available(), dist.is_backend_available("nccl"), dist.is_backend_available("cpu:gloo,cuda:nccl")]
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
dist.destroy_process_group()  # torch asks isinstance(backend, ProcessGroupNCCL) once NCCL is available (c10d:2498)
print(json.dumps(answers))
"""


def _run(code: str, *args: str, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(meshscope.__file__).parents[1]), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(__import__("torch").version.cuda is not None, reason="a CUDA build has what a CPU build lacks")
def test_what_a_cpu_build_lacks_is_there_where_cuda_is_mapped():
    """A CUDA generator is the CPU's (its draws equal a CPU generator's of the same seed), its device the CUDA
    one of the local rank as a CUDA build's; a CUDA binding reads, and a call is one line naming it; NCCL is
    available, and torch's own NCCL checks still pass on a fake group."""
    answers = _run(MISSING)
    assert answers["generator"] == ["cuda:1", True, True, True]
    assert answers["binding"] == ["Unmapped", "torch._C._cuda_getCurrentRawStream at <string>:15 needs a CUDA device",
                                  False]
    assert answers["nccl"] == [True, True, True]


BACKENDS = r"""
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from meshscope.trace.fake import patches
patches.apply(patches.modes(fake_tensors=False))
out = {}
for asked in sys.argv[1:]:
    dist.init_process_group(asked or None)
    groups = {"default": None, "new_group()": dist.new_group([0, 1]), "new_group(gloo)": dist.new_group([0, 1], backend="gloo"),
              "split": dist.split_group(split_ranks=[[0, 1]]), "mesh": init_device_mesh("cpu", (2,)).get_group()}
    out[asked] = {name: [dist.get_backend(group), (group or dist.group.WORLD).name(),
                         (group or dist.group.WORLD)._get_backend_name()] for name, group in groups.items()}
    dist.destroy_process_group()
print(json.dumps(out))
"""
ASKED = ["gloo", "nccl", "cpu:gloo,cuda:nccl", ""]


@pytest.fixture(scope="module")
def fake_backends() -> dict:
    """What every group answers in a fake world, per backend asked (`ASKED`, and "cpu:gloo" for the real groups'
    comparison; one process: each starts and ends its world)."""
    return _run(BACKENDS, *ASKED, "cpu:gloo", RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")


@pytest.mark.parametrize("asked", ASKED)
def test_get_backend_and_name_answer_the_backend_the_script_named(fake_backends, asked):
    """Every group answers the backend the script named for it, not "fake", as torch keeps init_process_group's
    name ("undefined" for none, distributed_c10d.py:1843), a new_group's, else the default's (5976), a split its
    parent's (5623), a 1-D mesh of the world the default group (device_mesh.py:530-540) or, for gloo where
    CUDA is available, a new group of the default's backend; its name() (not "custom") is the default backend
    torch makes of that (`_DEFAULT`)."""
    got = fake_backends[asked]
    named = asked or "undefined"
    backends = {"default": named, "new_group()": named, "new_group(gloo)": "gloo", "split": named, "mesh": named}
    assert {group: answers[0] for group, answers in got.items()} == backends
    assert {group: answers[1:] for group, answers in got.items()} == {
        group: [_DEFAULT[backend]] * 2 for group, backend in backends.items()}


_DEFAULT = {"gloo": "gloo", "nccl": "nccl", "cpu:gloo,cuda:nccl": "nccl", "undefined": "nccl"}
"""A group's ``name()`` (and ``_get_backend_name()``, the same getter) by the backend asked for it, by hand from
torch 2.13's distributed_c10d.py:2069-2093: one backend named is its own; "undefined" and a map of several are
NCCL's where the map holds NCCL, which it does for "undefined" on a CUDA machine (BackendConfig maps the
accelerator to its default backend, 419-425), as a fake world mapping CUDA presents one."""

REAL_NAMES = r"""
import json, sys
import torch.distributed as dist
out = {}
for asked in sys.argv[1:]:
    dist.init_process_group(asked, store=dist.HashStore(), rank=0, world_size=1)
    group = dist.new_group([0])
    out[asked] = [dist.group.WORLD.name(), group.name(), group._get_backend_name()]
    dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def real_names() -> dict:
    return _run(REAL_NAMES, "gloo", "cpu:gloo")


@pytest.mark.parametrize("asked", ["gloo", "cpu:gloo"])
def test_a_fake_groups_name_is_a_real_gloo_groups(fake_backends, real_names, asked):
    """Colossal-AI 0.5.0 pipeline/p2p.py:160 compares ``pg.name()`` with ``Backend.NCCL`` and otherwise reads
    ``Backend.HCCL``, which torch lacks: a fake group's name() is "custom" unpatched. Oracle: torch's own groups of
    the same backend on this machine's gloo (a CPU build; "cpu:gloo" is a map of one, 2089-2093)."""
    real, fake = real_names[asked], fake_backends[asked]
    assert real == ["gloo"] * 3
    assert [fake["default"][1], fake["new_group()"][1], fake["new_group()"][2]] == real


@pytest.mark.parametrize("hook, ran, calls", [
    ("fp16", 3, {("all_reduce", "backward", 512): 1}),  # torch's fp16_compress_hook: 256 float16
    ("own", 3, {("all_reduce", "backward", 1024): 1}),  # nanotron's pattern: its own future holds the fp32 bucket
    ("builtin-fp16", 0, {("all_reduce", "backward", 512): 1}),  # torch's C++ FP16CompressCommHook: 256 float16
    ("builtin-allreduce", 0, {("all_reduce", "backward", 1024): 1}),  # C++'s AllReduceCommHook: the fp32 bucket
])
def test_a_ddp_comm_hook_of_the_scripts_replaces_meshscopes(tmp_path, hook, ran, calls):
    """The script's register_comm_hook, or _register_builtin_comm_hook, takes the reducer's one slot from
    meshscope's hook ("can only be called once" before): a Python hook runs once per step on every rank, and the
    trace equals the gloo trace of the same job (C++'s built-in hook there), with the docstring's one all-reduce
    per steady step."""
    doc = fake_equals_real(tmp_path, 2, [str(JOBS / "ddp_comm_hook.py"), "--hook", hook])
    for rank in (0, 1):
        log = (tmp_path / "fake" / "logs" / f"rank{rank}.log").read_text()
        assert f"rank {rank} hook ran {ran}" in log and f"rank {rank} backend nccl" in log, log[-2000:]
        (mine,) = [r for r in doc["per_rank"] if r["rank"] == rank]
        last = max(mine["steps"], key=lambda s: s["step"])  # step 3: past DDP's bucket rebuild
        assert Counter((e["op"], e["phase"], e["bytes_in"]) for e in last["events"]) == calls


def test_a_bf16_compression_hook_is_taken_as_a_cuda_build_takes_it(tmp_path):
    """DDP takes bf16_compress_hook only from a CUDA build with NCCL 2.10+: the fake world stands in for one
    (torch.cuda.nccl.version answered, torch.version.cuda while DDP checks the hook), where it failed as unmapped.
    No gloo run to hold it against (a CPU build refuses the hook): the docstring's hand count, one all-reduce of
    256 bfloat16 (512 B) per steady step, the hook run once per step."""
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 2, [str(JOBS / "ddp_comm_hook.py"), "--hook", "bf16"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    for mine in doc["per_rank"]:
        assert f"rank {mine['rank']} hook ran 3" in (tmp_path / "fake" / "logs" / f"rank{mine['rank']}.log").read_text()
        last = max(mine["steps"], key=lambda s: s["step"])
        assert Counter((e["op"], e["dtype"], e["phase"], e["bytes_in"]) for e in last["events"]) == {
            ("all_reduce", "bfloat16", "backward", 512): 1}
