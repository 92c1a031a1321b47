"""Fault: ranks create process groups in different orders under a condition.

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/group_order.py

The job builds a data-parallel group ``dp`` of every rank and a ``metrics`` group of the logging
rank (rank 0) alone. The logging rank sets its metrics group up as soon as it knows it logs, BEFORE
the dp group; the others create it after. ``new_group`` is a global protocol (every rank must
create every group, member or not, in the same order), so the second group the ranks create is
``metrics`` on rank 0 and ``dp`` on rank 1: rank 0's dp group never meets rank 1's. An ordinary
user script: it never imports meshscope.
"""

import time

import torch
import torch.distributed as dist
from torch import nn


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    logs = rank == 0
    if logs:  # the bug: group creation under a rank-dependent condition
        metrics = dist.new_group([0], group_desc="metrics")
    dp = dist.new_group(list(range(world)), group_desc="dp")
    if not logs:
        metrics = dist.new_group([0], group_desc="metrics")
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        opt.zero_grad()
        loss = model(torch.randn(8, 16, generator=gen)).square().mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=dp)
        opt.step()
        if logs:
            dist.all_reduce(loss.detach(), group=metrics)
    time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
