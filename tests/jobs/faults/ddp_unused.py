"""Fault: one rank runs backward through a different set of DDP parameters (the unused-parameter hang).

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/ddp_unused.py

DistributedDataParallel (``find_unused_parameters=False``, the default) over a trunk and two heads
on a 1-D DeviceMesh dim ``dp``; the loss is the main head's plus an auxiliary head's. At step 2 rank
1's batch has "no auxiliary labels" and it skips the auxiliary head, so its backward never reaches
the auxiliary head's parameters: DDP's bucket holding them is never ready on rank 1, which
all-reduces fewer buckets than rank 0, and rank 0 waits in a bucket all-reduce rank 1 never
issues (rank 1 then fails at its next forward: "Expected to have finished reduction in the prior
iteration"). An ordinary user script: it never imports meshscope.
"""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 1)
        self.aux = nn.Linear(64, 1)

    def forward(self, x, with_aux):
        h = self.trunk(x)
        return self.head(h) + (self.aux(h) if with_aux else 0)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)).get_group("dp")
    torch.manual_seed(0)
    model = DDP(Net(), process_group=dp, bucket_cap_mb=0.001)  # a bucket per parameter or two
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(7 + rank)
    for step in range(5):
        x, y = torch.randn(8, 64, generator=gen), torch.randn(8, 1, generator=gen)
        with_aux = not (step == 2 and rank == 1)  # the bug: a data-dependent branch around a module
        opt.zero_grad()
        nn.functional.mse_loss(model(x, with_aux), y).backward()
        opt.step()
    time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
