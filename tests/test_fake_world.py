"""`meshscope trace --fake-world N`: ranks of a large world on torch's fake backend, one process each;
its ledger against a real trace of the same script, and the rank classes against every rank."""

from __future__ import annotations

import json
import os
import sys

import pytest

from meshscope.core.rundir import RunDir
from meshscope.core.trace_result import TraceResult
from meshscope.trace.fake import backend, fork_server
from meshscope.trace.options import RankOptions

from .helpers import ROOT, cli, cli_here, trace_json

JOBS = ROOT / "tests" / "jobs"



def test_a_fake_world_issues_what_the_real_one_does(tmp_path):
    """FSDP2 x TP at world 4: every rank on the fake backend issues exactly what a real gloo job does."""
    job = [str(JOBS / "fsdp_tp.py"), "--steps", "2"]
    real, _ = trace_json(tmp_path / "real", "--nproc-per-node", 4, job)
    fake, doc = trace_json(tmp_path / "fake", "--fake-world", 4, "--ranks", "0,1,2,3", job)
    assert real.returncode == 0 and fake.returncode == 0, fake.stderr[-3000:]
    assert doc["fake_world"]["traced"] == [0, 1, 2, 3] and doc["passed"]
    proc = cli_here("diff", tmp_path / "real", tmp_path / "fake", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["same"], proc.stdout[-3000:]


def test_ddp_on_the_fake_backend_issues_what_gloo_does(tmp_path):
    """DDP's built-in hook asserts on the fake work's empty future; meshscope's hook issues the same bucket
    all-reduces, and the first step's single bucket and the second step's rebuild broadcasts stay as on gloo."""
    job = [str(JOBS / "ddp.py"), "--steps", "3"]
    real, _ = trace_json(tmp_path / "real", "--nproc-per-node", 2, job)
    fake, doc = trace_json(tmp_path / "fake", "--fake-world", 2, "--ranks", "0,1", job)
    assert real.returncode == 0 and fake.returncode == 0 and doc["passed"], fake.stderr[-3000:]
    steps = {s["step"]: [e["op"] for e in s["events"] if e["phase"] != "other"] for s in doc["per_rank"][0]["steps"]}
    assert steps[0] == ["all_reduce"] and steps[1] == ["broadcast"] * 2 + ["all_reduce"] * 4
    assert steps[2] == ["all_reduce"] * 4
    proc = cli_here("diff", tmp_path / "real", tmp_path / "fake", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["same"], proc.stdout[-3000:]


def _relabelled(result: TraceResult, rank: int) -> list[tuple]:
    """A rank's ledger with each group replaced by its positions (so only its size is left), a P2P peer
    by its offset from the rank and a root by its position in the group."""
    def peer(e):
        if e.peer is None:
            return None
        return e.peer - rank if e.op in ("send", "recv") else e.group.index(e.peer)

    return [(e.step, e.op, e.axis, e.phase, e.dtype, e.bytes_in, e.bytes_out, e.input_splits, e.output_splits,
             len(e.group), peer(e)) for _, events in sorted(result.steps_of(rank).items()) for e in events]


def test_rank_classes_hold_on_a_world_traced_whole(tmp_path):
    """World 8 = tp 2 x dp 4: auto traces one rank per class; tracing every rank shows that the members
    of each class issue the same ledger up to relabelling, and that the classes are not all one."""
    job = [str(JOBS / "fsdp_tp.py"), "--steps", "2"]
    _, auto = trace_json(tmp_path / "auto", "--fake-world", 8, job)
    _, whole = trace_json(tmp_path / "whole", "--fake-world", 8, "--ranks", ",".join(map(str, range(8))), job)
    classes = auto["fake_world"]["classes"]
    assert auto["passed"] and whole["passed"] and auto["fake_world"]["traced"] == [c["representative"] for c in classes]
    assert auto["layout"]["sizes"] == {"tp": 2, "dp": 4}
    result = TraceResult.from_json(whole)
    members = {}
    for c in classes:
        ranks = []
        for part in c["ranks"].split(","):
            lo, _, hi = part.partition("-")
            ranks += range(int(lo), int(hi or lo) + 1)
        members[c["representative"]] = ranks
    assert sorted(r for rs in members.values() for r in rs) == list(range(8))
    for rep, ranks in members.items():
        for r in ranks:
            assert _relabelled(result, r) == _relabelled(result, rep), (rep, r)
    # The fork server imported what the first ranks' script imported before it forked the others, so a
    # later rank imports none of those modules itself (each rank lists what its script imported).
    imported = {int(p.stem.removeprefix("rank")): set(json.loads(p.read_text()))
                for p in (tmp_path / "auto" / "imports").glob("rank*.json")}
    later = [r for r in auto["fake_world"]["traced"] if r not in (0, 7)]
    assert imported[0] and later and all(not imported[r] & imported[0] for r in later), imported



def test_the_server_imports_what_ranks_imported_up_to_one_that_starts_a_thread(tmp_path, monkeypatch):
    """torchtitan 0.2.2 imports pandas, whose pyarrow starts a native thread, after 958 of its 1,668
    modules: the server imports the ones before it (the probe child, in order, stops there), the ranks
    the rest; before, one such module made every rank import all of them itself. What a module binds
    of sys.argv at import is the job's (torchtitan's parse_args default), not the server's."""
    for name, body in [("ms_quiet", "import sys\nARGV = list(sys.argv)"), ("ms_threaded", "import threading, time\n"
                       "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()"), ("ms_after", "Y = 2")]:
        (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = RunDir(tmp_path / "run")
    run_dir.imports(0).parent.mkdir(parents=True)
    run_dir.imports(0).write_text(json.dumps(["ms_quiet", "ms_threaded", "ms_after"]))
    server = object.__new__(fork_server._Server)
    server.run_dir, server.learning, server.learned, server.replies_fd = run_dir, True, set(), os.dup(1)
    server.options = RankOptions(run_dir=run_dir.path, target=("-m", "trainer", "--steps", "3"))
    try:
        server._learn([0])
        assert "ms_quiet" in sys.modules and "ms_threaded" not in sys.modules and "ms_after" not in sys.modules
        assert not server.learning and sys.modules["ms_quiet"].ARGV == ["trainer", "--steps", "3"]
    finally:
        os.close(server.replies_fd)
        sys.modules.pop("ms_quiet", None)

def test_torchtitans_meshes_read_as_the_dims_the_job_has(tmp_path):
    """HSDP x TP at world 8 on meshes built as torchtitan 0.2.2 builds them (tests/jobs/hsdp_tp.py: a 1-D
    world mesh unflattened into its dataloading, dense and sparse meshes): the layout names tp, fsdp and
    dp_replicate, not "dp 4", and no edp; the dims of size 1 it builds are no axes. (A real gloo world
    of 8 gave the same ledgers, 2026-12-01.)"""
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 8, [str(JOBS / "hsdp_tp.py"), "--steps", "2"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["layout"]["text"] == "tp 2 x fsdp 2 x dp_replicate 2 (order tp-fsdp-dp_replicate)"
    assert sorted(doc["axes"]) == ["batch", "dp_replicate", "efsdp", "fsdp", "loss_mesh", "tp"]


def test_pipelining_with_static_shapes_issues_what_gloo_does(tmp_path):
    """The warm-up vote travels as real data (a fake recv returns ones, as every real stage sends), so
    a pipeline with static shapes runs; one relying on shape inference over P2P gets a note."""
    job = [str(JOBS / "pipelining.py"), "--schedule", "1f1b", "--steps", "2"]
    proc = cli("trace", "--nproc-per-node", 2, "--out", tmp_path / "real", "--", *job, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 2, "--ranks", "0,1", job)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    same = cli_here("diff", tmp_path / "real", tmp_path / "fake", "--json")
    assert json.loads(same.stdout)["same"], same.stdout[-3000:]
    proc, doc = trace_json(tmp_path / "inferred", "--fake-world", 4, "--ranks", "0", [*job, "--infer-shapes"])
    assert proc.returncode == 1 and not doc["passed"]
    assert any("recv_object_list" in n and "input_args" in n for n in doc["notes"])



def test_recv_object_list_fails_in_one_line_before_it_allocates(tmp_path):
    """A fake world's peer sends no objects: recv_object_list fails at once (at torch 2.15 the sizes it read
    were uninitialised memory, terabytes asked for)."""
    script = tmp_path / "objects.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "if dist.get_rank() == 1:\n    dist.recv_object_list([None], src=0)\n"
                      "else:\n    dist.send_object_list(['shapes'], dst=1)\n")
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 2, "--ranks", "1", [script])
    assert proc.returncode == 1 and doc["ranks"][0]["error"] == f"RuntimeError: {backend.OBJECTS_NOT_RECEIVED}", doc


@pytest.mark.parametrize("args, needle", [
    (("--fake-world", 0), "--fake-world 0 must be a positive number of ranks"),
    (("--fake-world", 8, "--ranks", "3,9"), "--ranks '3,9': ranks must lie in [0, 7] (world 8)"),
    (("--fake-world", 8, "--ranks", "a"), "must be 'auto' or a comma list"),
    (("--fake-world", 8, "--nnodes", 2), "--fake-world runs every rank on this machine"),
    (("--fake-tensors",), "--fake-tensors needs --fake-world N"),
    (("--fake-world", 10, "--nproc-per-node", 4), "--nproc-per-node 4 does not divide --fake-world 10"),
])
def test_fake_world_bad_input(args, needle, tmp_path):
    proc = cli_here("trace", *args, "--out", tmp_path / "x", "--", str(JOBS / "ddp.py"))
    assert proc.returncode == 2 and needle in proc.stderr and not (tmp_path / "x").exists(), proc.stderr
