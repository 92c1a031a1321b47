"""Fault: ranks build the same group with different rank lists (a group-size mismatch).

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/group_size.py

The job reads its tensor-parallel degree from a per-node setting: rank 0 sees ``TP=2``, rank 1 a
stale ``TP=1`` (stood for here by a rank test). Each builds its ``tp`` groups with
``new_group(ranks, group_desc="tp")`` from that degree, so rank 0 creates tp [0, 1] while rank 1
creates tp [0] and tp [1]: the ranks disagree on the group's members and on how many groups
there are. An ordinary user script: it never imports meshscope.
"""

import time

import torch
import torch.distributed as dist
from torch import nn


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp_size = 2 if rank == 0 else 1  # the bug: a per-rank setting that should be the same everywhere
    tp = None
    for start in range(0, world, tp_size):
        ranks = list(range(start, start + tp_size))
        group = dist.new_group(ranks, group_desc="tp")
        if rank in ranks:
            tp = group
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        out = model(torch.randn(4, 16))
        dist.all_reduce(out, group=tp)  # a row-parallel layer's partial sums
        out.square().mean().backward()
        opt.step()
    time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
