"""``optimizer.step(closure)``: the forward and backward run inside the optimizer's step.

Exercises: a closure, as LBFGS needs and as Lightning's automatic optimisation passes one to every
optimizer (its training step's forward and backward run inside ``step``); a DDP model; and
``ZeroRedundancyOptimizer`` over SGD, an optimizer with collectives of its own that hands the
closure to the optimizer it wraps. The model's ``mix`` layer all-reduces its output in forward (a
functional collective, which has an autograd formula). This is an ordinary user script: it never
imports meshscope.

Launch (world size 2)::

    torchrun --nproc-per-node 2 tests/jobs/closure.py [--steps 4]

Independent facts (hand count; defaults --hidden 16 --batch 4, fp32), per rank, all on the default
group (W = 2), in issue order:

* set-up (step 0, before the first forward, phase other): DDP's ``_verify_params_across_processes``
  (1 all_gather, 1 broadcast) and ``_sync_module_states`` (1 broadcast of the 4 parameters);
* every step, inside ``opt.step(closure)``, in the closure:

  - forward, in ``mix``: 1 all_reduce of its output (4 x 16 fp32 = 256 B);
  - other (in the closure, outside every module): 1 all_reduce of the loss for the log (4 B);
  - backward: 1 all_reduce of ``mix``'s output gradient (256 B) and DDP's gradient all_reduce
    (1 bucket: the 2 x (16 x 16 + 16) parameters, 2,176 B);

* then the optimizer's own calls (phase optimizer): ``ZeroRedundancyOptimizer`` with
  ``parameters_as_bucket_view=True`` broadcasts each rank's bucket of updated parameters from that
  rank, W = 2 broadcasts (rank 0 owns ``fc.weight``, ``fc.bias``: 1,088 B; rank 1 ``out.*``: 1,088 B);
* step 1 also has, at the start of DDP's forward (phase forward, in the root, ``Model``), the bucket
  rebuild's 2 broadcasts (small int64 tensors), as ``ddp.py`` documents.

So per steady step (2 and later): forward 1, other 1, backward 2, optimizer 2; step 0 adds the
set-up's 3, step 1 the rebuild's 2.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


class Mix(nn.Module):
    """Sums its input over the ranks (forward: all_reduce; backward: all_reduce)."""

    def forward(self, x):
        return funcol.all_reduce(x, "sum", dist.group.WORLD)


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.mix = Mix()
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.out(self.mix(self.fc(x)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != 2:
        raise SystemExit(f"closure.py needs a world of 2 ranks (its facts count 2 parameter buckets), got {world}")

    torch.manual_seed(0)
    model = DDP(Model(args.hidden).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01,
                                  parameters_as_bucket_view=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)

        def closure():
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # for the log, outside every module
            loss.backward()
            return loss

        opt.step(closure)
    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # gloo's teardown race on torch 2.13 (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
