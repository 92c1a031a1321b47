"""accelerate job: the training loop of accelerate's README, an ``Accelerator`` around a plain torch MLP.

``Accelerator()`` initialises the process group from torchrun's environment (gloo on a CPU-only torch,
nccl where CUDA answers), ``accelerator.prepare`` wraps the model in torch's DDP, the optimizer in its
``AcceleratedOptimizer`` and the DataLoader in its ``DataLoaderShard`` (each rank its slice, the shuffle's
generator synchronised from rank 0); the loop calls ``accelerator.backward``,
``accelerator.clip_grad_norm_``, ``optimizer.step()`` and logs ``accelerator.reduce(loss, "mean")``.
It never imports meshscope. Needs ``pip install accelerate==1.16.0`` (torch 2.13).

Launch::

    torchrun --nproc-per-node 2 tests/jobs/accelerate_loop.py [--steps 4]

Model: Linear(32, 64), ReLU, Linear(64, 32): 4 parameters, 4,192 fp32 (16,768 B); batch 8 per rank.

Independent facts (accelerate 1.16.0, torch 2.13; read from their code and confirmed with a ``dist.*``
wrapper that prints each call's caller), per rank, all on the default group:

* set-up (step 0, phase other): DDP's parameter check (1 all_gather of 8 B, 1 broadcast of 96 B) and its
  broadcast of the parameters (16,768 B); the DataLoader's first iteration broadcasts rank 0's shuffle
  generator state (uint8, 5,056 B: ``synchronize_rng_state``, accelerate/utils/random.py:110, from
  ``DataLoaderShard.__iter__``, data_loader.py:568);
* every step: in backward, DDP's one bucket all_reduce (16,768 B; the clip is local under DDP); after
  ``optimizer.step()``, the logged loss: 1 all_reduce (fp32, 4 B, ``accelerator.reduce``,
  utils/operations.py:862; phase other of the next step);
* step 1 adds DDP's bucket rebuild (2 int32 broadcasts, 20 B and 4 B, forward): accelerate keeps DDP's
  ``find_unused_parameters=False``. So the steady steps are 2 and on (``--steps 4``): 1 all_reduce
  (4 B, other), 1 all_reduce (16,768 B, backward);
* the end: ``accelerator.wait_for_everyone()`` (1 barrier), ``end_training()`` destroys the group.

A fake world (the CUDA path: nccl, DDP with ``device_ids``) equals the gloo trace call for call.
"""

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    return p.parse_args()


def main():
    args = parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.hidden, 2 * args.hidden), nn.ReLU(), nn.Linear(2 * args.hidden, args.hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    n = args.batch * accelerator.num_processes * args.steps
    data = torch.utils.data.TensorDataset(torch.randn(n, args.hidden, generator=gen),
                                          torch.randn(n, args.hidden, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.print(f"step {step}: loss {accelerator.reduce(loss.detach(), 'mean').item():.4f}")
        if step + 1 == args.steps:
            break
    accelerator.wait_for_everyone()
    if not torch.cuda.is_available():
        time.sleep(0.5)  # gloo: tests/jobs/README.md, "Teardown on gloo"
    accelerator.end_training()


if __name__ == "__main__":
    main()
