"""The C++ recorder (`capture.native`) against the Python kernel (`capture.dispatch`), the oracle.

The trace tests check the C++ kernel, the trace's default, against independent sources (DDP's
buckets, CommDebugMode, torch's schedule order, the MoE job's splits); here it must record exactly
what the Python kernel records, for every c10d op kind, in one process. And where no C++ compiler
works, the trace says so and falls back to the Python kernel. (Whole jobs traced by either kernel
gave the same ledgers under ``meshscope diff``: MoE all-to-all, DDP, FSDP2, FSDP2 x TP, DTensor SP,
Megatron's groups, a compiled module, 1F1B pipelining; docs/trace.md.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, cli

# Every c10d op kind on a 1-rank gloo world, issued twice: under the Python kernel, then the C++ one.
EVERY_OP = r"""
import json, os, sys
import torch, torch.distributed as dist
from meshscope.capture import dispatch, native
from meshscope.capture.job_context import JobContext

dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
sub = dist.new_group([0])

def calls():
    x = torch.arange(6, dtype=torch.float32)
    dist.all_reduce(x)
    dist.all_reduce_coalesced([x, x.clone()], group=sub)
    dist.all_gather([torch.empty(6)], x)
    dist.all_gather_into_tensor(torch.empty(6), x)
    dist.reduce_scatter_tensor(torch.empty(6), x)
    dist.all_to_all_single(torch.empty(6), x)
    dist.all_to_all_single(torch.empty(5, 2, dtype=torch.bfloat16), torch.ones(5, 2, dtype=torch.bfloat16), [5], [5])
    dist.all_to_all([torch.empty(3)], [torch.ones(3)])
    dist.broadcast(x, 0)
    dist.reduce(x, 0)
    dist.gather(x, [torch.empty(6)], 0)
    dist.scatter(torch.empty(6), [x], 0)
    dist.broadcast(torch.ones(2, dtype=torch.int64), 0, group=sub)
    dist.barrier()
    dist.monitored_barrier()

python = []
with dispatch.Recorder(lambda *call: python.append(call)):
    calls()
context = JobContext()
recorder = native.NativeRecorder(native.load(), context)
with recorder:
    calls()
cpp = [r[:8] for r in recorder.drain()]
native.uninstall()
show = lambda cs: [[c[0], c[1].name, c[1].ranks, *c[2:]] for c in cs]
print(json.dumps({"python": show(python), "native": show(cpp), "errors": dispatch.errors}))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def built():
    """The compiled extension (the trace builds it the same way before its ranks start)."""
    from meshscope.capture import native

    try:
        return native.build()
    except native.NativeUnavailable as exc:
        pytest.fail(f"the C++ recorder does not build on this machine: {exc}")


def test_every_c10d_op_is_recorded_as_the_python_kernel_records_it(built, tmp_path):
    port = str(29500 + os.getpid() % 400)
    proc = subprocess.run([sys.executable, "-c", EVERY_OP, port], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["errors"] == []
    assert len(doc["python"]) == 15  # 15 calls: the coalesced all-reduce once, not again per tensor
    assert doc["native"] == doc["python"]
    ops = [c[0] for c in doc["native"]]
    assert set(ops) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                        "scatter", "barrier"}
    uneven = next(c for c in doc["native"] if c[3] == "bfloat16")  # [op, group, ranks, dtype, in, out, peer, splits]
    assert uneven[4:] == [20, 20, None, [5], [5]]  # 5 rows of 2 bf16 each way, splits as given


def test_without_a_compiler_the_trace_says_so_and_records_with_the_python_kernel(tmp_path):
    env = {"MESHSCOPE_CACHE": str(tmp_path / "cache"), "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc"}
    proc = cli("trace", "--nproc-per-node", 2, "--out", tmp_path / "run", "--", "tests/jobs/dtensor_tp.py",
               timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the C++ recorder cannot be built here" in proc.stderr
    assert json.loads((tmp_path / "run" / "ranks" / "rank0.json").read_text())["recorder"] == "python"


# A stand-in compiler: counts its runs, takes a second, writes its -o file (or fails, with FAIL set).
COMPILER = """#!/bin/sh
echo run >> "$COUNT"
[ -n "$FAIL" ] && { echo "native_recorder.cpp:1:1: error: $FAIL" >&2; exit 1; }
while [ "$1" != "-o" ]; do shift; done
sleep 1
echo built > "$2"
"""
ENSURE = ("from meshscope.capture import native_build as b\n"
          "try: print(b.ensure())\nexcept b.NativeUnavailable as e: print(e)")


def _ensure_at_once(tmp_path, n: int, **env) -> list[str]:
    compiler = tmp_path / "c++"
    compiler.write_text(COMPILER)
    compiler.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MESHSCOPE_CACHE": str(tmp_path / "cache"),
           "CXX": str(compiler), "COUNT": str(tmp_path / "count"), **env}
    procs = [subprocess.Popen([sys.executable, "-c", ENSURE], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(n)]
    return [p.communicate(timeout=60)[0].strip() for p in procs]


def test_builds_started_at_once_compile_once_and_share_the_library(tmp_path):
    """The oracle: the stand-in compiler's own count of its runs, and the cache folder's listing."""
    paths = _ensure_at_once(tmp_path, 2)
    assert paths[0] == paths[1] and paths[0].endswith("meshscope_native_recorder.so")
    assert (tmp_path / "count").read_text().split() == ["run"]
    assert sorted(p.name for p in Path(paths[0]).parent.iterdir()) == ["lock", "meshscope_native_recorder.so"]


def test_a_failed_build_says_why_and_leaves_nothing_to_load(tmp_path):
    said = _ensure_at_once(tmp_path, 1, FAIL="no such header")
    assert said == ["the compiler failed: native_recorder.cpp:1:1: error: no such header"]
    (folder,) = (tmp_path / "cache" / "native").iterdir()
    assert [p.name for p in folder.iterdir()] == ["lock"]
