"""Fault: one rank's all_to_all_single splits disagree with its peers' (an MoE dispatch on ``ep``).

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/a2a_splits.py

One expert per rank over a 1-D DeviceMesh dim ``ep``. Each step every rank routes its 16 tokens
(3:1 to expert 0), exchanges the per-expert counts with an int64 ``all_to_all_single``, then
dispatches its tokens with ``input_split_sizes`` = its counts and ``output_split_sizes`` = the
counts it received. From step 1 on rank 1 takes a "capacity" shortcut: it assumes routing is
symmetric and uses its OWN send counts as its receive counts instead of the exchanged ones. So rank
0 sends rank 1 4 tokens, while rank 1 expects 12 from it. An ordinary user script: it never
imports meshscope.
"""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

HIDDEN, TOKENS = 8, 16


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ep = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",)).get_group("ep")
    torch.manual_seed(rank)
    expert = nn.Linear(HIDDEN, HIDDEN)
    opt = torch.optim.SGD(expert.parameters(), lr=0.1)
    for step in range(4):
        tokens = torch.randn(TOKENS, HIDDEN)
        dest = torch.tensor([0 if i % 4 else 1 for i in range(TOKENS)])  # 3 in 4 tokens to expert 0
        order = dest.argsort(stable=True)
        send = torch.bincount(dest, minlength=world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=ep)
        if step >= 1 and rank == 1:  # the bug: "routing is symmetric", so skip reading the exchange
            recv = send.clone()
        inp, out = send.tolist(), recv.tolist()
        received = torch.empty(sum(out), HIDDEN)
        dist.all_to_all_single(received, tokens[order], out, inp, group=ep)
        opt.zero_grad()
        expert(received).square().mean().backward()
        opt.step()
    time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
