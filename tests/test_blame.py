"""Whose failure a rank's own failure was (`doctor.blame`): the script's (``script-error``), meshscope's own
(``meshscope-error``: its frame kept, `trace.script_frames.failed_in`) or the fake world's
(``fake-world-gap``: CUDA-only work that a CPU build of torch refuses, `core.rank_end.CUDA_ONLY`, or a failure
after a receive of integers the fake world made up, `core.rank_end.RankEnd.made_up`).

Oracles: the messages this torch itself raises for CUDA-only work (raised here, on a CPU build); the
lines of meshscope's source and of the jobs that carry the marked call, found by their text; the job
``tests/jobs/faults/cuda_binding.py``'s docstring (its binding is absent from a CPU build, after 1
all_reduce) and ``tests/jobs/received_sizes.py``'s (the sizes rank 0 receives); and records written by
hand. Three cases launch jobs: fake worlds of 2 (those jobs), and a gloo world of 2 whose ranks load a
``sitecustomize`` that breaks meshscope's group log the way nanotron's numpy ranks did (its ``json.dumps``
raised inside meshscope, before f17a67e)."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from meshscope.core.findings import Finding
from meshscope.core.rank_end import CUDA_ONLY, RankEnd
from meshscope.core.rundir import RunDir
from meshscope.core.trace_spec import TraceSpec
from meshscope.doctor.ends import blocked, order, script_errors
from meshscope.trace import created, recording, script_frames

from .helpers import ROOT, trace_json

JOBS = ROOT / "tests" / "jobs"


def _line(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _raised(call) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - whatever it raised is the case
        return exc
    raise AssertionError("it did not raise")


# -- which frame failed -------------------------------------------------------------------------------

def test_a_call_meshscope_passed_on_is_not_its_failure_and_its_own_is():
    """`recording.flushed_first` wraps destroy_process_group: flush, then call what it was handed. A failure
    of the handed function passed through meshscope's frame; one of its own flush is meshscope's, at the
    line that calls it."""
    def destroy(*args, **kwargs):
        raise ValueError("the script's own")

    passed = _raised(lambda: recording.flushed_first(SimpleNamespace(flush=lambda: None), destroy)())
    assert script_frames.failed_in(passed) == ""
    own = _raised(lambda: recording.flushed_first(SimpleNamespace(flush=None), destroy)())
    source = ROOT / "src" / "meshscope" / "trace" / "recording.py"
    assert script_frames.failed_in(own) == f"{source}:{_line(source, 'trace.flush()')}"
    assert "recording.py" in script_frames.script_traceback(own)  # kept for the bug report
    assert "recording.py" not in script_frames.script_traceback(passed)  # the script's traceback, as before


def test_meshscope_raising_on_purpose_is_no_failure_of_its_own():
    """A refusal (``raise ...``: the fake world's Unmapped, a record's bad status) is meshscope saying what
    it cannot do, not meshscope breaking."""
    refused = _raised(lambda: RankEnd.from_json({"rank": 0, "status": "lost"}))
    assert isinstance(refused, ValueError) and script_frames.failed_in(refused) == ""
    broke = _raised(lambda: RankEnd.from_json({"rank": 0}))  # its own subscript of a field it needs
    assert isinstance(broke, KeyError) and "rank_end.py:" in script_frames.failed_in(broke)


# -- which errors are CUDA-only work ------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="reads what a torch without CUDA says")
@pytest.mark.parametrize("call", [
    lambda: torch.zeros(1, device="cuda"),  # torch/cuda/__init__.py _lazy_init
    lambda: torch.Generator(device="cuda"),  # ATen's CUDA hooks: "without ATen_cuda library"
    lambda: torch._C._cuda_getCompiledVersion(),  # a binding a CPU build lacks
    lambda: torch.cuda.CUDAGraph(),  # torch._utils._dummy_type
    lambda: torch.cuda.get_device_properties(0),
], ids=["device", "generator", "binding", "graph", "properties"])
def test_what_this_torch_says_of_cuda_only_work_is_cuda_only(call):
    exc = _raised(call)
    end = RankEnd(0, "error", error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    assert end.cuda_only, end.error


def test_a_gpu_only_kernel_of_a_library_is_cuda_only():
    """fbgemm-gpu-cpu 1.8.0's CUDA table-batched embedding refuses, at its first lookup, the CPU tensors that stand
    for its GPU's (fbgemm_gpu_tbe_training_backward_pt2.so; one table on ``ComputeDevice.CUDA`` with device cpu,
    exact SGD or Adam alike): the message as its library holds it. A fake world builds such a TBE as the CPU's
    (`trace.fake.fbgemm`: TorchRec's row-wise tables on their CUDA path, which said this, now trace) and refuses
    what the CPU's has no kernel for in one line (an optimizer such as Adam: ``Unmapped: ...``, CUDA-only too,
    test_torchrec.py::test_an_optimizer_without_a_cpu_kernel_is_one_line); a CUDA TBE that row does not build
    says this."""
    error = "RuntimeError: weights[0] must be a GPU or MTIA tensor; it is currently on device CPU"
    assert RankEnd(0, "error", error=error).cuda_only


def test_a_scripts_own_error_is_not_cuda_only():
    exc = _raised(lambda: torch.ones(2) @ torch.ones(3))
    assert not CUDA_ONLY.search(f"{type(exc).__name__}: {exc}")
    assert not RankEnd(0, "error", error="AttributeError: module 'torch' has no attribute 'cudax'").cuda_only


# -- the finding's kind ---------------------------------------------------------------------------------

def _trace_dir(tmp_path, fake: bool) -> RunDir:
    run_dir = RunDir(tmp_path / ("fake" if fake else "real"))
    run_dir.begin(TraceSpec(world=2, command=("job.py",), traced=2, expected=(0, 1), fake_world=fake))
    return run_dir


GAP = "AttributeError: module 'torch._C' has no attribute '_cuda_getCompiledVersion'"


def test_each_kind_says_whose_failure_it_was(tmp_path):
    """By hand: the same CUDA-only error is the fake world's gap in a fake world and the script's in a real
    job (torch itself refuses there); meshscope's frame makes it meshscope's in either; a genuine error
    stays the script's."""
    gap = RankEnd(0, "error", error=GAP, exception="AttributeError", where="job.py:25", exit_code=1, time=1.0)
    ours = RankEnd(1, "error", error="TypeError: Object of type int64 is not JSON serializable", exception="TypeError",
                   where="job.py:9", origin="json/encoder.py:180", meshscope_frame="/x/meshscope/trace/created.py:37",
                   exit_code=1, time=2.0)
    genuine = RankEnd(1, "error", error="ValueError: bad batch 7", exception="ValueError", where="job.py:12",
                      exit_code=1, time=3.0)
    fake, real = _trace_dir(tmp_path, True), _trace_dir(tmp_path, False)
    [f_gap, f_ours] = script_errors([gap, ours], fake)
    assert (f_gap.kind, f_gap.ranks, f_gap.entry) == ("fake-world-gap", [0], f"{GAP} at job.py:25")
    assert "no mapping" in f_gap.cause and "docs/trace.md" in f_gap.cause and "the script itself" not in f_gap.cause
    assert f_ours.kind == "meshscope-error" and "created.py:37" in f_ours.cause and "bug" in f_ours.cause
    assert f_ours.entry == "TypeError: Object of type int64 is not JSON serializable at job.py:9 (raised in " \
                           "json/encoder.py:180)"
    assert [f.kind for f in script_errors([gap, ours, genuine], real)] == \
        ["script-error", "meshscope-error", "script-error"]
    # each is a rank's own failure: the likely root cause when no rank was blocked
    hang = Finding("missing", "dp", [0, 1], [0], "collective #3 of dp[0, 1]: all_reduce", "rank 0 never issued it",
                   t=0.5)
    assert [f.kind for f in order([hang, f_ours], blocked([ours], {}))] == ["meshscope-error", "missing"]
    assert [f.kind for f in order([hang, f_gap], blocked([gap], {}))] == ["fake-world-gap", "missing"]


def test_a_failure_after_a_receive_the_fake_world_made_up_is_its_gap_naming_the_receive(tmp_path):
    """By hand: a fake world's rank that failed after a receive of integers it held zeros in (Colossal-AI 0.5.0's
    rank 0 unpickled a P2P message sized by one: ``EOFError``) is the fake world's gap, its cause naming that
    receive and the fix (trace the sender first); the same record in a real job, which makes nothing up, is
    the script's, and so is a fake world's rank that made nothing up; a CUDA-only error keeps its own words."""
    made_up = "recv on pp [0-1] at step 0 (rank 1 not traced before it): it held zeros"
    eof = RankEnd(0, "error", error="EOFError: Ran out of input", exception="EOFError", where="job.py:30",
                  exit_code=1, time=1.0, made_up=made_up)
    fake, real = _trace_dir(tmp_path, True), _trace_dir(tmp_path, False)
    [finding] = script_errors([eof], fake)
    assert finding.kind == "fake-world-gap" and finding.entry == "EOFError: Ran out of input at job.py:30"
    assert made_up in finding.cause and "--ranks" in finding.cause and "the script itself" not in finding.cause
    assert [f.kind for f in script_errors([eof], real)] == ["script-error"]
    assert [f.kind for f in script_errors([replace(eof, made_up="")], fake)] == ["script-error"]
    [gap] = script_errors([replace(eof, error=GAP, exception="AttributeError")], fake)
    assert gap.kind == "fake-world-gap" and "no mapping" in gap.cause and made_up not in gap.cause
    assert RankEnd.from_json(json.loads(json.dumps(eof.to_json()))) == eof


def test_a_record_keeps_meshscopes_frame(tmp_path):
    end = RankEnd(0, "error", error="TypeError: x", meshscope_frame="/x/meshscope/trace/created.py:37")
    assert RankEnd.from_json(json.loads(json.dumps(end.to_json()))) == end


# -- traced jobs ----------------------------------------------------------------------------------------

def test_a_fake_worlds_unmapped_cuda_binding_is_its_gap_not_the_scripts(tmp_path):
    """cuda_binding.py (its docstring): each rank all-reduces once, then raises AttributeError at the line
    marked "the binding", which a CUDA build has."""
    job = JOBS / "faults" / "cuda_binding.py"
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 2, "--ranks", "0,1", [str(job)])
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr[-3000:]
    root = doc["doctor"]["findings"][0]
    assert root["root_cause"] and root["kind"] == "fake-world-gap" and root["ranks"] == [0, 1]
    # torch's own AttributeError, or the fake world's one line for it (`Unmapped: torch._C._cuda_...`)
    assert "_cuda_getCompiledVersion" in root["entry"], root
    assert f" at {job}:{_line(job, '# the binding')}" in root["entry"]
    assert "meshscope/" not in root["entry"]  # a frame of meshscope's refusing or passing on is no origin
    assert "docs/trace.md" in root["cause"] and "the script itself" not in root["cause"]
    assert sum(e["op"] == "all_reduce" for r in doc["per_rank"] for s in r["steps"] for e in s["events"]) == 2


def test_a_rank_that_failed_on_a_size_it_could_not_know_is_the_fake_worlds_gap(tmp_path):
    """received_sizes.py (its docstring) with ``--check 0``, rank 0 alone in a fake world of 2: its first received
    value that is not gloo's is the all-gather of sizes, whose rank 1 part (5) it cannot know, rank 1 not being
    traced: it exits there, holding its own (2). The doctor names that receive, not the script."""
    job = JOBS / "received_sizes.py"
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 2, "--ranks", "0", [str(job), "--check", "0"])
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr[-3000:]
    root = doc["doctor"]["findings"][0]
    assert root["root_cause"] and root["kind"] == "fake-world-gap" and root["ranks"] == [0], root
    assert root["entry"].startswith("the script exited: rank 0: all_gather received [2, 2], not [2, 5] at ")
    assert ("all_gather on default_pg [0-1] at step 0 (rank 1 not traced before it): it held the rank's own"
            in root["cause"]), root["cause"]


def test_meshscope_failing_in_its_own_code_is_its_error_with_its_frame(tmp_path, monkeypatch):
    """The ranks load a sitecustomize that makes meshscope's group log call ``int`` where it calls
    ``json.dumps`` (created.py's one call of it): the script's init_process_group line fails inside meshscope,
    which notes the default group there. Ranks start fresh (no zygote: it imported meshscope before any
    sitecustomize could)."""
    from meshscope.run import zygote

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import types
        from meshscope.trace import created
        created.json = types.SimpleNamespace(dumps=int)   # as json.dumps raised on numpy's ranks
    """))
    job = tmp_path / "init.py"
    job.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")   # the call
        dist.all_reduce(torch.ones(2))
        dist.destroy_process_group()
    """))
    monkeypatch.delenv(zygote.ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", f"{site}:{ROOT / 'src'}")
    proc, doc = trace_json(tmp_path / "run", "--nproc-per-node", 2, "--timeout", 30, [str(job)])
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr[-3000:]
    root = doc["doctor"]["findings"][0]
    source = ROOT / "src" / "meshscope" / "trace" / "created.py"
    frame = f"{source}:{_line(source, 'json.dumps(')}"
    assert root["kind"] == "meshscope-error" and root["ranks"] == [0, 1], root
    assert root["entry"].startswith("TypeError: ") and \
        root["entry"].endswith(f"init.py:{_line(job, '# the call')} (raised in {frame})"), root
    assert frame in root["cause"] and "bug" in root["cause"]
    log = (tmp_path / "run" / "logs" / "rank0.log").read_text()
    assert f'File "{source}", line {_line(source, "json.dumps(")}' in log  # the traceback keeps meshscope's frame
    assert created.json.dumps is json.dumps  # this process's meshscope was left alone


def test_a_scripts_bad_call_through_meshscopes_recorder_stays_the_scripts(tmp_path):
    """gather_size.py (its docstring): gloo refuses the output size on every rank. With the Python recorder
    the call passes through meshscope's dispatcher kernel, which hands it on (`capture.dispatch`): that
    frame is no failure of meshscope's, and the traceback stays the script's."""
    job = JOBS / "faults" / "gather_size.py"
    proc, doc = trace_json(tmp_path / "run", "--nproc-per-node", 2, "--recorder", "python", "--timeout", 30, [str(job)])
    assert proc.returncode == 1 and doc["outcome"] == "failed", proc.stderr[-3000:]
    root = doc["doctor"]["findings"][0]
    # both ranks fail at the call, but the agent stops the other once one has failed: a rank slowed by a busy host
    # may be stopped before it gets there (rank 1, once, with three test workers on two cores)
    assert root["kind"] == "script-error" and root["ranks"] in ([0], [1], [0, 1]), root
    assert root["entry"].startswith("RuntimeError: ProcessGroupGloo::allgather: invalid tensor size")
    assert f" at {job}:{_line(job, '# the bad output')} " in root["entry"]
    assert "meshscope/" not in (tmp_path / "run" / "logs" / "rank0.log").read_text()
