"""A module that builds a fresh submodule inside its forward on every call.

Exercises: modules created per call, as megatron-core 0.16.1's ``FusedScaleMaskSoftmax`` builds a
new ``nn.Softmax`` on every attention call (``megatron/core/fusions/fused_softmax.py:331``). Freed
at the end of the call, such a module's address is soon handed to the next one, so anything that
knows modules by ``id()`` takes the new module for the old. Here the attention builds, calls and
drops an ``nn.Softmax`` until one gets an address it has seen before (at most 64 tries per call), so
every call meets a reused address; each rank prints how many calls did. The gradients are averaged
by hand after backward, outside every module, as Megatron's ``finalize_model_grads`` does. This is
an ordinary user script: it never imports meshscope.

Launch (any world size >= 2)::

    torchrun --nproc-per-node 2 tests/jobs/fresh_modules.py [--steps 4]

Independent facts (hand count; defaults --hidden 8 --batch 4, fp32), per rank, the same in every
step (step 0 included: there is no set-up collective), all on the default group, in this order:

* forward, in ``attention``: 1 all_reduce of the scores (the functional collective, which has an
  autograd formula; 4 x 8 fp32 = 128 B);
* backward: 1 all_reduce of their gradient (128 B), in no module;
* outside every module: 4 all_reduces, one per parameter's gradient (``attention.qkv.weight``
  256 B, ``attention.qkv.bias`` 32 B, ``out.weight`` 256 B, ``out.bias`` 32 B), then 1 all_reduce
  of the loss for the log (4 B); SGD issues none.

The fresh ``nn.Softmax`` modules issue no collective; they only come and go.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

REUSE_TRIES = 64
"""The most fresh modules one call builds while waiting for an address it has seen before."""


class Attention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.qkv = nn.Linear(hidden, hidden)
        self.addresses: set[int] = set()
        self.reused_calls = 0

    def forward(self, x):
        scores = self.qkv(x)
        for _ in range(REUSE_TRIES):
            softmax = nn.Softmax(dim=-1)
            scores = softmax(scores)
            address = id(softmax)
            del softmax  # freed here: its address is free for the next module
            if address in self.addresses:
                self.reused_calls += 1
                break
            self.addresses.add(address)
        return funcol.all_reduce(scores, "sum", dist.group.WORLD)


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.attention = Attention(hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.out(self.attention(x))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        raise SystemExit(f"fresh_modules.py needs a world of 2 or more ranks, got {world}")

    torch.manual_seed(0)
    model = Model(args.hidden).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234 + rank)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        for param in model.parameters():  # averaged by hand, outside every module
            dist.all_reduce(param.grad)
            param.grad /= world
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        opt.step()
    print(f"rank {rank}: calls at a reused module address: {model.attention.reused_calls} of {args.steps}",
          file=sys.stderr, flush=True)
    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # gloo's teardown race on torch 2.13 (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
