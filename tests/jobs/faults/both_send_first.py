"""Fault: both ends of a pipeline boundary send first (blocking send/recv on gloo).

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/both_send_first.py

A hand-written 2-stage pipeline over a 1-D DeviceMesh dim ``pp``, microbatches in flight: stage 0
runs the first layer and ``dist.send``s each activation to stage 1, which finishes the forward and
sends the activation gradient back. To "overlap", both stages were changed to send first: stage 0
sends microbatch i+1's activation before receiving microbatch i's gradient, and stage 1 sends
microbatch i's gradient before receiving microbatch i+1's activation. Both ends block in ``send``
(an activation is 16 MiB, more than the sockets buffer) waiting for a recv the other never posts.
An ordinary user script: it never imports meshscope.
"""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

BATCH, HIDDEN, MICRO = 4096, 1024, 3  # an activation of 4096 x 1024 fp32 = 16 MiB


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if dist.get_world_size() != 2:
        raise SystemExit("both_send_first.py needs exactly 2 ranks (one per stage)")
    pp = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",)).get_group("pp")
    torch.manual_seed(rank)
    stage = nn.Linear(HIDDEN, HIDDEN)
    opt = torch.optim.SGD(stage.parameters(), lr=0.01)
    opt.zero_grad()
    if rank == 0:
        acts = [stage(torch.randn(BATCH, HIDDEN)) for _ in range(MICRO)]
        dist.send(acts[0].detach(), 1, group=pp)
        for i in range(MICRO):
            if i + 1 < MICRO:  # the bug: the next activation goes out before this gradient comes in
                dist.send(acts[i + 1].detach(), 1, group=pp)
            grad = torch.empty_like(acts[i])
            dist.recv(grad, 1, group=pp)
            acts[i].backward(grad)
    else:
        act = torch.empty(BATCH, HIDDEN, requires_grad=True)
        dist.recv(act.data, 0, group=pp)
        for i in range(MICRO):
            stage(act).square().mean().backward()
            dist.send(act.grad, 0, group=pp)  # the bug, this end: send before the next recv
            if i + 1 < MICRO:
                act = torch.empty(BATCH, HIDDEN, requires_grad=True)
                dist.recv(act.data, 0, group=pp)
    opt.step()
    time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
