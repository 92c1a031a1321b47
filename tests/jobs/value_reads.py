"""Value reads: a DDP training script that reads tensor values where training scripts do.

Exercises what a script reads back as Python values besides its collectives: an
``all_gather_object`` of each rank's settings, a seed drawn on rank 0, broadcast
and read back with ``.item()``, ``nn.init.trunc_normal_`` on the weights, a
``DataLoader`` over a ``DistributedSampler`` (shuffled), the loss logged with
``loss.item()`` and ``f"{loss:.4f}"``, a grad norm built with
``torch.tensor([p.grad.norm() ...])`` and turned into a ``float``, running
metrics summed with ``dist.all_reduce_coalesced``, a padded gather of each
rank's "hard" examples whose length is a count read back with ``int()``, a
``copy.deepcopy`` of the model and of a 0-dim metric (an EMA copy and the best
loss), and a checkpoint written by rank 0 with ``torch.save``. This is an
ordinary user script: it never imports meshscope.

Launch (world >= 2)::

    torchrun --nproc-per-node 2 tests/jobs/value_reads.py [--steps 3] [--out DIR]

Independent facts (defaults: --steps 3, 64 samples of 16 features, batch 8,
model Linear(16, 32) -> ReLU -> Linear(32, 4): 676 fp32 parameters = 2704 B,
one DDP bucket; every call is over the world group of W ranks), per rank:

* Set-up, in this order (recorded in the first step): ``all_gather_object``
  = 2 all_gather (the int64 size, 8 B in and 8*W out; then the pickled dict,
  35 B in); the seed: 1 broadcast of an int64 [1] (8 B) from rank 0; DDP's
  construction: 1 all_gather (int64, 8 B) and 1 broadcast (int64, 96 B)
  (``_verify_param_shape_across_processes``), then 1 broadcast of the 2704 B
  of parameters (``_sync_module_states``).
* Every step, in this order: 1 all_reduce of the 2704 B bucket (backward);
  1 all_reduce of 8 B (``all_reduce_coalesced`` of two fp32 scalars is one
  call); 1 all_gather of the int64 count (8 B in, 8*W out); 1 all_gather of
  the padded [count, 4] fp32 buffer (every target is finite, so the count is
  the batch: 128 B in, 128*W out). The second step starts with DDP's 2
  bucket-rebuild broadcasts (int32, 20 B and 4 B).
* So 6 + 4 + 6 + 4 = 20 calls per rank with --steps 3, and one SGD
  ``optimizer.step()`` per step.

What it reads back as Python values, per rank: the seed (1 ``int``, after the
broadcast); trunc_normal_'s rejection mask (``mask.any()`` at
torch/nn/init.py:119, at least once per weight: 2); the DataLoader's base
seed (one per epoch) and the sampler's indices; per step: in
``gather_valid`` 1 ``int`` of the count, then W of the gathered counts (both
before the gather they size); 3 on the logging line (``{loss:.4f}``,
``loss.item()``, ``float(norm)``); 1 ``bool`` comparing the loss with the best.
"""

import argparse
import copy
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--out", default=None, help="folder for rank 0's checkpoint (default: none written)")
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


def agree_on_seed(device):
    """Rank 0 rolls the seed; every rank uses the one it broadcast (as torchtitan does)."""
    rolled = torch.randint(0, 2**31 - 1, (1,), dtype=torch.int64).to(device)
    dist.broadcast(rolled, src=0)
    return int(rolled.item())


def gather_valid(y, device):
    """Every rank's valid targets (all finite: every sample here), padded to the longest rank's count."""
    count = int(torch.isfinite(y).all(dim=1).sum())
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([count], dtype=torch.int64, device=device))
    longest = max(int(c) for c in counts)
    mine = torch.zeros(longest, 4, device=device)
    gathered = [torch.empty_like(mine) for _ in counts]
    dist.all_gather(gathered, mine)
    return gathered


def main():
    args = parse_args()
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise SystemExit("value_reads.py needs WORLD_SIZE >= 2")

    settings = [None] * world
    dist.all_gather_object(settings, {"rank": rank, "batch": args.batch})
    torch.manual_seed(agree_on_seed(device))

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (model[0], model[2]):
        nn.init.trunc_normal_(layer.weight, std=0.02, a=-0.04, b=0.04)
    model = model.to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    ema = copy.deepcopy(model)
    running = {"loss": torch.tensor(0.0), "best": torch.tensor(float("inf"))}

    gen = torch.Generator().manual_seed(1234)
    data = TensorDataset(torch.randn(args.samples, 16, generator=gen), torch.randn(args.samples, 4, generator=gen))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        totals = copy.deepcopy(running)  # each epoch's metrics start from the defaults
        for x, y in loader:
            if step == args.steps:
                break
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            per_sample = (ddp(x) - y).pow(2).mean(dim=1)
            loss = per_sample.mean()
            loss.backward()
            norm = torch.tensor([p.grad.norm() for p in model.parameters()]).norm()
            metrics = torch.stack([loss.detach(), torch.tensor(float(len(x)), device=device)])
            dist.all_reduce_coalesced([metrics[:1].clone(), metrics[1:].clone()])
            gather_valid(y, device)
            opt.step()
            line = f"step {step} loss {loss:.4f} ({loss.item():.6f}) grad norm {float(norm):.4f}"
            if rank == 0:
                print(line, flush=True)
            totals["loss"] += loss.detach()
            if loss.detach() < totals["best"]:
                totals["best"] = loss.detach().clone()
            step += 1
        epoch += 1

    ema.load_state_dict(model.state_dict())
    if args.out and rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                   os.path.join(args.out, "checkpoint.pt"))
    if dist.get_backend() == "gloo":  # tests/jobs/README.md: gloo's teardown race
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
