"""DDP job: DistributedDataParallel over a bias-free MLP with one gradient bucket per layer.

Exercises: torch.nn.parallel.DistributedDataParallel with a small
``bucket_cap_mb`` so that the gradient all-reduce runs as several buckets.
This is an ordinary user script: it never imports meshscope.

Launch (any world size >= 1)::

    torchrun --nproc-per-node 4 tests/jobs/ddp.py
    torchrun --nproc-per-node 2 tests/jobs/ddp.py --steps 5 --layers 6

Independent facts (defaults: --layers 4 --hidden 256 --bucket-cap-mb 0.2, fp32):

* The model is ``--layers`` ``Linear(hidden, hidden, bias=False)`` layers
  with ReLU between them. Each weight is 256*256*4 B = 256 KiB (262144 B),
  larger than the 0.2 MiB (209715 B) bucket cap, and there are no biases. DDP
  closes a bucket as soon as it holds >= cap bytes, so every weight gets its
  own bucket: **buckets = --layers = 4** after the rebuild
  (``ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"] == "262144, 262144,
  262144, 262144"``, in bytes; before the rebuild ``bucket_sizes == "1048576"``).
* Construction (before the first forward), every rank: 1 ``c10d::allgather_``
  + 1 ``c10d::broadcast_`` (``_verify_params_across_processes``), then
  1 ``c10d::broadcast_`` of the 1 MiB of parameters from rank 0
  (``_sync_module_states``; one coalesced broadcast, far under 250 MiB).
* Step 1 (iteration 0): with ``find_unused_parameters=False`` and
  ``static_graph=False`` torch puts every parameter in ONE bucket, so step 1
  has **1 gradient all-reduce** (all 4 weights, 1 MiB).
* Step 2: at the start of its forward the reducer rebuilds the buckets in
  gradient-ready order and rank 0 broadcasts the layout: **2
  ``c10d::broadcast_``** (small int64 tensors), then **4 gradient
  all-reduces** (one per bucket, 256 KiB each, reverse layer order: layer 3,
  2, 1, 0).
* Steps 3..N: **4 gradient all-reduces per step**, nothing else. All
  collectives are over the whole world (one group of size WORLD_SIZE).
* No buffers (``broadcast_buffers`` sends nothing per step); one
  ``optimizer.step()`` (SGD) per iteration.
* Totals with --steps 3, per rank: allreduce 1 + 4 + 4 = 9, broadcast 2 + 2 = 4,
  allgather 1. In general: allreduce = 1 + 4*(steps-1) (with --layers L:
  1 + L*(steps-1)).

``--slow-rank R --slow-in forward|data|backward|gpu --slow-ms MS`` plants a delay on
rank R once per step (`delays.py`; forward, backward and gpu in ``net.2``, the
second Linear): the calls are unchanged, rank R's buckets come late (with
``gpu``, late on its GPU only: a kernel before them).

Measured on torch 2.13 CPU/gloo at world 2 and 4 with a TorchDispatchMode
counter keyed on optimizer step hooks (init | step1 | step2 | step3):
init = allgather_ 1, broadcast_ 2; step1 = allreduce_ 1; step2 = broadcast_ 2,
allreduce_ 4; step3 = allreduce_ 4. Pass ``--print-buckets`` to print DDP's
own logging data (rank 0) as a cross-check.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import delays


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bucket-cap-mb", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--print-buckets", action="store_true")
    p.add_argument("--static-graph", action="store_true")
    delays.add_arguments(p, module="net.2")
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
    def __init__(self, hidden, layers):
        super().__init__()
        mods = []
        for i in range(layers):
            mods.append(nn.Linear(hidden, hidden, bias=False))
            if i < layers - 1:
                mods.append(nn.ReLU())
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


def main():
    args = parse_args()
    device = setup()
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = MLP(args.hidden, args.layers).to(device)
    delay = delays.Delay(args, rank)
    delay.attach(model)
    ddp = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb,
        static_graph=args.static_graph,
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    gen = torch.Generator().manual_seed(1234 + rank)
    for _ in range(args.steps):
        delay.next_step()
        delay.data()
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        y = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    delay.report()

    if args.print_buckets and rank == 0:
        data = ddp._get_ddp_logging_data()
        print(
            "ddp bucket_sizes=%s rebuilt_bucket_sizes=%s"
            % (data.get("bucket_sizes"), data.get("rebuilt_bucket_sizes"))
        )
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
