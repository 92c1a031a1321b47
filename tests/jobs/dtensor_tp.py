"""DTensor tensor-parallel job: parallelize_module on an MLP over a 1-D "tp" mesh.

Exercises: ``torch.distributed.tensor.parallel.parallelize_module`` with
ColwiseParallel / RowwiseParallel (Megatron-style MLP) on a 1-D DeviceMesh
named ("tp",) spanning the whole world; ``--sequence-parallel`` switches to
the torchtitan sequence-parallel style (LayerNorm under SequenceParallel,
ColwiseParallel(input_layouts=Shard(1)), RowwiseParallel(output_layouts=Shard(1))).
This is an ordinary user script: it never imports meshscope.

Launch (world 2 or 4; any world >= 2 that divides --seq and 4*--hidden)::

    torchrun --nproc-per-node 2 tests/jobs/dtensor_tp.py
    torchrun --nproc-per-node 4 tests/jobs/dtensor_tp.py --sequence-parallel

Model: x[B, S, H] -> LayerNorm(H) -> fc1 Linear(H, 4H) -> GELU -> fc2 Linear(4H, H).
The loss is MSE on the (local) output.
Defaults: --batch 2 --seq 8 --hidden 32 --steps 3, fp32. All collectives are
DTensor functional collectives over the "tp" group (size = WORLD_SIZE).

Independent facts, per rank per step (forward + backward + SGD step):

* Plain TP (default): the LayerNorm is a plain (non-DTensor) module,
  identical on every rank.
  - forward: fc2 (RowwiseParallel, output Replicate) turns its Partial
    output into Replicate: **1 all_reduce** of [B, S, H] = 2*8*32 fp32 (2 KiB);
  - backward: fc1 (ColwiseParallel, input Replicate) gets a Partial
    gradient for its input (the LayerNorm output requires grad):
    **1 all_reduce** of [B, S, H];
  - optimizer: no collective (all TP params have matching-placement grads);
  - **total: all_reduce x2 per step**, no all-gather, no reduce-scatter.
* ``--sequence-parallel``: the input is split on the sequence dim (each rank
  feeds its own S/tp slice of the same global batch; no communication).
  - forward: fc1 input Shard(1) -> Replicate: **1 all_gather** on the
    sequence dim; fc2 output Partial -> Shard(1): **1 reduce_scatter**;
  - backward: the mirror images: fc2 output grad Shard(1) -> Replicate:
    **1 all_gather**; fc1 input grad Partial -> Shard(1): **1 reduce_scatter**;
    the LayerNorm weight and bias (Replicate DTensors fed by a Shard(1)
    input) are left with Partial(sum) grads (no collective in backward);
  - optimizer.step(): SGD adds each Partial LayerNorm grad to its Replicate
    param, so DTensor all-reduces it first: **2 all_reduce** (weight and
    bias, [H] fp32 each) issued INSIDE ``optimizer.step()``;
  - **total: all_gather x2, reduce_scatter x2, all_reduce x2 per step.**
* Setup (before step 1, in ``parallelize_module``): ``distribute_tensor``
  with the default ``src_data_rank=0`` sends rank 0's weights:
  **3 scatter** (fc1.weight Shard(0), fc1.bias Shard(0), fc2.weight Shard(1))
  and **1 broadcast** (fc2.bias, Replicate). SequenceParallel wraps the
  LayerNorm params with ``DTensor.from_local`` (no collective), so the
  setup is the same in both modes.
* The optimizer is ``SGD(foreach=False)`` on purpose: each grad is read once
  per step, so the implicit redistributions inside the step are exactly one
  per Partial grad on CPU and CUDA alike (AdamW would read it several times).

Measured on torch 2.13 CPU/gloo at world 2 and 4 with a TorchDispatchMode
counter (DTensor desugared first, as in CommDebugMode) keyed on optimizer
step hooks: init = ``c10d::scatter_`` 3, ``c10d::broadcast_`` 1; each step =
``_c10d_functional::all_reduce`` 2 (default) or ``all_gather_into_tensor`` 2
+ ``reduce_scatter_tensor`` 2 + ``all_reduce`` 2 (--sequence-parallel).
"""

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--comm-debug", action="store_true",
                   help="print torch's CommDebugMode counts of every step (rank 0)")
    p.add_argument("--sequence-parallel", action="store_true")
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


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or args.seq % world or (4 * args.hidden) % world:
        sys.exit(
            "dtensor_tp.py needs WORLD_SIZE >= 2 dividing --seq and 4*--hidden "
            "(got WORLD_SIZE=%d, seq=%d, hidden=%d)" % (world, args.seq, args.hidden)
        )
    device = setup()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    tp_rank = mesh.get_local_rank("tp")

    torch.manual_seed(0)
    model = MLP(args.hidden).to(device)
    if args.sequence_parallel:
        plan = {
            "norm": SequenceParallel(),
            "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1)),
        }
    else:
        plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    model = parallelize_module(model, mesh, plan)
    # Plain SGD, foreach=False: each gradient is read exactly once per step,
    # on CPU and CUDA alike (this fixes the count of implicit DTensor
    # redistributions inside optimizer.step()).
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, foreach=False)

    # Same data on every TP rank (one data-parallel replica).
    gen = torch.Generator().manual_seed(1234)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.seq, args.hidden, generator=gen)
        y = torch.randn(args.batch, args.seq, args.hidden, generator=gen)
        if args.sequence_parallel:
            # Each rank holds its own slice of the sequence (Shard(1)).
            x = x.chunk(world, dim=1)[tp_rank]
            y = y.chunk(world, dim=1)[tp_rank]
        x, y = x.to(device), y.to(device)
        with CommDebugMode() if args.comm_debug else contextlib.nullcontext() as comm:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        if args.comm_debug and dist.get_rank() == 0:
            # torch's own count of this step's collectives, keyed by the op's name
            counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
            print("comm_debug " + json.dumps(counts), flush=True)

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
