"""A script written for CUDA in a fake world on a machine without CUDA: every CUDA device is the CPU
(`trace.fake.devices`), the ledger is what the script's own CPU path issues, and what cannot be mapped
is named in one line."""

from __future__ import annotations

import torch

from .helpers import ROOT, trace_json

JOBS = ROOT / "tests" / "jobs"


def test_a_cuda_script_runs_mapped_to_the_cpu(tmp_path):
    """cuda_style.py takes its CUDA path (set_device, nccl with device_id, init_device_mesh("cuda"), .cuda(),
    DDP device_ids, FSDP2 on the mesh); per step it issues DDP's one bucket all-reduce and FSDP2's root
    all-gather and reduce-scatter, sized by hand from its two 32 x 32 fp32 weights over 4 ranks."""
    assert not torch.cuda.is_available()
    proc, doc = trace_json(tmp_path / "fake", "--fake-world", 4, "--ranks", "0,3", [JOBS / "cuda_style.py", "--steps", "2"])
    assert proc.returncode == 0 and doc["passed"], proc.stderr[-3000:]
    note = next(n for n in doc["notes"] if "mapped every CUDA device to the CPU" in n)
    for call in ("torch.cuda.set_device", "DeviceMesh('cuda')", ".cuda()", "DDP device_ids", "device='cuda'"):
        assert call in note, note
    weight, world = 32 * 32 * 4, 4
    step = [("all_gather", "forward", weight // world, weight), ("all_reduce", "backward", weight, weight),
            ("reduce_scatter", "backward", weight, weight // world)]
    for rank in doc["per_rank"]:
        steps = {s["step"]: s["events"] for s in rank["steps"]}
        assert sorted(steps) == [0, 1]
        for events in steps.values():
            assert {(e["axis"], tuple(e["group"])) for e in events} == {("dp", (0, 1, 2, 3))}
            assert [(e["op"], e["phase"], e["bytes_in"], e["bytes_out"]) for e in events
                    if e["op"] != "broadcast" and e["phase"] != "other"] == step
        assert ("broadcast", weight) in [(e["op"], e["bytes_in"]) for e in steps[0] if e["phase"] == "other"]


def test_a_cuda_call_that_cannot_be_mapped_is_named(tmp_path):
    script = tmp_path / "streams.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      "dist.init_process_group('nccl')\n"
                      "x = torch.ones(4).cuda()\n"
                      "side = torch.cuda.Stream()\n")
    proc, doc = trace_json(tmp_path / "out", "--fake-world", 2, "--ranks", "0", [script])
    assert proc.returncode == 1 and not doc["passed"]
    error = next(r["error"] for r in doc["ranks"] if r["rank"] == 0)
    assert error.startswith("Unmapped: torch.cuda.Stream at streams.py:4 needs a CUDA device"), error
