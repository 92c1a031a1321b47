"""Lightning job: a ``LightningModule`` trained by ``Trainer(strategy="ddp")`` under torchrun.

Exercises what every Lightning 2.6.6 Trainer does on a cluster: it reads torchrun's environment
(``TorchElasticEnvironment``), initialises the process group itself, broadcasts its log directory
with ``broadcast_object_list`` from rank 0, wraps the module in torch's DDP, and runs every training
step's forward and backward inside ``optimizer.step(closure)`` (automatic optimisation); the loss
is logged with ``sync_dist=True``. It never imports meshscope. ``--strategy model_parallel``
trains the same MLP with ``ModelParallelStrategy`` instead: its ``configure_model`` shards the two
layers column- then row-wise over the "tensor_parallel" mesh dim and wraps the model in FSDP2 over
"data_parallel". ``--accelerator cuda`` asks for GPUs (nccl; in a fake world the same calls as
on the CPU).
Needs ``pip install lightning==2.6.6``.

Launch (``devices`` is torchrun's ``LOCAL_WORLD_SIZE``, ``num_nodes`` the rest of the world)::

    torchrun --nproc-per-node 2 tests/jobs/lightning_ddp.py [--steps 3]
    torchrun --nproc-per-node 4 tests/jobs/lightning_ddp.py --strategy model_parallel

Independent facts (Lightning's loops and strategies/ddp.py and torch's DDP, read at 2.6.6 and
torch 2.13; defaults --hidden 32 --batch 8, fp32, DDP), per rank, all on the default group:

* set-up (step 0, phase other): the log directory's ``broadcast_object_list`` (an int64 size, then
  the pickle's bytes), Lightning's barriers, DDP's parameter check (1 all_gather, 1 broadcast) and
  its broadcast of the 2 x (32 x 32 + 32) parameters (8,448 B);
* every step: 1 broadcast of the SIGTERM flag (int64, training_epoch_loop.py:265, phase other); in
  the closure's forward (``training_step`` runs inside the module's forward), ``self.log(...,
  sync_dist=True)``: 1 barrier and 1 all_reduce of the loss (4 B; fabric's ``_sync_ddp``); in
  backward, DDP's 1 gradient bucket (8,448 B);
* step 1 adds DDP's bucket rebuild (2 int32 broadcasts, phase forward).

A fake world equals the gloo trace call for call.
"""

import argparse
import os

import lightning as L
import torch
from torch import nn


class MLP(L.LightningModule):
    def __init__(self, hidden, lr):
        super().__init__()
        self.hidden, self.lr = hidden, lr
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def configure_model(self):
        # ModelParallelStrategy's hook (a no-op under DDP): Megatron-style TP, then FSDP2 over dp.
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(self, self.device_mesh["tensor_parallel"],
                           {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        fully_shard(self, mesh=self.device_mesh["data_parallel"])

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--strategy", choices=["ddp", "model_parallel"], default="ddp")
    p.add_argument("--accelerator", default="cpu", help="Lightning's: cpu (gloo), cuda (nccl), auto")
    return p.parse_args()


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64 * world, args.hidden, generator=gen),
                                          torch.randn(64 * world, args.hidden, generator=gen))
    if args.strategy == "ddp":
        strategy = "ddp"
    else:
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(tensor_parallel_size=2, data_parallel_size=world // 2)
    trainer = L.Trainer(accelerator=args.accelerator, devices=devices, num_nodes=world // devices, strategy=strategy,
                        max_steps=args.steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(MLP(args.hidden, lr=0.01), torch.utils.data.DataLoader(data, batch_size=args.batch))


if __name__ == "__main__":
    main()
