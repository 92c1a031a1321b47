"""`meshscope trace --fake-world N --fake-tensors`: a fake world's ranks whose tensors have no data.

Oracles: the real c10d kernels recorded at BackendSelect (the functional collectives' decoders), the
hand counts of tests/jobs/transformer.py's docstring, DDP's bucket structure (as in
tests/test_fake_world.py), the fake world with real tensors (itself held against gloo there), and
torch's 1F1B order of sends and receives; for value reads, the counts of tests/jobs/value_reads.py's
docstring and the same job with data (whose real gloo trace equals it, by hand), and, kind by kind
(tests/fixtures/value_read_kinds.py, one process), the same code on real tensors where it has an
answer (a DataLoader's indices, an object collective's and a coalesced all-reduce's calls). (By hand,
docs/trace.md: fsdp2.py, fsdp_tp.py, dtensor_tp.py with SP, megatron_groups.py and pipeline_3d.py gave
the same ledgers with and without fake tensors; so did torchtitan, Lightning and Megatron's GPTModel.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from .helpers import ROOT, TORCH, cli_here, trace_json

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



SCRIPTED = r"""
import json
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from meshscope.trace.fake import patches
patches.apply({patches.FAKE_TENSORS})
import torch.distributed.optim  # scripts its functional optimizers at import, which call torch.tensor


@torch.jit.script
def scaled(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * torch.tensor(s) + torch.as_tensor([1.0, 2.0])


with FakeTensorMode():
    stacked = torch.tensor([torch.ones(()), torch.ones(())])  # the wrapper still answers a list of fakes
print(json.dumps({"scripted": scaled(torch.ones(2), 3.0).tolist(), "graph": "aten::tensor" in str(scaled.graph),
                  "stacked": [type(stacked).__name__, list(stacked.shape)],
                  "optimizer": torch.jit._state._get_script_class(torch.distributed.optim.functional_adam._FunctionalAdam)
                  is not None}))
"""


def test_torchscript_sees_torch_tensor_as_the_builtin_it_wraps(tmp_path):
    """Issue 42: ``import torch.distributed.optim`` (TorchRec's apply_optimizer_in_backward imports it) scripts
    functional optimizers that call ``torch.tensor``; TorchScript compiled the fake world's wrapper of it from
    source and failed ("... was expected, got builtin_function_or_method"). It compiles; a scripted function of
    the script's own calling torch.tensor and torch.as_tensor holds torch's op (aten::tensor) and computes
    1 * 3 + [1, 2] (by hand); the wrapper still stacks a list of 0-dim FakeTensors. (Not run under fake mode:
    torch 2.13 itself segfaults there, TorchScript's constant propagation writing a constant aten::tensor into a
    FakeTensor's missing storage, with or without meshscope.)"""
    script = tmp_path / "scripted.py"  # TorchScript reads the source of what it compiles
    script.write_text(SCRIPTED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc == {"scripted": [4.0, 5.0], "graph": True, "stacked": ["FakeTensor", [2]],
                   "optimizer": True}, doc


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
    same = cli_here("diff", tmp_path / "values", tmp_path / "shapes", "--json")
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


def test_a_fullgraph_compile_runs_eagerly_without_data(tmp_path):
    """tests/jobs/compiled.py compiles its module with fullgraph=True (as torchtitan compiles its blocks): Dynamo
    compiles no frame under the recording dispatch mode, which made such a compile raise "found no compiled
    frames"; it runs eagerly by torch's 'force_eager' stance, each step the job's hand count (2 all_reduces of
    256 B, forward and backward)."""
    proc, doc = trace_json(tmp_path / "t", "--fake-world", 2, "--fake-tensors", "--ranks", "0",
                           [str(JOBS / "compiled.py"), "--steps", "3"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert "torch.compile eager by its stance" in doc["fake_world"]["patched"]
    for step in doc["per_rank"][0]["steps"]:
        assert [(e["op"], e["phase"], e["bytes_in"]) for e in step["events"]] == [
            ("all_reduce", "forward", 256), ("all_reduce", "backward", 256)], step


def test_a_shape_from_values_stops_the_rank_with_one_line_naming_its_line(tmp_path):
    """A learned router's counts (bincount of the argmax of a Linear over random tokens) decide an uneven
    all-to-all's splits: they follow from the model's values, which no FakeTensor has, so the rank fails with
    one line naming the op and the script's line, and no traceback of meshscope's. (The job's fixed routing
    follows from its own Python numbers and is traced: tests/test_forecast.py.)"""
    proc, doc = trace_json(tmp_path / "moe", "--fake-world", 2, "--fake-tensors", "--ranks", "0",
                           [str(JOBS / "moe_a2a.py"), "--routing", "learned"])
    assert proc.returncode == 1 and not doc["passed"]
    end = json.loads((tmp_path / "moe" / "ranks" / "rank0.json").read_text())
    line = _line(JOBS / "moe_a2a.py", "send_counts = torch.bincount(")
    assert end["error"].startswith("aten.bincount.default (its output's shape depends on tensor values) at "
                                   f"moe_a2a.py:{line} (send_counts = torch.bincount(")
    assert "without --fake-tensors" in end["error"] and "\n" not in end["error"]
    assert end["exception"] == "DynamicOutputShapeException" and end["where"].endswith(f"moe_a2a.py:{line}")
    assert "moe_a2a.py" in proc.stderr and "meshscope/trace" not in proc.stderr  # the script's traceback only


def _line(path, text: str) -> int:
    """The line of `path` that holds `text` (once)."""
    lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def test_value_reads_of_a_training_script_are_answered_and_its_ledger_is_the_one_with_data(tmp_path):
    """tests/jobs/value_reads.py (DDP, a DataLoader over a DistributedSampler, trunc_normal_, a random seed broadcast
    and read back, an object collective, a coalesced all-reduce, logged values, a grad norm of a list of
    scalars, a buffer sized by a count read back, deepcopies, a checkpoint), world 2: with --fake-tensors it
    passes with the ledger of the fake world with data (`meshscope diff`: same, the two calls a step sized by
    a read are compared on all but their bytes); its answered reads are the docstring's, by line."""
    job = JOBS / "value_reads.py"
    (tmp_path / "ckpt").mkdir()
    proc, shapes = trace_json(tmp_path / "shapes", "--fake-world", 2, "--fake-tensors", "--ranks", "0,1",
                              [str(job), "--out", str(tmp_path / "ckpt")])
    assert proc.returncode == 0 and shapes["passed"], proc.stderr[-3000:]
    proc, values = trace_json(tmp_path / "values", "--fake-world", 2, "--ranks", "0,1", [str(job)])
    assert proc.returncode == 0 and values["passed"], proc.stderr[-3000:]
    same = cli_here("diff", tmp_path / "values", tmp_path / "shapes", "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["same"], same.stdout[-3000:]
    steps = 3
    where = {text: f"value_reads.py:{_line(job, text)}" for text in (
        "return int(rolled.item())", "count = int(torch.isfinite", "longest = max(int(c)", 'line = f"step',
        'if loss.detach() < totals["best"]', "nn.init.trunc_normal_(layer.weight")}
    want = {(where["return int(rolled.item())"], "1"): (1, 0),
            ("torch/nn/init.py:119", "False (a check that finds nothing)"): (2, 0),  # once per weight
            (where["count = int(torch.isfinite"], "1"): (steps, 2 * steps),  # it sizes the step's 2 gathers
            (where["longest = max(int(c)"], "1"): (2 * steps, steps),  # one per rank; it sizes the second
            (where['line = f"step'], "1.0"): (3 * steps, 0),
            (where['if loss.detach() < totals["best"]'], "True"): (steps, 0)}
    saved = (f"value_reads.py:{_line(job, 'torch.save(')}", "saved without data")
    for end in shapes["ranks"]:
        got = {(a["at"], a["answer"]): (a["count"], a["sized"]) for a in end["answered"]}
        assert got == {**want, **({saved: (1, 0)} if end["rank"] == 0 else {})}, end["answered"]  # rank 0 saves
        trunc = next(a for a in end["answered"] if a["at"] == "torch/nn/init.py:119")
        assert trunc["script"] == where["nn.init.trunc_normal_(layer.weight"]
    assert shapes["answered"] == {**{at: 2 * n for (at, _), (n, _) in want.items()}, saved[0]: 1}
    assumed = [(e["op"], e["dtype"], e["assumed"]) for r in shapes["per_rank"] for s in r["steps"] for e in s["events"]
               if e["assumed"]]
    # the reads size the step's two gathers; an all_gather_object that got a stand-in for a rank not traced
    # before it (trace.fake.objects) has its pickles' bytes assumed too
    read_sized = [(op, a) for op, dtype, a in assumed if dtype != "uint8"]
    assert read_sized == [("all_gather", ["bytes_in", "bytes_out"])] * (2 * steps * 2)
    stood_in = sum(end["stood_in"] for end in shapes["ranks"])
    assert [a for a in assumed if a[1] == "uint8"] == [("all_gather", "uint8", ["bytes_in", "bytes_out"])] * stood_in
    assert any(n.startswith("--fake-tensors: tensors have no values, so 49 value reads on 2 ranks") for n in
               shapes["notes"])
    import torch  # rank 0's checkpoint is whole: its structure and shapes, without data

    # its tensors were a GPU's (the job puts its model on cuda), so the file says so, as a GPU's would: a machine
    # without CUDA loads it mapped to the CPU
    checkpoint = torch.load(tmp_path / "ckpt" / "checkpoint.pt", map_location="cpu")
    assert checkpoint["step"] == steps and checkpoint["model"]["0.weight"].shape == (32, 16)


KINDS = ROOT / "tests" / "fixtures" / "value_read_kinds.py"


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """What tests/fixtures/value_read_kinds.py found, kind by kind (one process, about 10 s)."""
    out = tmp_path_factory.mktemp("kinds")
    proc = subprocess.run([sys.executable, str(KINDS)], capture_output=True, text=True, timeout=300, cwd=out,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "KINDS_OUT": str(out), "RANK": "1",
                               "WORLD_SIZE": "4"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {d["kind"]: d for d in map(json.loads, proc.stdout.splitlines())}
    return lambda kind: found[kind] if "error" not in found[kind] else pytest.fail(found[kind]["traceback"])


def _answered(doc) -> dict:
    return {tuple(k.split(" | ")): n for k, n in doc["answered"].items()}


def test_item_float_int_are_answered_and_counted_at_their_line(kinds):
    doc = kinds("scalars")
    at = f"value_read_kinds.py:{doc['line']}"
    assert (doc["item"], doc["float"], doc["int"]) == (1.0, 1.0, 1)
    assert _answered(doc) == {(at, at, "1.0"): 2, (at, at, "1"): 1}


def test_a_formatted_loss_formats_its_answer(kinds):
    assert kinds("formatted")["text"] == "1.000"


def test_checks_for_trouble_find_none_and_others_hold(kinds):
    doc = kinds("checks")
    assert (doc["any_nan"], doc["all_equal"], doc["equal"]) == (False, True, True)


def test_trunc_normal_ends_its_rejection_loop_on_plain_and_sharded_weights(kinds):
    doc = kinds("trunc_normal")
    assert doc["shape"] == [64, 64] and doc["sharded"] == ["DTensor", [16, 64]]
    assert _answered(doc) == {("torch/nn/init.py:119", f"value_read_kinds.py:{doc[line]}",
                               "False (a check that finds nothing)"): 1 for line in ("line", "sharded_line")}
    # As with data, where CommDebugMode counts the same: on torch 2.13 the DTensor's any() and its read stay
    # local; torch 2.15 all-gathers its shards' bool mask first (64 x 64 from 16 x 64 per rank)
    want = [] if TORCH < (2, 15) else [("all_gather", "bool", 1024, 4096)]
    assert [(c[0], c[3], c[4], c[5]) for c in doc["calls"]] == want, doc["calls"]


def test_tolist_answers_every_element(kinds):
    assert kinds("tolist")["list"] == [1, 1, 1]


def test_torch_tensor_of_0_dim_fakes_is_their_stack(kinds):
    doc = kinds("tensor_of_list")
    assert (doc["shape"], doc["dtype"], doc["type"], doc["requires_grad"]) == ([1, 2], "torch.float32", "FakeTensor",
                                                                                False)
    assert doc["norm"] == 1.0


def test_deepcopy_of_fakes_stays_in_their_fake_mode(kinds):
    doc = kinds("deepcopy")
    assert doc["constant"] == ["FakeTensor", True]  # torchmetrics' 0-dim default
    assert doc["module"] == [True, True, True, "mine"] and doc["mixed"] == [4, 4]
    assert not doc["answered"]


def test_torch_save_writes_a_whole_file_without_data(kinds, tmp_path_factory):
    import torch

    doc = kinds("save")
    at = f"value_read_kinds.py:{doc['line']}"
    assert doc["zip"] and doc["buffer"] and doc["fake_load"] == ["FakeTensor", [1000, 1000], 3]
    assert _answered(doc)[(at, at, "saved without data")] == 1
    path = next(tmp_path_factory.getbasetemp().glob("kinds*/checkpoint.pt"))
    real = torch.load(path)  # outside fake mode: the structure, tensors of the shapes
    assert real["step"] == 3 and real["model"]["weight"].shape == (1000, 1000)


def test_a_dataloader_over_a_distributed_sampler_fetches_the_real_indices(kinds):
    doc = kinds("dataloader")
    assert doc["indices"] == doc["real_indices"] and len(doc["indices"]) == 6 and not doc["answered"]


def test_object_collectives_issue_the_calls_they_issue_with_data(kinds):
    doc = kinds("object_collectives")
    assert doc["calls"] == doc["real_calls"] and len(doc["calls"]) == 2
    assert doc["objects"] == [{"rank": 1, "name": "x" * 10}] * 4  # the fake backend hands back this rank's own


def test_coalesced_all_reduce_is_the_call_it_is_with_data(kinds):
    doc = kinds("coalesced")
    assert doc["calls"] == doc["real_calls"] == [["all_reduce", "0", [0, 1, 2, 3], "float32", 40, 40, None, None, None]]


def test_a_random_seed_broadcast_and_read_back_is_answered(kinds):
    doc = kinds("seed_broadcast")
    assert doc["seed"] == 1 and [c[0] for c in doc["calls"]] == ["broadcast"]


def test_calls_a_function_issues_after_reading_an_integer_have_assumed_sizes(kinds):
    """The gather sized by the count and the all-reduce the function issues itself are marked; the
    all-reduce autograd's engine issues in backward is not."""
    doc = kinds("sizing")
    assert [c[0] for c in doc["calls"]] == ["all_gather", "all_reduce", "all_reduce"]
    assert doc["assumed"] == {"0": ["bytes_in", "bytes_out"], "1": ["bytes_in", "bytes_out"]}


def test_grad_scaler_finds_no_inf_and_steps(kinds):
    doc = kinds("amp")
    assert doc["stepped"] == 1
    assert [(k[0].split(":")[0], k[2]) for k in _answered(doc)] == [("torch/amp/grad_scaler.py",
                                                                    "0.0 (a check that finds nothing)")]


def test_a_shape_from_values_names_the_library_line_and_the_scripts(kinds):
    doc = kinds("stops")
    assert doc["raised"] == "DynamicOutputShapeException"
    assert doc["line"].startswith("aten._unique2.default (its output's shape depends on tensor values) at "
                                  "torch/functional.py:")
    assert ", from value_read_kinds.py:" in doc["line"] and doc["line"].endswith("without --fake-tensors")


def test_a_teardown_error_does_not_hide_the_value_read(kinds):
    doc = kinds("masked")
    assert doc["cause"] == "DynamicOutputShapeException" and doc["line"].startswith("aten.bincount.default")


def test_a_rank_records_the_value_read_a_teardown_error_hid(tmp_path):
    """The rank's failure (`FakeMode.explain`) is the value read a framework's teardown error was raised over
    (Lightning: "Please call iter(combined_loader) first."): its line, and its exception for the record."""
    import torch
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    from meshscope.core.rundir import RunDir
    from meshscope.trace.fake.mode import FakeMode
    from meshscope.trace.options import RankOptions

    def fetch():
        raise DynamicOutputShapeException(torch.ops.aten.nonzero.default)

    try:
        try:
            fetch()
        finally:
            raise RuntimeError("Please call iter(combined_loader) first.")
    except RuntimeError as exc:
        masked = exc
    options = RankOptions(run_dir=tmp_path, target=("train.py",), fake=True, fake_tensors=True)
    error, _, cause = FakeMode(options, RunDir(tmp_path), 0).explain(masked)
    assert isinstance(cause, DynamicOutputShapeException)
    assert error.startswith("aten.nonzero.default (its output's shape depends on tensor values) at "
                            "test_fake_tensors.py:")
    explained = FakeMode(RankOptions(run_dir=tmp_path, target=("train.py",), fake=True), RunDir(tmp_path), 0)
    assert explained.explain(masked) == (None, None, masked)  # with data, the script's own error stands


def test_the_scripts_line_of_a_job_that_is_all_library_code_is_its_entry_modules():
    """``-m torchtitan.train``: no frame is the user's, so the script's line is the innermost frame of the
    module the rank ran (train.py:571), not the library frame that read (distributed/utils.py:58)."""
    import traceback

    from meshscope.trace import script_frames

    site = script_frames.LIBRARY_ROOTS[0]
    frames = [traceback.FrameSummary(f"{site}{path}", line, name, lookup_line=False) for path, line, name in (
        ("runpy.py", 88, "_run_code"), ("torchtitan/train.py", 700, "<module>"), ("torchtitan/train.py", 571, "train"),
        ("torchtitan/distributed/utils.py", 58, "_dist_reduce"))]
    assert script_frames.where(frames) == f"{site}torchtitan/train.py:571"
    mine = [*frames[:2], traceback.FrameSummary("/home/me/train.py", 12, "main", lookup_line=False), *frames[2:]]
    assert script_frames.where(mine) == "/home/me/train.py:12"  # the user's own innermost frame


def test_a_kernel_launched_again_on_the_same_values_leaves_what_the_first_left():
    """`known.Known.kernel`: a launch of a kernel (its grid a tuple) on the values a launch already read leaves what
    that one left, without running (torchtitan's token permutation runs on the same counts in every MoE layer);
    other values, another kernel or a grid computed at the launch run it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshscope.trace.fake.known import Known

    known, runs, mode = Known(), [], FakeTensorMode()

    def tensor(value):
        fake = mode.from_tensor(value)
        known.values[fake] = value
        return fake

    def permute(args, kwargs):  # positions of each expert's tokens, as a kernel writes them: in place
        runs.append(args[0].tolist())
        args[1].copy_(torch.arange(4) * args[0][0] + args[0][1])

    def launch(counts, kernel="permute", grid=(2,)):
        out = tensor(torch.full((4,), -1))
        assert known.kernel(permute, (tensor(torch.tensor(counts)), out), {"BLOCK": 128}, (kernel, grid))
        return known.value(out).tolist()

    assert launch([3, 1]) == launch([3, 1]) == [1, 4, 7, 10] and runs == [[3, 1]]
    assert launch([2, 1]) == [1, 3, 5, 7] and runs == [[3, 1], [2, 1]]
    launch([3, 1], kernel="other")
    launch([3, 1], grid=lambda meta: (2,))
    assert runs == [[3, 1], [2, 1], [3, 1], [3, 1]]
