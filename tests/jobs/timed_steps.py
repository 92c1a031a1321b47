"""An MLP trained under DDP that times its own steps: the independent clock a forecast's measured compute is
held against.

Exercises: DDP (default buckets) over --layers Linear(--hidden, --hidden) + ReLU, batch --batch, fp32, SGD; each
step (zero_grad, forward, backward, optimizer step) timed by the script itself with ``time.perf_counter`` (on
CUDA: after ``torch.cuda.synchronize()`` at both ends). It prints one line per step, ``step S seconds T``,
on rank 0. An ordinary user script: it never imports meshscope.

Launch (any world size)::

    torchrun --nproc-per-node 1 tests/jobs/timed_steps.py [--steps 6]

Independent facts: per step, each Linear does 3 matmuls of 2 x batch x hidden x hidden FLOPs but the first
layer's input gradient (none: the input needs no gradient); the step's time is what the script printed.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    layers = [m for _ in range(args.layers) for m in (nn.Linear(args.hidden, args.hidden), nn.ReLU())]
    model = DDP(nn.Sequential(*layers).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.hidden, device=device)
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if dist.get_rank() == 0:
            print(f"step {step} seconds {time.perf_counter() - start:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
