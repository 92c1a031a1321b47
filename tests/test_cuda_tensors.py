"""A fake world's tensors that stand for CUDA ones answer as a GPU's (issue 42 item 10; `trace/fake/cuda_tensors`).

Oracle: torch's own placement rules on a GPU, written per case below (an op's result lives where its
operands do, a gradient where its tensor does, ``.cuda()`` / ``.cpu()`` copy, an in-place result stays
where its tensor is, an explicit ``device=`` decides). One process per module: the patches are the
process's (CUDA mapped as in a fake world's rank, local rank 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import meshscope
import pytest

RULES = '''
import json, os
os.environ.update(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
import torch
from meshscope.trace.fake import patches
patches.apply({patches.CUDA_MAP})

def where(t):
    return [str(t.device), t.is_cuda, t.type(), t.get_device()]

seen = {}
a = torch.ones(3, device="cuda")
seen["factory device='cuda'"] = where(a)
seen["an op of it"] = where((a * 2).sum())
seen["a view of it"] = where(a[1:])
host = torch.ones(3)
seen["a host factory"] = where(host)
moved = host.cuda()
seen[".cuda() of a host tensor"] = where(moved)
seen["the host tensor after .cuda()"] = where(host)
seen[".cpu() of it"] = where(moved.cpu())
seen["an explicit device='cpu'"] = where(torch.zeros_like(a, device="cpu"))
seen["zeros_like"] = where(torch.zeros_like(a))
host.copy_(a)
seen["host.copy_(gpu)"] = where(host)
model = torch.nn.Linear(4, 4).to(0)
seen["Module.to(0)"] = where(model.weight)
model(torch.randn(2, 4, device="cuda")).sum().backward()
seen["a parameter's grad"] = where(model.weight.grad)
seen["Parameter(.data)"] = where(torch.nn.Parameter(model.weight.data))
x = torch.ones(2, device="cuda", requires_grad=True)
(g,) = torch.autograd.grad((x * x).sum(), x)
seen["autograd.grad"] = where(g)
seen["a cast"] = where(a.half())
seen["max's values"] = where(torch.max(torch.ones(2, 3, device="cuda"), dim=1).values)
seen["vmap of it"] = where(torch.vmap(lambda r: r * 2)(torch.ones(2, 3, device="cuda")))
seen["a compiled region's result"] = where(torch.compile(lambda t: t.sin() + 1, backend="eager")(a))
inside = []
torch.Tensor.register_hook(x, lambda grad: inside.extend([where(grad), where(a)]))
(x * 3).sum().backward()
seen["a gradient inside a tensor hook"], seen["a marked tensor inside a tensor hook"] = inside
from meshscope.trace.fake.cuda_tensors import on_host_tensor
seen["the host's: .cpu() of a GPU's"] = on_host_tensor(moved.cpu())
seen["the host's: a host factory"] = on_host_tensor(torch.ones(3))
seen["the host's: device='cpu'"] = on_host_tensor(torch.zeros_like(a, device="cpu"))
pinned = torch.ones(3, pin_memory=True)
seen["the host's: pin_memory=True"] = on_host_tensor(pinned)
plain = torch.ones(3)
seen["the host's: .pin_memory(), a copy"] = [on_host_tensor(plain.pin_memory()), on_host_tensor(plain)]
seen["the host's: a non-blocking copy to the CPU"] = on_host_tensor(a.to("cpu", non_blocking=True))
seen["the host's: an op of the host's"] = on_host_tensor(pinned * 2)
scalar = torch.ones((), device="cuda").cpu()
seen["the host's: a host scalar times a GPU's"] = [on_host_tensor(scalar), on_host_tensor(a * scalar), where(a * scalar)]
back = pinned.to(torch.device("cpu"), non_blocking=True)  # FSDP2's copy of an offloaded shard to its mesh's device
seen["the host's: a non-blocking copy of the host's"] = [on_host_tensor(back), where(back), back is pinned]
print(json.dumps(seen))
'''

GPU, HOST = ["cuda:1", True, "torch.cuda.FloatTensor", 1], ["cpu", False, "torch.FloatTensor", -1]
EXPECTED = {
    "factory device='cuda'": GPU,  # "cuda" is the current device: the local rank's
    "an op of it": GPU, "a view of it": GPU,
    "a host factory": HOST,
    ".cuda() of a host tensor": GPU, "the host tensor after .cuda()": HOST,  # a copy, the host's stays
    ".cpu() of it": HOST, "an explicit device='cpu'": HOST, "zeros_like": GPU,
    "host.copy_(gpu)": HOST,  # in place: where its tensor is
    "Module.to(0)": ["cuda:0", True, "torch.cuda.FloatTensor", 0],
    "a parameter's grad": ["cuda:0", True, "torch.cuda.FloatTensor", 0],  # made by autograd's C++ engine
    "Parameter(.data)": ["cuda:0", True, "torch.cuda.FloatTensor", 0],
    "autograd.grad": GPU,
    "a cast": ["cuda:1", True, "torch.cuda.HalfTensor", 1],
    "max's values": GPU, "vmap of it": GPU, "a compiled region's result": GPU,
    # not seen: autograd's C++ formulas made it and handed it to the hook without a torch call (`devices`' docstring
    # names the limit; explain() words a type check of it); a parameter's is read through .grad, above
    "a gradient inside a tensor hook": HOST,
    "a marked tensor inside a tensor hook": GPU,  # the hook is the script's code: it sees the marks
    # in the host's memory for certain (`cuda_tensors`' docstring): what the forecast leaves out of a GPU's memory
    "the host's: .cpu() of a GPU's": True,
    "the host's: a host factory": False, "the host's: device='cpu'": False,  # a CPU named is no proof in a fake world
    "the host's: pin_memory=True": True,
    "the host's: .pin_memory(), a copy": [True, False],  # torch returns a pinned copy
    "the host's: a non-blocking copy to the CPU": True,  # torch pins its destination
    "the host's: an op of the host's": True,
    "the host's: a host scalar times a GPU's": [True, False, GPU],  # a 0-dim operand decides nothing
    "the host's: a non-blocking copy of the host's": [False, GPU, False],  # to the mesh's device: the GPU
}


@pytest.fixture(scope="module")
def seen():
    proc = subprocess.run([sys.executable, "-c", RULES], check=False, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(Path(meshscope.__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_tensor_answers_where_a_gpu_would_put_it(seen, case):
    assert seen[case] == EXPECTED[case], (case, seen[case])
