"""Fault: one rank skips a collective in a branch (a barrier inside ``if rank == 0:``).

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/skip_collective.py

A data-parallel loop over a 1-D DeviceMesh dim ``dp``: each step averages the gradients with one
``all_reduce`` per parameter. At step 2 rank 0 saves a checkpoint and, to make the others wait
until the file is written, calls ``dist.barrier`` -- inside its ``if rank == 0:`` branch, so only
rank 0 ever calls it. Rank 0 waits in the barrier; rank 1 goes on to step 3's first gradient
all-reduce and waits there: collective #k of the dp group is a barrier on rank 0 and an all-reduce
on rank 1, and both wait until the timeout. An ordinary user script: it never imports meshscope.

(Measured on torch 2.13 gloo: a skipped call whose place is taken by the SAME collective with another
size does not hang but aborts the receiving rank -- ``gloo::EnforceNotMet ... Received data size
doesn't match expected size`` -- taking the last half second of its flight log with it; a barrier
against an all-reduce waits until the timeout.)
"""

import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)).get_group("dp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(5):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=dp)
            p.grad /= world
        opt.step()
        if step == 2 and rank == 0:
            torch.save(model.state_dict(), os.path.join(tempfile.gettempdir(), f"ckpt-{os.getpid()}.pt"))
            dist.barrier(group=dp)  # the bug: a collective inside a rank-0-only branch
    time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
