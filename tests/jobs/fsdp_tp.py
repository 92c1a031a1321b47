"""2-D FSDP2 x TP job: parallelize_module on the "tp" submesh, fully_shard on "dp".

Exercises: ``init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))``;
each block is a Megatron-style MLP (fc1 ColwiseParallel, fc2 RowwiseParallel)
parallelised over ``mesh["tp"]`` and then wrapped with ``fully_shard`` over
``mesh["dp"]``; the root (input projection + head, not tensor-parallel) is one
more FSDP unit. This is an ordinary user script: it never imports meshscope.

Launch (world 4 = dp 2 x tp 2; in general WORLD_SIZE = dp * tp with
dp >= 2 and tp >= 2)::

    torchrun --nproc-per-node 4 tests/jobs/fsdp_tp.py
    torchrun --nproc-per-node 4 tests/jobs/fsdp_tp.py --blocks 3 --steps 5

Rank layout (row-major mesh, world 4, tp 2): mesh [[0, 1], [2, 3]];
tp groups {0,1} and {2,3}; dp groups {0,2} and {1,3}.

Independent facts (defaults: --tp 2 --blocks 2 --hidden 32 --batch 4 --steps 3,
fp32), per rank per step:

* TP (group "tp", size tp), per block: forward **1 all_reduce** (fc2
  RowwiseParallel output Partial -> Replicate, [batch, hidden]); backward
  **1 all_reduce** (fc1 ColwiseParallel input grad Partial -> Replicate).
  **tp all_reduce per step = 2 * blocks = 4.**
* FSDP2 (group "dp", size dp), units = blocks + 1 (root) = 3:
  forward 1 all-gather per unit (3); backward re-gathers each block (2), the
  root stays unsharded between forward and backward (default
  reshard_after_forward); **dp all-gathers per step = 2*blocks + 1 = 5**;
  **dp reduce-scatters per step = blocks + 1 = 3**. No all-reduce on dp.
* No collective over the whole world in the loop; AdamW's step issues none
  (every grad has its parameter's placements).
* Setup (before step 1, parallelize_module with ``src_data_rank=0`` on the
  tp group), per block: 3 scatter (fc1.weight, fc1.bias, fc2.weight) + 1
  broadcast (fc2.bias) -> **6 scatter + 2 broadcast on tp** for 2 blocks.
  (Plus the process-group creation for the mesh dims.)
* Data: every rank of one tp group sees the same batch (seeded by the dp
  rank); the dp replicas see different batches.

Measured on torch 2.13 CPU/gloo at world 4 with a TorchDispatchMode counter
(DTensor desugared first, as in CommDebugMode) keyed on optimizer step hooks:
init = ``c10d::scatter_``[tp] 6, ``c10d::broadcast_``[tp] 2; each step =
``_c10d_functional::all_reduce``[tp] 4, ``c10d::_allgather_base_``[dp] 5,
``c10d::_reduce_scatter_base_``[dp] 3.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    return p.parse_args()


def setup():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return device


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Model(nn.Module):
    def __init__(self, hidden, blocks):
        super().__init__()
        self.inp = nn.Linear(hidden, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(blocks))
        self.head = nn.Linear(hidden, hidden)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp = args.tp
    if tp < 2 or world % tp or world // tp < 2 or (4 * args.hidden) % tp:
        sys.exit(
            "fsdp_tp.py needs WORLD_SIZE = dp * tp with dp >= 2 and tp >= 2 "
            "(e.g. 4 with --tp 2); got WORLD_SIZE=%d, --tp %d" % (world, tp)
        )
    device = setup()
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]

    torch.manual_seed(0)
    model = Model(args.hidden, args.blocks).to(device)
    for block in model.blocks:
        parallelize_module(
            block, tp_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        )
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    gen = torch.Generator().manual_seed(1234 + dp_mesh.get_local_rank())
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        y = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    # torch 2.13 + gloo: a gloo worker thread frees each finished work
    # (whose saved thread-local state holds a Python object) only once it
    # gets the GIL; if the interpreter is already finalizing by then, the
    # process aborts with "terminate called without an active exception"
    # (seen in ~1 of 3 runs at world 4 on a loaded 2-core box). Releasing
    # the GIL for a moment before teardown lets the workers finish.
    if dist.get_backend() == "gloo":
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
