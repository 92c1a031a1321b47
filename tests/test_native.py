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

from .helpers import ROOT, TORCH, cli

# Every c10d op kind on a 1-rank gloo world, issued under each recorder: the Python kernel, the C++ one, and
# ModeRecorder above FakeTensorMode (--fake-tensors); then again with one decoder removed, and through a
# rank's whole trace (RankTrace -> ranks/rank0.json -> the assembled result).
EVERY_OP = r"""
import json, os, sys, tempfile
import torch, torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException
from meshscope.capture import dispatch, native
from meshscope.capture.job_context import JobContext
from meshscope.core.rundir import RunDir
from meshscope.core.trace_spec import TraceSpec
from meshscope.trace.assemble import assemble
from meshscope.trace.recording import RankTrace

dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
sub = dist.new_group([0])

def calls():
    x = torch.arange(6, dtype=torch.float32)
    yield lambda: dist.all_reduce(x)
    yield lambda: dist.all_reduce_coalesced([x, x.clone()], group=sub)
    yield lambda: dist.all_gather([torch.empty(6)], x)
    yield lambda: dist.all_gather_into_tensor(torch.empty(6), x)
    yield lambda: dist.reduce_scatter_tensor(torch.empty(6), x)
    yield lambda: dist.all_to_all_single(torch.empty(6), x)
    yield lambda: dist.all_to_all_single(torch.empty(5, 2, dtype=torch.bfloat16), torch.ones(5, 2, dtype=torch.bfloat16), [5], [5])
    yield lambda: dist.all_to_all([torch.empty(3)], [torch.ones(3)])
    yield lambda: dist.broadcast(x, 0)
    yield lambda: dist.reduce(x, 0)
    yield lambda: dist.gather(x, [torch.empty(6)], 0)
    yield lambda: dist.scatter(torch.empty(6), [x], 0)
    yield lambda: dist.broadcast(torch.ones(2, dtype=torch.int64), 0, group=sub)
    yield lambda: dist.barrier()
    yield lambda: dist.monitored_barrier()

def issue():
    for call in calls():
        call()

def issue_fake():
    for call in calls():
        try:
            call()
        except UnsupportedOperatorException:  # recorded first; FakeTensorMode has no fake kernel for the
            pass                               # coalesced ops (torch 2.13): not the recorder's concern

def record():
    python, mode = [], []
    dispatch.undecoded.clear()
    with dispatch.Recorder(lambda *call: python.append(call)):
        issue()
    counts = [dict(dispatch.undecoded)]
    dispatch.undecoded.clear()
    recorder = native.NativeRecorder(native.load(), JobContext())
    with recorder:
        issue()
    cpp = [r[:8] for r in recorder.drain()]
    native.uninstall()
    counts.append(dict(dispatch.undecoded))
    dispatch.undecoded.clear()
    with FakeTensorMode(allow_non_fake_inputs=True), dispatch.ModeRecorder(lambda *call: mode.append(call)):
        issue_fake()
    counts.append(dict(dispatch.undecoded))
    show = lambda cs: [[c[0], c[1].name, c[1].ranks, *c[2:]] for c in cs]
    return {"python": show(python), "native": show(cpp), "mode": show(mode), "undecoded": counts}

# torch 2.15's gather_into_tensor_ (absent here): its decoder on stand-ins of both kernels' arguments, the
# root's output holding two members' inputs and a non-root's empty one, against gather_ of the same tensors
pg = dist.group.WORLD.boxed()
stand_in = lambda t: native._Tensor(t.nbytes, t.dtype, t.shape[0] if t.dim() else 1, t.dim())
out, inp = torch.empty(12), torch.ones(6)
into = [dispatch.decode("gather_into_tensor_", [o, inp, pg, 0, True, -1]) for o in (out, torch.empty(0))]
into += [dispatch.decode("gather_into_tensor_", [stand_in(out), stand_in(inp), pg, 0])]
listed = [dispatch.decode("gather_", [[[torch.empty(6), torch.empty(6)]], [inp], pg, 0]),
          dispatch.decode("gather_", [[], [inp], pg, 0])]

# Which calls the C++ recorder saw complete, over two passes (a Work class without a future is remembered
# after its first call, and must not hide the completions of the calls after it)
recorder = native.NativeRecorder(native.load(), JobContext())
with recorder:
    issue()
    issue()
records = recorder.drain()
done = {call_id for call_id, _ in recorder.completions()}
native.uninstall()
completed = [[r[0], r[-1] in done] for r in records]

every = record()
del dispatch.DECODERS["reduce_"]  # a c10d op this meshscope cannot decode, as a newer torch's would be
without = record()

dispatch.undecoded.clear()
run_dir = RunDir(tempfile.mkdtemp())
run_dir.begin(TraceSpec(world=1, command=("job.py",), traced=1, expected=(0,)))
trace = RankTrace(run_dir, 0, JobContext(), recorder="native")
trace.start()
with trace.recording():
    issue()
trace.finish("ok", 0)
result = assemble(run_dir)
print(json.dumps({"every": every, "without": without, "errors": dispatch.errors, "into": [list(c[2:]) for c in into],
                  "listed": [list(c[2:]) for c in listed], "rank_end": run_dir.read_end(0).undecoded,
                  "result": result.undecoded, "events": len(result.events), "notes": result.notes,
                  "present": "gather_into_tensor_" in dispatch.comm_ops(), "completed": completed}))
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


@pytest.fixture(scope="module")
def every_op(built):
    port = str(29500 + os.getpid() % 400)
    proc = subprocess.run([sys.executable, "-c", EVERY_OP, port], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_every_c10d_op_is_recorded_alike_by_the_python_kernel_the_cpp_one_and_the_fake_tensor_mode(every_op):
    doc = every_op[0]["every"]
    assert every_op[0]["errors"] == []
    assert len(doc["python"]) == 15  # 15 calls: the coalesced all-reduce once, not again per tensor
    assert doc["native"] == doc["python"] and doc["mode"] == doc["python"]
    assert doc["undecoded"] == [{}, {}, {}]
    ops = [c[0] for c in doc["native"]]
    assert set(ops) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                        "scatter", "barrier"}
    uneven = next(c for c in doc["native"] if c[3] == "bfloat16")  # [op, group, ranks, dtype, in, out, peer, splits]
    assert uneven[4:] == [20, 20, None, [5], [5]]  # 5 rows of 2 bf16 each way, splits as given


def test_an_op_without_a_decoder_is_counted_alike_by_every_recorder_and_warned_of_once(every_op):
    doc, stderr = every_op
    without = doc["without"]
    assert without["undecoded"] == [{"reduce_": 1}] * 3  # calls() issues one reduce
    reduced = [c for c in doc["every"]["python"] if c[0] != "reduce"]
    assert without["python"] == without["native"] == without["mode"] == reduced
    assert stderr.count("c10d::reduce_ is an op this meshscope cannot decode") == 1  # once per op, per process
    assert doc["rank_end"] == doc["result"] == {"reduce_": 1} and doc["events"] == 14
    assert any("c10d::reduce_ 1" in note for note in doc["notes"])


def test_gather_into_tensor_decodes_as_the_gather_of_the_same_tensors(every_op):
    doc = every_op[0]
    assert doc["present"] == (TORCH >= (2, 15))  # 2.13 lacks the op: its decoder is tested on stand-ins
    root, other, stand_in = doc["into"]
    assert root == stand_in == doc["listed"][0] == ["float32", 24, 48, 0, None, None]
    assert other == doc["listed"][1] == ["float32", 24, 0, 0, None, None]


def test_every_call_whose_work_has_a_future_completes_and_one_without_does_not_hide_the_rest(every_op):
    """gloo's reduce_scatter_tensor work has no future (its getFuture is Work's, which throws); the C++
    recorder remembers that class after one call. Oracle: torch's own ``Work.get_future()`` in this test."""
    import torch
    import torch.distributed as dist

    completed = every_op[0]["completed"]
    assert len(completed) == 30 and completed[:15] == completed[15:]  # both passes alike
    # calls() in order; monitored_barrier, its last, returns no Work at all
    without = [i for i, (_, ok) in enumerate(completed[:15]) if not ok]
    assert [completed[i][0] for i in without] == ["reduce_scatter", "barrier"] and without[1] == 14, str(completed)
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)  # the oracle: torch says the same of its own works
    x = torch.ones(4)
    with pytest.raises(RuntimeError, match="getFuture"):
        group._reduce_scatter_base(torch.empty(4), x).get_future()
    assert group.allreduce([x]).get_future() is not None


MOVES = r"""
import json, sys, tempfile, time
import torch
from torch import nn
from meshscope.capture.flightlog import read_flight
from meshscope.capture.job_context import JobContext
from meshscope.core.rundir import RunDir
from meshscope.trace.recording import RankTrace

class Slow(nn.Linear):
    def forward(self, x):
        time.sleep(0.05)
        return super().forward(x)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), Slow(4, 4)
    def forward(self, x):
        return self.b(self.a(x))

# a recorder before the traced ones, whose moves nobody asks for: none may reach a later trace's log
from meshscope.capture import native
other = JobContext()
other.install()
with native.NativeRecorder(native.load(), other):
    Net()(torch.ones(1, 4))
other.remove()

out = {}
for recorder in ("native", "python"):
    run_dir = RunDir(tempfile.mkdtemp())
    context = JobContext()
    trace = RankTrace(run_dir, 0, context, stream=False, recorder=recorder)  # no flusher: only the flushes below
    context.install()
    trace.start()
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with trace.recording():
        before = time.perf_counter() - trace.t0  # on the flight log's clock: seconds since the trace's start
        for _ in range(2):
            net(torch.ones(2, 4)).sum().backward()
            opt.step()
            trace.flush()  # a flush between the steps: their moves are two "x" lines
        after = time.perf_counter() - trace.t0
    context.remove()
    trace.finish("ok", 0)
    lines = run_dir.flight(0).read_text().splitlines()
    out[recorder] = [trace.recorder, read_flight(run_dir.flight(0), 0).moves, before, after,
                     sum(line.startswith('["x"') for line in lines)]
print(json.dumps(out))
"""


def test_the_cpp_recorder_notes_the_jobs_moves_as_the_python_kernel_does(built):
    """Two steps of a model with a slow second layer, under each recorder (after a C++ recorder whose moves
    nobody drained): the moves (module entries and
    exits, autograd's backward, the optimizer's step) read back from the flight log are the ones this test
    counts by hand from the model's structure, one "x" line per flush, each move between clock readings
    taken around the steps, and the 50 ms layer spans at least 50 ms (the C++ recorder times moves on its
    own clock, the Python kernel with ``time.perf_counter``)."""
    proc = subprocess.run([sys.executable, "-c", MOVES], capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = [("forward", "Net"), ("forward", "a"), ("forward", "Net"), ("forward", "b"), ("forward", "Net"),
            ("other", ""), ("backward", ""), ("other", ""), ("optimizer", ""), ("other", "")]
    for recorder, (used, moves, before, after, x_lines) in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        assert used == recorder
        assert [tuple(m[1:]) for m in moves] == step + step, recorder
        assert x_lines == 2, recorder
        times = [m[0] for m in moves]
        assert before <= times[0] and times == sorted(times) and times[-1] <= after, (recorder, before, times, after)
        into_b = [i for i, m in enumerate(moves) if tuple(m[1:]) == ("forward", "b")]
        assert len(into_b) == 2 and all(0.05 <= moves[i + 1][0] - moves[i][0] < 1.0 for i in into_b), (recorder, moves)


def test_without_a_compiler_the_trace_says_so_and_records_with_the_python_kernel(tmp_path):
    """The build is decided before any rank starts, so one rank shows it: its one all-reduce recorded."""
    job = tmp_path / "one_call.py"
    job.write_text("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                   "dist.all_reduce(torch.ones(4))\n")
    env = {"MESHSCOPE_CACHE": str(tmp_path / "cache"), "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc"}
    proc = cli("trace", "--out", tmp_path / "run", "--json", "--", job, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the C++ recorder cannot be built here" in proc.stderr
    assert json.loads((tmp_path / "run" / "ranks" / "rank0.json").read_text())["recorder"] == "python"
    (step,) = json.loads(proc.stdout)["per_rank"][0]["steps"]
    assert [(e["op"], e["bytes_in"]) for e in step["events"]] == [("all_reduce", 16)]


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
