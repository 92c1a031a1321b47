"""MoE job: token dispatch/combine with an UNEVEN autograd all_to_all_single.

Exercises: expert parallelism the way hand-written MoE layers do it. World
size = expert-parallel size, one expert (a local ``nn.Linear``) per rank.
Each step, every rank routes its tokens with a fixed, skewed rule, exchanges
the per-expert token counts with a plain ``dist.all_to_all_single`` of an
int64 tensor, then dispatches the tokens and combines the expert outputs with
``torch.distributed.nn.functional.all_to_all_single`` (autograd-aware) using
``input_split_sizes`` / ``output_split_sizes``. The tokens require grad, so
backward runs the two mirror all-to-alls. This is an ordinary user script:
it never imports meshscope.

Launch (world >= 2; tested at 2 and 4)::

    torchrun --nproc-per-node 2 tests/jobs/moe_a2a.py
    torchrun --nproc-per-node 4 tests/jobs/moe_a2a.py --steps 5 --hot-weight 7

Routing (deterministic, identical on every rank and every step): with
E = WORLD_SIZE experts the pattern is ``[0] * hot_weight + [1, 2, ..., E-1]``
(hot_weight = --hot-weight = 7), and token i goes to expert
``pattern[i % len(pattern)]``; every rank has T = --repeats * len(pattern)
tokens (--repeats 2). Expert 0 (rank 0) is the hot one: a fixed 7:1 skew.

Resulting splits (tokens, dim 0; each token is --hidden 16 fp32 = 64 B):

* World 2: T = 16 per rank. Every rank sends [14, 2] (14 to rank 0, 2 to
  rank 1). Rank 0 receives [14, 14] = 28 tokens, rank 1 receives [2, 2] = 4.
* World 4: T = 20 per rank. Every rank sends [14, 2, 2, 2]. Rank 0
  receives [14, 14, 14, 14] = 56 tokens; ranks 1-3 receive [2, 2, 2, 2] = 8.

Independent facts, per rank per step, in this order, all over the world group:

1. counts exchange (forward, no autograd): ``dist.all_to_all_single`` of an
   int64 [E] tensor, even splits (1 element to/from each rank);
   rank r's output = [count of expert r on each rank] = [14]*E on rank 0,
   [2]*E elsewhere.
2. dispatch (forward): all_to_all_single of tokens [T, H] with
   input_split_sizes = send counts, output_split_sizes = received counts.
3. combine (forward): all_to_all_single of expert outputs with the splits
   swapped (input = received counts, output = send counts).
4. combine backward: all_to_all_single of the output grads, splits as in (2).
5. dispatch backward: all_to_all_single of the token grads, splits as in (3).

With ``--routing learned`` each token goes to the argmax of a router (a Linear of hidden -> E, its
own seed per rank) over that step's random tokens: the same 5 calls per step, their splits changing
from step to step and rank to rank with the data.

So **5 all_to_all_single per rank per step** (1 int64 counts + 4 uneven
token exchanges: 2 forward, 2 backward), no all-reduce, no other collective.
World 2, rank 0 sends/receives per step, in tokens: dispatch in [14, 2] out
[14, 14]; combine in [14, 14] out [14, 2]; combine-bwd in [14, 2] out
[14, 14]; dispatch-bwd in [14, 14] out [14, 2]. Rank 1: dispatch in [14, 2]
out [2, 2]; combine in [2, 2] out [14, 2]; combine-bwd in [14, 2] out
[2, 2]; dispatch-bwd in [2, 2] out [14, 2].
Expert parameters are local to their rank (no gradient averaging): one
``optimizer.step()`` (SGD) per step on the local expert only.

Measured on torch 2.13 CPU/gloo at world 2 and 4 with a TorchDispatchMode
counter keyed on optimizer step hooks: each step = ``c10d::alltoall_base_`` x5.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn as nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--hot-weight", type=int, default=7)
    p.add_argument("--routing", choices=("skewed", "learned"), default="skewed",
                   help="skewed: the fixed rule above; learned: a router's top-1 expert per token")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01)
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


def route(num_tokens, num_experts, hot_weight):
    pattern = [0] * hot_weight + list(range(1, num_experts))
    return torch.tensor([pattern[i % len(pattern)] for i in range(num_tokens)])


def moe_forward(x, expert, expert_ids, num_experts):
    # Sort tokens by destination expert (stable, so the order is deterministic).
    order = torch.argsort(expert_ids, stable=True)
    send_counts = torch.bincount(expert_ids, minlength=num_experts)

    # 1. Exchange how many tokens each rank will get (plain, int64).
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_splits = send_counts.tolist()
    recv_splits = recv_counts.tolist()

    # 2. Dispatch: uneven, autograd-aware.
    x_sorted = x[order]
    recv = x.new_empty(sum(recv_splits), x.shape[1])
    recv = dist_fn.all_to_all_single(
        recv, x_sorted, output_split_sizes=recv_splits, input_split_sizes=send_splits
    )

    # Local expert.
    y = expert(recv)

    # 3. Combine: splits swapped.
    back = x.new_empty(sum(send_splits), x.shape[1])
    back = dist_fn.all_to_all_single(
        back, y, output_split_sizes=send_splits, input_split_sizes=recv_splits
    )

    # Undo the sort.
    out = torch.empty_like(back)
    out[order] = back
    return out


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        sys.exit("moe_a2a.py needs WORLD_SIZE >= 2 (one expert per rank; got %d)" % world)
    device = setup()
    rank = dist.get_rank()
    num_experts = world
    num_tokens = args.repeats * (args.hot_weight + num_experts - 1)

    torch.manual_seed(100 + rank)  # each rank owns a different expert
    expert = nn.Linear(args.hidden, args.hidden).to(device)
    opt = torch.optim.SGD(expert.parameters(), lr=args.lr)
    fixed = route(num_tokens, num_experts, args.hot_weight).to(device)
    router = nn.Linear(args.hidden, num_experts).to(device)

    gen = torch.Generator().manual_seed(1234 + rank)
    for _ in range(args.steps):
        x = torch.randn(num_tokens, args.hidden, generator=gen).to(device)
        x.requires_grad_(True)
        y = torch.randn(num_tokens, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        expert_ids = fixed if args.routing == "skewed" else router(x).argmax(dim=-1).detach()
        out = moe_forward(x, expert, expert_ids, num_experts)
        loss = nn.functional.mse_loss(out, y)
        loss.backward()
        opt.step()

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
