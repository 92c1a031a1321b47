"""The fake backend for every group, and object collectives that deliver what was sent.

Oracles: the hand counts in the jobs' docstrings (tests/jobs/subgroups.py, megatron_groups.py
--gloo-groups), the objects each job checks itself and prints (tests/jobs/object_collectives.py), and a
real gloo trace of the same script under `meshscope diff`."""

from __future__ import annotations

import argparse
import json

import pytest

from meshscope.cli.trace_command import cmd_diff
from meshscope.core.trace_result import TraceResult

from .helpers import ROOT, cli, trace_json

JOBS = ROOT / "tests" / "jobs"


def test_subgroups_of_every_backend_name_are_fake(tmp_path):
    """new_group with "gloo", "nccl" and "cpu:gloo,cuda:nccl", DeviceMesh's backend override and split_group:
    the script takes its CUDA path (CUDA is mapped) and issues the docstring's 7 all_reduces on every rank."""
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 4, "--ranks", "0,1,2,3", [str(JOBS / "subgroups.py")])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    assert "new_group on the fake backend" in doc["fake_world"]["patched"]
    for rank in range(4):
        pair = [0, 1] if rank < 2 else [2, 3]
        (step,) = next(r["steps"] for r in doc["per_rank"] if r["rank"] == rank)
        got = [(e["op"], e["axis"], e["group"], e["bytes_in"]) for e in step["events"]]
        assert got == [("all_reduce", "group", pair, 4), ("all_reduce", "group", pair, 8),
                       ("all_reduce", "group", [0, 1, 2, 3], 12), ("all_reduce", "group", [0, 1, 2, 3], 16),
                       ("all_reduce", "dp", [rank % 2, rank % 2 + 2], 20), ("all_reduce", "tp", pair, 24),
                       ("all_reduce", "group", pair, 28)], rank
    # split_group made only this rank's split, as torch's does (members only)
    creations = [json.loads(line) for line in (tmp_path / "run" / "groups" / "rank2.jsonl").read_text().splitlines()]
    assert [c["ranks"] for c in creations if c.get("desc") == "split_pairs"] == [[2, 3]]


def _lines(run, rank: int, what: str) -> list[str]:
    return [line for line in (run / "logs" / f"rank{rank}.log").read_text().splitlines()
            if line.startswith(f"rank {rank} {what} ")]


def test_object_collectives_deliver_the_sources_objects_and_mark_what_was_stood_in(tmp_path, capsys):
    """--ranks 0,1,3 traces ranks 0 and 1 together (1 waits for 0's records), then 3 (after both): every rank
    gets rank 0's objects, the calls are gloo's, and only the bytes sized by a rank it had not traced are
    assumed: each all-gather and gather, whose sizes need every member's object."""
    job = [str(JOBS / "object_collectives.py")]
    real = cli("trace", "--nproc-per-node", 4, "--out", tmp_path / "real", "--", *job, timeout=240)
    fake, doc = trace_json(tmp_path / "fake", "--fake-world", 4, "--ranks", "0,1,3", job)
    assert real.returncode == 0, real.stderr[-3000:]
    assert fake.returncode == 0 and doc["passed"], fake.stderr[-3000:]
    assert doc["fake_world"]["traced"] == [0, 1, 3]
    for rank in (0, 1, 3):  # the job exits 1 if an object is not rank 0's; its lines say what it got
        assert _lines(tmp_path / "fake", rank, "broadcast") == [f"rank {rank} broadcast ['from 0', {{'rank': 0, 'pad': ''}}]"]
        assert _lines(tmp_path / "fake", rank, "scatter") == [f"rank {rank} scatter {{'to': {rank}, 'pad': '{'y' * 5 * rank}'}}"]
        assert len(_lines(tmp_path / "fake", rank, "subgroup broadcast")) == 1
    gathered = _lines(tmp_path / "fake", 3, "all_gather")[-1]  # rank 3 ran after 0 and 1: only rank 2 unknown
    assert "{'rank': 0, 'pad': ''}, {'rank': 1" in gathered and "{'rank': 3, 'pad': 'x" in gathered

    result = TraceResult.from_json(doc)
    for rank in (0, 1, 3):
        calls = [(e.op, e.dtype, e.assumed) for e in result.events if e.rank == rank]
        assert calls == [("broadcast", "int64", ()), ("broadcast", "uint8", ()), ("broadcast", "int64", ()),
                         ("scatter", "uint8", ()), ("scatter", "int64", ()), ("all_gather", "int64", ()),
                         ("all_gather", "uint8", ("bytes_in", "bytes_out")), ("all_gather", "int64", ()),
                         ("gather", "uint8", ("bytes_in", "bytes_out")), ("broadcast", "int64", ()),
                         ("broadcast", "uint8", ())], rank
    assert any("object collective" in note and "6 such calls got one" in note for note in doc["notes"])

    assert cmd_diff(argparse.Namespace(dir_a=tmp_path / "fake", dir_b=tmp_path / "real", json=True)) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["verdict"] == "same" and diff["ranks"] == [0, 1, 3], diff
    assert diff["assumed"]["calls"] == {"a": 6, "b": 0} and diff["assumed"]["fields"] == ["bytes_in", "bytes_out"]
    real_bytes = {(e.rank, e.op, e.dtype, e.bytes_in, e.bytes_out) for e in TraceResult.from_json(
        json.loads((tmp_path / "real" / "result.json").read_text())).events}
    known = {(e.rank, e.op, e.dtype, e.bytes_in, e.bytes_out) for e in result.events if not e.assumed}
    assert known <= real_bytes  # what was delivered is what gloo sent: the source's real sizes


def test_megatron_core_defaults_with_gloo_twins(tmp_path):
    """initialize_model_parallel with create_gloo_process_groups=True (Megatron's default): its three
    new_group(backend="gloo") twins are fake groups, used as the docstring counts (17 all_reduce a step)."""
    pytest.importorskip("megatron.core")
    job = [str(JOBS / "megatron_groups.py"), "--gloo-groups", "--steps", "1"]
    proc, doc = trace_json(tmp_path / "run", "--fake-world", 4, "--ranks", "0,3", job)
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    want = ["tp", "pp", "dp", "dp-cp", "cp", "tp-pp", "tp-dp", "tp-dp-cp", "tp-cp", "ep", "etp", "etp-ep", "etp-ep-pp",
            "edp", "dp", "dp-cp", "edp"]
    for rank in doc["per_rank"]:
        (step,) = rank["steps"]
        assert [(e["axis"], e["bytes_in"] // 4) for e in step["events"]] == list(zip(want, range(1, 18))), rank["rank"]
    groups = {g["desc"]: g["ranks"] for g in json.loads((tmp_path / "run" / "ranks" / "rank0.json").read_text())["groups"]}
    assert groups["DATA_PARALLEL_GROUP_GLOO"] == groups["DATA_PARALLEL_GROUP"] == [0, 2]
    assert groups["EXPERT_DATA_PARALLEL_GROUP_GLOO"] == [0, 2]


@pytest.mark.parametrize("name", ["init_process_group", "new_group", "split_group"])
def test_the_wrappers_bind_c10d_calls_as_inspect_does(name):
    """`entry_points.arguments` (every fake-world and --timeout wrapper binds through it) gives what
    ``inspect.Signature.bind_partial`` gives, for positions, names, both, and calls it must refuse."""
    import inspect

    import torch.distributed.distributed_c10d as c10d

    from meshscope.trace.entry_points import arguments

    original = getattr(c10d, name)
    signature, bind = inspect.signature(original), arguments(original)
    first, second = list(signature.parameters)[:2]
    calls = [((), {}), ((1,), {}), ((1, 2), {}), ((), {second: 2}), ((1,), {second: 2, "timeout": 3}),
             ((), {"timeout": 3, first: 1})]
    for args, kwargs in calls:
        assert bind(args, kwargs) == dict(signature.bind_partial(*args, **kwargs).arguments), (args, kwargs)
    too_many = tuple(range(len(signature.parameters) + 1))
    for args, kwargs in [(too_many, {}), ((1,), {first: 1}), ((), {"no_such_argument": 1})]:
        with pytest.raises(TypeError):
            signature.bind_partial(*args, **kwargs)
        with pytest.raises(TypeError):
            bind(args, kwargs)
