"""A DDP job whose set-up issues a random number of collectives: the steady steps do not.

Exercises: what a budget must leave out of its steady steps (docs/budget.md). Initialisation that
draws random numbers on one rank and agrees on them with collectives (a rejection loop as in
``nn.init.trunc_normal_`` on sharded weights, where torchtitan's step 0 issued 252 calls in one run
and 258 in the next) issues a different number of calls in every run; DDP's training steps do not.
This is an ordinary user script: it never imports meshscope.

Launch (any world >= 1)::

    torchrun --nproc-per-node 2 tests/jobs/random_init.py --steps 4

Independent facts: before DDP, rank 0 draws n in 1..8 from an unseeded generator and broadcasts it
(1 int64 broadcast), then every rank broadcasts a [64] float32 tensor from rank 0 n times: 1 + n
broadcasts in step 0, n different from run to run. DDP then (ddp.py's docstring, one 64x64 layer,
its default bucket): step 0 one gradient all-reduce, step 1 two rebuild broadcasts and one, steps
2.. one all-reduce (16 KiB) each.
"""

import argparse
import os
import random
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else \
        torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    draws = torch.tensor([random.SystemRandom().randint(1, 8)], device=device)
    dist.broadcast(draws, 0)
    buffer = torch.zeros(64, device=device)
    for _ in range(int(draws.item())):  # an initialisation loop whose length depends on a random draw
        dist.broadcast(buffer, 0)

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(64, 64, bias=False).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234 + dist.get_rank())
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(8, 64, generator=gen).to(device)).pow(2).mean().backward()
        opt.step()

    if dist.get_backend() == "gloo":  # tests/jobs/README.md, "Teardown on gloo"
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
