"""Five ways to wait for a collective: an all-gather each way, a matmul that does not read its output after it,
then a read of the output.

Exercises: where a job waits for a call, which on a GPU is where its stream needs the call. This is an ordinary
user script: it never imports meshscope.

Launch (any world size >= 1)::

    torchrun --nproc-per-node 2 tests/jobs/waits.py --steps 4

Independent facts (torch 2.13 distributed_c10d.py; NCCL's ``Work.wait`` makes the current stream wait for the
call's kernel, ProcessGroupNCCL.cpp ``WorkNCCL::synchronizeStream``), per step, in this order:

* ``sync``: ``all_gather_into_tensor`` without ``async_op``: c10d waits for it before it returns, so the stream
  needs it **before** the matmul after it;
* ``coalesced``: two halves in ``_coalescing_manager(async_ops=False)`` (as Megatron's distributed optimizer
  gathers its parameters): one coalesced call, waited for when the block ends, **before** the matmul;
* ``waited at once``: ``async_op=True``, then ``wait()`` at once: **before** the matmul;
* ``waited late``: ``async_op=True``, ``wait()`` after the matmul: **after** it;
* ``read late``: ``async_op=True``, its output read after the matmul, waited for only at the step's end:
  **after** it.

So 5 all-gathers a step on the world's group, of 4 KiB each per rank (1,024 fp32). Then, where the world has a
rank after it, each even rank sends 4 KiB to the next one, which receives it with ``irecv``, runs a matmul that does
not read it and then waits (``received late``: needed **after** the matmul). Then a Linear's forward and backward
and an SGD step.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

STYLES = ("sync", "coalesced", "waited at once", "waited late", "read late")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64, bias=False, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    square = torch.randn(64, 64, device=device)
    for _ in range(args.steps):
        x = torch.randn(64, 64, device=device)
        reads = []
        for style in STYLES:
            shard = torch.randn(1024, device=device)
            full = torch.empty(1024 * world, device=device)
            handle = None
            if style == "sync":
                dist.all_gather_into_tensor(full, shard)
            elif style == "coalesced":
                with _coalescing_manager(async_ops=False):
                    dist.all_gather_into_tensor(full[: 512 * world], shard[:512])
                    dist.all_gather_into_tensor(full[512 * world:], shard[512:])
            else:
                handle = dist.all_gather_into_tensor(full, shard, async_op=True)
                if style == "waited at once":
                    handle.wait()
            x = x @ square  # reads neither the shard nor the gathered output
            if style == "waited late":
                handle.wait()
            reads.append(full.sum())
            if style == "read late":
                unwaited = handle  # waited for at the step's end, after its read: dropped unwaited, gloo
                # aborted the job (torch 2.13, "terminate called without an active exception")
        rank = dist.get_rank()
        message = torch.randn(1024, device=device)
        if rank % 2 == 0 and rank + 1 < world:
            dist.send(message, rank + 1)
        elif rank % 2 == 1:
            received = dist.irecv(message, rank - 1)
            x = x @ square  # reads nothing received
            received.wait()
        reads.append(message.sum())
        loss = model(x).sum() + torch.stack(reads).sum()
        unwaited.wait()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
