"""Blocks of RMSNorm then Linear, bf16, under DDP: a job whose saved activations can be counted by hand
(tests/test_forecast.py). Each block keeps, for backward, its norm's input (the block before's output), one
fp32 reciprocal RMS per row, and the norm's output (the Linear's input); the loss is a plain sum, which keeps
nothing."""

import argparse

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    dist.init_process_group("gloo")
    model = nn.Sequential(*(nn.Sequential(nn.RMSNorm(args.dim), nn.Linear(args.dim, args.dim, bias=False))
                            for _ in range(args.blocks))).to(torch.bfloat16)
    model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        x = torch.randn(args.tokens, args.dim, dtype=torch.bfloat16)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
