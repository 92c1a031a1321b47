"""FSDP2 job: fully_shard on each of N blocks plus the root module.

Exercises: ``torch.distributed.fsdp.fully_shard`` (FSDP2, per-parameter
DTensor sharding on a 1-D mesh over the whole world). Every block is its own
FSDP unit and the root (which owns an input projection and an output head)
is one more unit. This is an ordinary user script: it never imports meshscope.

Launch (world size >= 2)::

    torchrun --nproc-per-node 4 tests/jobs/fsdp2.py
    torchrun --nproc-per-node 2 tests/jobs/fsdp2.py --blocks 3 --no-reshard-after-forward

Independent facts (defaults: --blocks 4 --hidden 64 --steps 3, fp32,
``fully_shard``'s default reshard_after_forward):

* FSDP units: blocks + 1 (root) = **5 units**; each unit's parameters are
  flattened into one all-gather / one reduce-scatter per call (FSDP2
  groups a unit's parameters into a single collective).
* Per step, per rank, all over the whole world (one group of size WORLD_SIZE):
  - forward: 1 all-gather per unit = blocks + 1 = 5;
  - backward: every block was resharded after forward, so each block
    all-gathers again = blocks = 4; the root is NOT resharded after
    forward (with the default reshard_after_forward FSDP2 keeps the root
    unsharded between forward and backward), so it does not all-gather
    again. (Passing reshard_after_forward=True explicitly to the root in
    torch 2.13 would make it 2*blocks + 2 = 10.);
  - **all-gathers per step = 2*blocks + 1 = 9**;
  - **reduce-scatters per step = blocks + 1 = 5** (one per unit, gradients);
  - no all-reduce (pure data parallel FSDP, no HSDP replication).
* With ``--no-reshard-after-forward``: all-gathers per step = blocks + 1 = 5
  (params stay unsharded between forward and backward), reduce-scatters 5.
* With ``--cpu-offload`` (``fully_shard``'s ``CPUOffloadPolicy``; the model
  built on the meta device, sharded, then made on the host, as torchtitan
  orders it for offload): the same calls per step (measured: 17 all-gathers
  and 9 reduce-scatters at --blocks 8, world 4); the sharded parameters,
  their gradients and AdamW's state live in the host's memory.
* Sizes (fp32 elements; no padding since 64 and 128 divide by 2 and 4):
  a block unit is fc1 (64*128 + 128) + fc2 (128*64 + 64) = 16576 elements
  (66304 B) unsharded, 16576/W per rank; the root unit is inp + head =
  2 * (64*64 + 64) = 8320 elements (33280 B), 8320/W per rank. Each
  all-gather (``all_gather_into_tensor``) has output = the unsharded size and
  input = the shard; each reduce-scatter (``reduce_scatter_tensor``) the
  reverse.
* Order per step (world 2, output elements): AG root 8320, AG b0..b3 16576
  x4 (forward); AG b3, AG b2 (prefetch), RS b3, AG b1, RS b2, AG b0, RS b1,
  RS b0, RS root 8320 (backward).
* One ``optimizer.step()`` (AdamW on the sharded DTensor params) per
  iteration; the optimizer step itself issues no collective.
* Setup (before step 1): FSDP2 does not broadcast; rank-identical init comes
  from the fixed seed. ``init_device_mesh`` creates no extra collective on
  gloo beyond process-group creation.

Measured on torch 2.13 CPU/gloo (world 2 and 4) with a TorchDispatchMode
counter keyed on optimizer step hooks: each step =
``c10d::_allgather_base_`` x9 and ``c10d::_reduce_scatter_base_`` x5
(defaults); 5 and 5 with --no-reshard-after-forward.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--no-reshard-after-forward", action="store_true")
    p.add_argument("--cpu-offload", action="store_true",
                   help="fully_shard's CPUOffloadPolicy: sharded parameters, gradients and AdamW's state on the host")
    p.add_argument("--foreach", action="store_true",
                   help="AdamW's foreach implementation (torch's default for GPU tensors; the CPU's is one tensor at "
                        "a time)")
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
        self.fc1 = nn.Linear(hidden, 2 * hidden)
        self.fc2 = nn.Linear(2 * hidden, hidden)

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
    if world < 2:
        sys.exit("fsdp2.py needs WORLD_SIZE >= 2 (got %d)" % world)
    device = setup()
    rank = dist.get_rank()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))

    torch.manual_seed(0)
    if args.cpu_offload:  # built on no device, sharded, then made on the host (torchtitan's order for offload)
        with torch.device("meta"):
            model = Model(args.hidden, args.blocks)
    else:
        model = Model(args.hidden, args.blocks).to(device)
    # Default reshard_after_forward (None in torch 2.13: True for the blocks,
    # False for the root); --no-reshard-after-forward passes False everywhere.
    kw = {"reshard_after_forward": False} if args.no_reshard_after_forward else {}
    if args.cpu_offload:
        # pinned memory needs a GPU (torch 2.13: "Cannot access accelerator device when none is available")
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    if args.cpu_offload:
        model.to_empty(device="cpu")
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=args.foreach or None)

    gen = torch.Generator().manual_seed(1234 + rank)
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
