"""DDP that resumes from a snapshot, as pytorch/examples' ddp-tutorial-series/multigpu_torchrun.py does.

Exercises: files a job keeps between runs. At its start every rank loads ``--snapshot`` when it
exists (``torch.load``) and resumes at the epoch it names; rank 0 saves it (``torch.save``) after
every epoch. Every rank reads its samples from ``--data`` (a tensor file made before the run) and, at
its end, appends one line to ``--history`` (a file kept across runs). This is an ordinary user
script: it never imports meshscope.

Launch (any world size; make the data first)::

    python -c "import torch; torch.save(torch.randn(64, 21), 'data.pt')"
    torchrun --nproc-per-node 4 tests/jobs/snapshot_resume.py --data data.pt [--epochs 2] [--batch 4]

Independent facts (a fresh start: no ``--snapshot`` file before the run; defaults --epochs 2
--batch 4; ``--data`` of N rows, each 20 inputs and 1 target):

* The model is one ``Linear(20, 1)`` (weight 20 + bias 1 = 84 B), so DDP keeps one gradient bucket.
* Construction, every rank: 1 ``allgather`` + 1 ``broadcast`` (``_verify_params_across_processes``),
  then 1 ``broadcast`` of the 84 B of parameters from rank 0 (``_sync_module_states``).
* Rank r trains on rows r, r + W, r + 2W, ... (W the world size): ceil(N / W) rows in batches of
  ``--batch``, so B = ceil(ceil(N / W) / batch) batches per epoch, each **1 gradient all-reduce** of
  84 B, then one ``optimizer.step()``. At the second batch's forward DDP rebuilds its bucket and rank 0
  broadcasts the layout: **2 broadcasts**, once.
* Totals, per rank: all_reduce = epochs * B; broadcast 2 + 2; allgather 1. With N = 64, W = 4 and the
  defaults: B = 4, **8 all-reduces** over 8 steps.
* A rank that finds a snapshot saved after epoch e starts at epoch e + 1: after a whole earlier run
  (e = epochs - 1) it issues no all-reduce at all, only DDP's construction.
"""

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a tensor file of N x 21 floats (20 inputs, 1 target)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--snapshot", default="snapshot.pt")
    p.add_argument("--history", default=None, help="a text file each rank appends one line to at its end")
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


def main():
    args = parse_args()
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Linear(20, 1).to(device)
    first_epoch = 0
    if os.path.exists(args.snapshot):
        snapshot = torch.load(args.snapshot, map_location=device)
        model.load_state_dict(snapshot["MODEL_STATE"])
        first_epoch = snapshot["EPOCHS_RUN"] + 1
    print(f"rank {rank}: starting at epoch {first_epoch}")
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    rows = torch.load(args.data)[rank::world]
    batches = math.ceil(len(rows) / args.batch)
    for epoch in range(first_epoch, args.epochs):
        for b in range(batches):
            batch = rows[b * args.batch:(b + 1) * args.batch].to(device)
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(batch[:, :20]), batch[:, 20:])
            loss.backward()
            opt.step()
        if rank == 0:
            torch.save({"MODEL_STATE": model.state_dict(), "EPOCHS_RUN": epoch}, args.snapshot)

    if args.history:
        with open(args.history, "a") as history:
            history.write(f"rank {rank}: epochs {first_epoch}..{args.epochs - 1}\n")
    # torch 2.13 + gloo: let gloo's workers free their finished works before teardown (tests/jobs/README.md)
    if dist.get_backend() == "gloo":
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
