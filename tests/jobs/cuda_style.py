"""CUDA-style job: the way a GPU script is written, DDP and FSDP2 on a device mesh.

Exercises: what users' scripts do on a GPU node. With CUDA it picks
``cuda:LOCAL_RANK``, ``torch.cuda.set_device``, NCCL with ``device_id=``,
``init_device_mesh("cuda", ...)``, ``.cuda()`` on the models and
``device=`` on the batches, ``DDP(..., device_ids=[local_rank])``; without
CUDA the same code on the CPU and gloo. This is an ordinary user script: it
never imports meshscope.

Launch::

    torchrun --nproc-per-node 4 tests/jobs/cuda_style.py

Two models over a 1-D mesh ("dp") of the whole world: ``ddp_net``, a
Linear(--hidden, --hidden) without bias under DDP (bucket_cap_mb 25: one
bucket), and ``fsdp_net``, a Linear(--hidden, --hidden) without bias under
``fully_shard`` on the mesh (one FSDP parameter group, the root).

Independent facts, per rank (hidden 32, fp32: each weight is 32*32*4 =
4,096 B):

* DDP construction (outside forward and backward): its parameter-shape
  check (an all_gather of 8 B in, 8 * W B out, and a broadcast of 32 B)
  and one broadcast of the module states from rank 0 (4,096 B); in step 1's
  forward, its bucket rebuild broadcasts 8 B and 4 B;
* per step, in the backward: DDP one all_reduce of its one bucket (4,096 B);
  FSDP2 one all_gather of the root's parameters in the forward (4,096 / W B
  in, 4,096 B out) and one reduce_scatter of its gradient in the backward
  (4,096 B in, 4,096 / W B out); the root is not resharded after forward,
  so the backward needs no second all_gather.

So 3 calls per step (1 all_reduce, 1 all_gather, 1 reduce_scatter) plus
DDP's set-up calls, on the same path with and without CUDA (measured:
torch 2.13 CPU, the gloo trace at world 4 equals the fake world's mapped
CUDA path call for call).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    return p.parse_args()


def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))

    torch.manual_seed(0)
    ddp_net = nn.Linear(args.hidden, args.hidden, bias=False)
    fsdp_net = nn.Linear(args.hidden, args.hidden, bias=False)
    if cuda:
        ddp_net, fsdp_net = ddp_net.cuda(), fsdp_net.cuda()
    ddp = DDP(ddp_net, device_ids=[local_rank] if cuda else None, process_group=mesh.get_group(), bucket_cap_mb=25)
    fully_shard(fsdp_net, mesh=mesh)
    # foreach=False: one optimizer holds DDP's plain tensors and FSDP2's DTensors, which torch's
    # foreach kernels (its default for CUDA parameters) cannot take in one call
    opt = torch.optim.SGD(list(ddp.parameters()) + list(fsdp_net.parameters()), lr=0.01, foreach=False)

    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, device=device)
        opt.zero_grad(set_to_none=True)
        loss = ddp(x).pow(2).mean() + fsdp_net(x.to(device)).pow(2).mean()
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # torch 2.13 + gloo: let the workers free their works before teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
