"""HSDP x TP on meshes built the way torchtitan 0.2.2 builds them: one 1-D mesh, unflattened.

Exercises: torchtitan 0.2.2's ``ParallelDims.build_mesh`` (``torchtitan/distributed/parallel_dims.py``),
copied with cp = pp = ep = etp = 1: a 1-D ``("world",)`` mesh unflattened three times with torch's
``DeviceMesh._unflatten`` into a dataloading mesh ``(pp, batch, cp, tp)``, a dense mesh ``(pp,
dp_replicate, fsdp, tp)`` and a sparse mesh ``(pp, dp_replicate, efsdp, ep, etp)``, plus
``loss_mesh``, the dataloading mesh's ``(batch, cp)`` flattened. A dim of degree 1, and ``efsdp``
without experts, gets torch's ``fake`` backend (torchtitan's ``_mesh_exist``). The block's fc1 and
fc2 are ColwiseParallel / RowwiseParallel on ``tp`` (the dataloading mesh's, as torchtitan takes it),
then every block and the root are ``fully_shard`` on ``dense["dp_replicate", "fsdp"]``: HSDP,
replicated over dp_replicate and sharded over fsdp; the loss is all-reduced over ``loss_mesh`` for
the log. This is an ordinary user script: it never imports meshscope.

Launch (world = dp_replicate x dp_shard x tp, each >= 2)::

    torchrun --nproc-per-node 8 tests/jobs/hsdp_tp.py [--dp-replicate 2 --dp-shard 2 --tp 2]

Rank layout (world 8, row-major: tp fastest, then fsdp, then dp_replicate): tp groups {0,1} ...;
fsdp groups {0,2}, {1,3}, {4,6}, {5,7}; dp_replicate groups {0,4}, {1,5}, {2,6}, {3,7}; batch and
loss_mesh {0,2,4,6}, {1,3,5,7} (dp_replicate x fsdp); efsdp (fake backend) {0,1,2,3}, {4,5,6,7}.

Independent facts (hand count; defaults --blocks 1 --hidden 16 --batch 4, fp32), per rank per step:

* tp: 1 all_reduce in forward (fc2's RowwiseParallel output, Partial -> Replicate) and 1 in
  backward (fc1's ColwiseParallel input gradient);
* fsdp (FSDP2's shard dim), units = blocks + 1 (root): forward 1 all_gather per unit; backward
  re-gathers each block (the root stays unsharded); 1 reduce_scatter per unit;
* dp_replicate: 1 all_reduce per unit in backward (HSDP's replicate reduction after the
  reduce-scatter);
* loss_mesh: 1 all_reduce of the loss (other);
* set-up: parallelize_module's distribution of the block's weights over tp (scatters and a
  broadcast), before the first step.
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
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def build_meshes(device_type, world, dp_replicate, dp_shard, tp):
    """torchtitan 0.2.2's ParallelDims.build_mesh, with cp = pp = ep = etp = 1."""
    cp = pp = ep = etp = 1

    def exists(name, degree):  # ParallelDims._mesh_exist
        return ep > 1 if name == "efsdp" else degree > 1

    def unflatten(world_mesh, names, degrees):
        override = {name: "fake" for name, degree in zip(names, degrees) if not exists(name, degree)}
        return world_mesh._unflatten(0, degrees, names, backend_override=override)

    batch, fsdp = dp_replicate * dp_shard, dp_shard * cp
    efsdp = fsdp * tp // (etp * ep)
    world_mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("world",))
    dataloading = unflatten(world_mesh, ("pp", "batch", "cp", "tp"), (pp, batch, cp, tp))
    loss_mesh = dataloading["batch", "cp"]._flatten("loss_mesh")
    dense = unflatten(world_mesh, ("pp", "dp_replicate", "fsdp", "tp"), (pp, dp_replicate, fsdp, tp))
    unflatten(world_mesh, ("pp", "dp_replicate", "efsdp", "ep", "etp"), (pp, dp_replicate, efsdp, ep, etp))
    return dataloading["tp"], dense["dp_replicate", "fsdp"], loss_mesh


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
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dp-replicate", type=int, default=2)
    p.add_argument("--dp-shard", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if min(args.dp_replicate, args.dp_shard, args.tp) < 2 or world != args.dp_replicate * args.dp_shard * args.tp:
        sys.exit(f"hsdp_tp.py needs WORLD_SIZE = dp_replicate x dp_shard x tp, each >= 2; got WORLD_SIZE={world}, "
                 f"--dp-replicate {args.dp_replicate} --dp-shard {args.dp_shard} --tp {args.tp}")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    tp_mesh, hsdp_mesh, loss_mesh = build_meshes(device.type, world, args.dp_replicate, args.dp_shard, args.tp)

    torch.manual_seed(0)
    model = Model(args.hidden, args.blocks).to(device)
    for block in model.blocks:
        parallelize_module(block, tp_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        fully_shard(block, mesh=hsdp_mesh)
    fully_shard(model, mesh=hsdp_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(1234 + loss_mesh.get_local_rank())
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        logged = loss.detach().clone()
        dist.all_reduce(logged, group=loss_mesh.get_group())
        opt.step()
    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # gloo's teardown race on torch 2.13 (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
