"""A torch.compile'd module whose forward all-reduces through a functional collective.

Exercises: ``torch.compile`` (``--backend aot_eager`` by default: the same graph capture and
functionalisation as inductor without a C++ compiler; ``--backend inductor`` works too) of a
module (``fullgraph=True``, as torchtitan compiles its blocks: a graph break anywhere in the
module's call, its global hooks included, fails the job) that calls
``torch.distributed._functional_collectives.all_reduce`` inside its forward; the
op has an autograd formula, so backward all-reduces the gradient as well. This is an ordinary
user script: it never imports meshscope.

Launch (any world size >= 2)::

    torchrun --nproc-per-node 2 tests/jobs/compiled.py

Independent facts (hand count), per rank per step, all on the default group:

* forward: 1 all_reduce of the [batch, hidden] activation (--batch 4 x --hidden 16 fp32 = 256 B);
* backward: 1 all_reduce of its gradient (256 B);
* the first call compiles (graph capture runs on fake tensors and issues no collective), so every
  step, the first included, has exactly these 2 all_reduces; SGD issues none.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


class AllReducedLinear(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        return funcol.all_reduce(self.fc(x), "sum", dist.group.WORLD)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--backend", default="aot_eager", help="torch.compile backend")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = torch.compile(AllReducedLinear(args.hidden).to(device), backend=args.backend, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, device=device, requires_grad=True)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
