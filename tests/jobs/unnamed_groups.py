"""TP and DP groups made as picotron makes them: ``new_subgroups_by_enumeration``, with no name.

Exercises: process groups whose creator gives no ``group_desc``. picotron (huggingface/picotron at
59714b1, ``picotron/process_group_manager.py``) lays the ranks out as ``torch.arange(world).view(dp,
pp, cp, tp)`` and creates each axis's groups with one ``dist.new_subgroups_by_enumeration`` call over
the grid's lines, naming none; this job does the same over a ``(dp, tp)`` grid (pp = cp = 1) and
creates only the TP and DP families, TP first. Its model is one row-parallel ``Linear`` (the input's
features split over TP), whose output is summed over TP by picotron's ``ReduceFromModelParallelRegion``
(``tensor_parallel/tp_communications.py``: all-reduce forward, identity backward; Megatron's ``g``);
the weight's gradient is then averaged over DP by hand, outside every module, as picotron's
``DataParallelNaive`` hook does on its ``cp_dp_group``. This is an ordinary user script: it never
imports meshscope.

Launch (world = dp x tp, tp dividing it; 4 by default: tp 2 x dp 2)::

    torchrun --nproc-per-node 4 tests/jobs/unnamed_groups.py [--tp 2] [--steps 3]

Independent facts (hand count; defaults --hidden 8 --batch 2, fp32, world 4), per rank:

* groups, in creation order, every rank creating every one (``new_group`` once per listed group):
  TP ``[0, 1]``, ``[2, 3]`` (the grid's rows: stride 1), then DP ``[0, 2]``, ``[1, 3]`` (its columns:
  stride tp = 2); none has a description;
* every step (step 0 too: creating groups issues no collective), in this order:
  1 all_reduce on the rank's TP group, forward, in module ``row`` (the output: batch 2 x 8 fp32 =
  64 B), then 1 all_reduce on its DP group outside every module (the weight's gradient: 8 x 4 fp32 =
  128 B); SGD issues none.

So a tracer that reads axes from members alone sees two families that each partition the world, of
strides 1 and 2 (sizes 2 and 2): a 2 x 2 mesh whose TP is the inner axis and DP the outer.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


class ReduceFromTP(torch.autograd.Function):
    """forward: all-reduce over TP; backward: identity (picotron's ``ReduceFromModelParallelRegion``)."""

    @staticmethod
    def forward(ctx, x, group):
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class RowParallel(nn.Module):
    """This TP rank's columns of a ``Linear(hidden, hidden, bias=False)``: its slice of the input's features."""

    def __init__(self, hidden, tp, tp_rank, group):
        super().__init__()
        self.group, self.cols = group, slice(tp_rank * hidden // tp, (tp_rank + 1) * hidden // tp)
        self.weight = nn.Parameter(torch.randn(hidden, hidden // tp) / hidden ** 0.5)

    def forward(self, x):
        return ReduceFromTP.apply(x[:, self.cols] @ self.weight.t(), self.group)


class Model(nn.Module):
    def __init__(self, hidden, tp, tp_rank, group):
        super().__init__()
        self.row = RowParallel(hidden, tp, tp_rank, group)

    def forward(self, x):
        return self.row(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--batch", type=int, default=2)
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % args.tp or args.hidden % args.tp:
        raise SystemExit(f"unnamed_groups.py needs --tp {args.tp} to divide the world ({world}) and --hidden "
                         f"({args.hidden})")
    tp, dp = args.tp, world // args.tp

    # picotron's layout, pp = cp = 1: a (dp, tp) grid; each family one enumeration, no group_desc
    grid = torch.arange(world).view(dp, tp)
    tp_group, _ = dist.new_subgroups_by_enumeration([grid[d, :].tolist() for d in range(dp)])
    dp_group, _ = dist.new_subgroups_by_enumeration([grid[:, t].tolist() for t in range(tp)])
    dp_rank, tp_rank = divmod(rank, tp)

    torch.manual_seed(tp_rank)  # the TP shards differ; DP replicas start alike
    model = Model(args.hidden, tp, tp_rank, tp_group).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234 + dp_rank)  # TP ranks of one DP replica see the same batch
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        grad = model.row.weight.grad
        dist.all_reduce(grad, group=dp_group)  # averaged by hand over DP, outside every module
        grad /= dp
        opt.step()
    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # gloo's teardown race on torch 2.13 (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
