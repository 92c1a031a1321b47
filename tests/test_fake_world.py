"""`meshscope trace --fake-world N`: ranks of a large world on torch's fake backend, one process each;
its ledger against a real trace of the same script, and the rank classes against every rank."""

from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

from meshscope.budget.ledger import rank_classes
from meshscope.core.rundir import RunDir
from meshscope.core.rank_end import RankEnd
from meshscope.core.trace_result import TraceResult
from meshscope.trace.fake import fork_server
from meshscope.trace.fake.world import retrace
from meshscope.trace.options import RankOptions

from .helpers import ROOT, TORCH, cli, cli_here, trace_json

JOBS = ROOT / "tests" / "jobs"



def _relabelled(result: TraceResult, rank: int) -> list[tuple]:
    """A rank's ledger with each group replaced by its positions (so only its size is left), a P2P peer
    by its offset from the rank and a root by its position in the group."""
    def peer(e):
        if e.peer is None:
            return None
        return e.peer - rank if e.op in ("send", "recv") else e.group.index(e.peer)

    return [(e.step, e.op, e.axis, e.phase, e.dtype, e.bytes_in, e.bytes_out, e.input_splits, e.output_splits,
             len(e.group), peer(e)) for _, events in sorted(result.steps_of(rank).items()) for e in events]


def _members(classes: list[dict]) -> dict[int, list[int]]:
    """A result's classes as representative -> its ranks."""
    members = {}
    for c in classes:
        ranks = []
        for part in c["ranks"].split(","):
            lo, _, hi = part.partition("-")
            ranks += range(int(lo), int(hi or lo) + 1)
        members[c["representative"]] = ranks
    return members


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
    members = _members(classes)
    # no point-to-point call, no root past a group's first member: its first member or not, on tp and dp
    assert sorted(members.values()) == [[0], [1], [2, 4, 6], [3, 5, 7]] and "in none" in auto["fake_world"]["how"]
    assert sorted(r for rs in members.values() for r in rs) == list(range(8))
    for rep, ranks in members.items():
        for r in ranks:
            assert _relabelled(result, r) == _relabelled(result, rep), (rep, r)
    # a budget's rank classes are these classes (one mechanism, `classes.place`): at this world traced whole,
    # and in auto's trace one traced rank each
    assert rank_classes(result) == {"dp=first, tp=first": [0], "dp=first, tp=other": [1],
                                    "dp=other, tp=first": [2, 4, 6], "dp=other, tp=other": [3, 5, 7]}
    assert rank_classes(TraceResult.from_json(auto)) == {"dp=first, tp=first": [0], "dp=first, tp=other": [1],
                                                         "dp=other, tp=first": [2], "dp=other, tp=other": [7]}
    # The fork server imported what the first ranks' script imported before it forked the others, so a
    # later rank imports none of those modules itself (each rank lists what its script imported). On
    # torch 2.13 rank 0 imports one module the server had not (torch.profiler._cupti_monitor, lazily);
    # torch 2.15's parallel APIs import it already, so there is nothing to learn here
    # (test_the_server_imports_what_ranks_imported_... holds the mechanism on any torch).
    imported = {int(p.stem.removeprefix("rank")): set(json.loads(p.read_text()))
                for p in (tmp_path / "auto" / "imports").glob("rank*.json")}
    later = [r for r in auto["fake_world"]["traced"] if r not in (0, 7)]
    assert later and all(not imported[r] & imported[0] for r in later), imported
    if TORCH < (2, 15):
        assert imported[0], imported



def test_a_pipeline_on_the_default_group_keeps_its_ends_and_inner_stages_apart(tmp_path):
    """tests/jobs/pipelining.py sends on the default group: 5 stages make four classes (its first stage,
    the inner ones at odd and at even positions, its last), each inner stage issuing twice an end's
    sends and receives (the job's docstring); the traced stages have the ledgers of a world traced
    whole (on torch 2.15 stages 1 and 2 differ in their first step: `classes.rank_classes` says why)."""
    job = [str(JOBS / "pipelining.py"), "--steps", "2"]
    _, auto = trace_json(tmp_path / "auto", "--fake-world", 5, job)
    assert auto["passed"], auto["notes"]
    members = _members(auto["fake_world"]["classes"])
    assert members == {0: [0], 1: [1, 3], 2: [2], 4: [4]} and "'default_pg'" in auto["fake_world"]["how"]
    result = TraceResult.from_json(auto)
    assert rank_classes(result) == {"world=first": [0], "world=middle 1": [1], "world=middle 0": [2],
                                    "world=last": [4]}
    sends = {r: sum(e.op == "send" for e in result.steps_of(r)[1]) for r in members}
    assert sends == {0: 4, 1: 8, 2: 8, 4: 4}, sends
    _, whole = trace_json(tmp_path / "whole", "--fake-world", 5, "--ranks", "0,1,2,3,4", job)
    everyone = TraceResult.from_json(whole)
    assert all(_relabelled(everyone, r) == _relabelled(result, rep) for rep, ranks in members.items() for r in ranks)


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

def test_a_rank_lists_the_library_modules_it_imported_before_the_first_of_the_scripts_own(tmp_path, monkeypatch):
    """The server imports what a rank's script imported, without the script: a library imported after a module
    of the script's own may have seen what that module (or the script after it) did (megatron-core's layers.py
    looks for fused_weight_gradient_mlp_cuda, which benchmarks/megatron_fused_kernels.py puts in sys.modules:
    imported by the server first, it had found none and every later rank failed), so the list stops there."""
    library, own = tmp_path / "site", tmp_path / "script"
    library.mkdir(), own.mkdir()
    for folder, name in ((library, "ms_lib_first"), (own, "ms_own"), (library, "ms_lib_after")):
        (folder / f"{name}.py").write_text("X = 1\n")
    from meshscope.trace import script_frames

    for module in (fork_server, script_frames):  # a library's module, and not the script's (`is_library`)
        monkeypatch.setattr(module, "LIBRARY_ROOTS", (str(library) + os.sep,))
    monkeypatch.syspath_prepend(str(library))
    monkeypatch.syspath_prepend(str(own))
    before = set(sys.modules)
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    try:
        for name in ("ms_lib_first", "ms_own", "ms_lib_after"):  # in this order
            importlib.import_module(name)
        fork_server._write_imports(run_dir, 0, before)()
    finally:
        for name in ("ms_lib_first", "ms_own", "ms_lib_after"):
            sys.modules.pop(name, None)
        script_frames.is_library.cache_clear()  # it answered for the patched roots
    assert json.loads(run_dir.imports(0).read_text()) == ["ms_lib_first"]


def test_torchtitans_meshes_read_as_the_dims_the_job_has(tmp_path):
    """HSDP x TP at world 8 on meshes built as torchtitan 0.2.2 builds them (tests/jobs/hsdp_tp.py: a 1-D
    world mesh unflattened into its dataloading, dense and sparse meshes): the layout names tp, fsdp and
    dp_replicate, not "dp 4", and no edp; the dims of size 1 it builds are no axes. (A real gloo world
    of 8 gave the same ledgers, 2026-12-01.)"""
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 8, [str(JOBS / "hsdp_tp.py"), "--steps", "2"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert doc["layout"]["text"] == "tp 2 x fsdp 2 x dp_replicate 2 (order tp-fsdp-dp_replicate)"
    assert sorted(doc["axes"]) == ["batch", "dp_replicate", "efsdp", "fsdp", "loss_mesh", "tp"]


def test_pipelining_that_infers_its_shapes_issues_what_gloo_does(tmp_path):
    """Only stage 0 is given its input_args, so torch's stages vote 'dynamic' and send each other their
    metadata with send_object_list / recv_object_list (torch 2.13 stage.py ``_send_meta``): rank 1
    receives rank 0's real record (it runs beside rank 0 and waits for it); rank 0 receives its
    outputs' gradients' metadata from a stage that runs after it, derived from its own outputs (its
    bytes assumed), and the warm-up vote's integers back from it (schedules.py ``_warmup_p2p``), its own
    taken for them: a P2P receive from a rank that ended after it, so it is traced again after rank 1
    (`world.retrace`) and receives both, nothing assumed. Fake == gloo on every field. With ranks 0
    and 3 of 4, no rank of stage 2 is traced: rank 3 cannot learn its inputs' shapes and fails with a
    note naming what to trace (no second run: nothing it looked for was written since)."""
    job = [str(JOBS / "pipelining.py"), "--schedule", "1f1b", "--steps", "2", "--infer-shapes"]
    proc = cli("trace", "--nproc-per-node", 2, "--out", tmp_path / "real", "--", *job, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 2, job)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert not [e for r in doc["per_rank"] for s in r["steps"] for e in s["events"] if e.get("assumed")]
    assert any(n.startswith("ranks [0] were traced again") for n in doc["notes"]), doc["notes"]
    same = json.loads(cli_here("diff", tmp_path / "real", tmp_path / "fake", "--json").stdout)
    assert same["same"] and same["assumed"]["calls"] == {"a": 0, "b": 0}, same
    proc, doc = trace_json(tmp_path / "alone", "--fake-world", 4, "--ranks", "0,3", job)
    assert proc.returncode == 1 and not doc["passed"]
    assert "again" not in proc.stderr
    assert any("trace one (--ranks)" in n for n in doc["notes"]), doc["notes"]


def test_a_rank_that_failed_on_a_stand_in_is_traced_again_once_what_it_looked_for_exists(tmp_path):
    """`retrace`: a rank whose missing P2P record (its sender's, or a pipeline stage's from any rank) has been
    written since is traced again, failed or passed (rank 0: a second run receives what it stood in for); one
    whose records are still missing, or that looked for none, is not."""
    run_dir = RunDir(tmp_path)
    ends = [RankEnd(0, "ok", unheard=("objects/rank1/1-p2p-1-0-0.pkl",)),
            RankEnd(3, "error", unheard=("objects/rank*/pp-forward-2-0.pkl",)),
            RankEnd(5, "error", unheard=("objects/rank4/1-p2p-4-5-0.pkl",)),
            RankEnd(7, "error", unheard=("objects/rank*/pp-forward-0-0.pkl",)), RankEnd(8, "error")]
    for end in ends:
        run_dir.rank_end(end.rank).parent.mkdir(exist_ok=True)
        run_dir.rank_end(end.rank).write_text(json.dumps(end.to_json()))
    for record in ("rank1/1-p2p-1-0-0.pkl", "rank4/1-p2p-4-5-0.pkl", "rank6/pp-forward-0-0.pkl"):
        (tmp_path / "objects" / record).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "objects" / record).write_bytes(b"")
    assert retrace(run_dir, [0, 3, 5, 7, 8]) == [0, 5, 7]


def test_recv_object_list_from_a_rank_not_traced_gets_its_own_list_not_garbage(tmp_path):
    """A receiver whose sender was not traced gets its own list back, sized from it, with the bytes
    assumed: the sizes it reads are never its buffer's garbage (torch 2.15 receives them into
    torch.empty with batch_isend_irecv: torchtitan 0.3.0's stages asked for 94 TB)."""
    script = tmp_path / "objects.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "if dist.get_rank() == 1:\n    got = [None]\n    dist.recv_object_list(got, src=0)\n"
                      "    print('received', got)\n"
                      "else:\n    dist.send_object_list(['shapes'], dst=1)\n")
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 2, "--ranks", "1", [script])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert "received [None]" in (tmp_path / "fake" / "logs" / "rank1.log").read_text()
    recvs = [e for e in doc["per_rank"][0]["steps"][0]["events"] if e["op"] == "recv"]
    assert [e["assumed"] for e in recvs] == [[], ["bytes_in", "bytes_out"]]


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
