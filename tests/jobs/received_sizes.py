"""Sizes a rank receives from its peers, each sizing the next call: a broadcast value, an all-gather of
sizes, counts exchanged by an all-to-all (as MoE layers and TorchRec's KJT all-to-alls do), a P2P count.

Exercises what a rank cannot know alone: every call after the first of each pair below is sized by
values the rank received in it. This is an ordinary user script: it never imports meshscope.

Launch (world even, >= 2; tested at 2)::

    torchrun --nproc-per-node 2 tests/jobs/received_sizes.py [--steps 2] [--check 0]

Per step, rank r of world W, H = --hidden 4 (float32, 16 B a row), all on the world group, in this order
(each numbered pair in a function of its own):

1. ``broadcast`` of an int64 [1] from rank 0 (8 B): rank 0 holds n = 5, every other rank r + 1 before
   it; then ``all_reduce`` of float32 [n] = [5] (20 B) on every rank.
2. ``all_gather`` of an int64 [1] holding m_r = 2 + 3r (8 B in, 8W out); then ``all_gather_into_tensor``
   of float32 [max m, H] padded, max m = 2 + 3(W - 1): (2 + 3(W - 1)) * 16 B in, W times that out
   (world 2: 80 B in, 160 B out).
3. ``all_to_all_single`` of int64 [W], even splits (8W B in and out): rank r sends c(r, j) = 1 + r + 2j to
   rank j and receives c(j, r) = 1 + j + 2r from it; then ``all_to_all_single`` of float32 rows with
   input splits [c(r, j)]_j and output splits [c(j, r)]_j. World 2: rank 0 sends [1, 3] rows and
   receives [1, 2]; rank 1 sends [2, 4] and receives [3, 4].
4. Ranks 2i send rank 2i + 1 an int64 [1] holding k = 6 + 2i (``send``, 8 B), then float32 [k] (4k B);
   rank 2i + 1 receives the count into an int64 [1] and the rows into a buffer of that many (``recv``,
   24 B at world 2).

With ``--check R`` rank R checks each value it received against the above (the broadcast 5, the sizes
[2 + 3j]_j, the counts [1 + j + 2R]_j, the P2P count 6 + R - 1) and exits 1 at the first that differs,
as a library that trusts its peers' counts fails on wrong ones (TorchRec's KJT all-to-alls, fbgemm).

=> 8 calls a step on even ranks (broadcast, all_reduce, all_gather x2, all_to_all x2, send x2) and on odd
ranks (the same with recv x2); then one SGD step of a local parameter (no collective).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hidden", type=int, default=4)
    p.add_argument("--check", type=int, default=None, help="this rank checks every value it received")
    return p.parse_args()


CHECK = None


def check(rank, what, got, want):
    if rank == CHECK and got != want:
        sys.exit("rank %d: %s received %r, not %r" % (rank, what, got, want))


def broadcast_sized(rank):
    n = torch.tensor([5 if rank == 0 else rank + 1])
    dist.broadcast(n, src=0)
    check(rank, "broadcast", n.item(), 5)
    out = torch.ones(int(n.item()))
    dist.all_reduce(out)
    return out.sum()


def gathered_sizes(rank, world, hidden):
    mine = 2 + 3 * rank
    sizes = torch.tensor([mine])
    gathered = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(gathered, sizes)
    check(rank, "all_gather", [int(s.item()) for s in gathered], [2 + 3 * j for j in range(world)])
    longest = max(int(s.item()) for s in gathered)
    padded = torch.zeros(longest, hidden)
    padded[:mine] = 1.0
    out = torch.empty(world * longest, hidden)
    dist.all_gather_into_tensor(out, padded)
    return out.sum()


def exchanged_counts(rank, world, hidden):
    send_counts = torch.tensor([1 + rank + 2 * j for j in range(world)])
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    check(rank, "counts", recv_splits, [1 + j + 2 * rank for j in range(world)])
    rows = torch.full((sum(send_splits), hidden), float(rank))
    received = torch.empty(sum(recv_splits), hidden)
    dist.all_to_all_single(received, rows, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    return received


def sent_count(rank):
    if rank % 2 == 0:
        k = 6 + rank
        dist.send(torch.tensor([k]), dst=rank + 1)
        dist.send(torch.ones(k), dst=rank + 1)
        return torch.zeros(())
    k = torch.zeros(1, dtype=torch.long)
    dist.recv(k, src=rank - 1)
    check(rank, "count", k.item(), 6 + rank - 1)
    rows = torch.empty(int(k.item()))
    dist.recv(rows, src=rank - 1)
    return rows.sum()


def main():
    global CHECK
    args = parse_args()
    CHECK = args.check
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or world % 2:
        sys.exit("received_sizes.py needs an even WORLD_SIZE >= 2 (got %d)" % world)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    weight = torch.nn.Parameter(torch.ones(args.hidden))
    opt = torch.optim.SGD([weight], lr=0.01)
    for _ in range(args.steps):
        opt.zero_grad()
        scale = broadcast_sized(rank) + gathered_sizes(rank, world, args.hidden)
        received = exchanged_counts(rank, world, args.hidden)
        scale = scale + sent_count(rank)
        loss = (received @ weight).sum() * 1e-3 + (weight * scale).sum() * 1e-3
        loss.backward()
        opt.step()
    time.sleep(0.5)  # moe_a2a.py's note: gloo's workers free their works before teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
