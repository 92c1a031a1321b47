"""A pipeline laid out as picotron lays it out: unnamed groups over a (dp, pp, tp) grid, P2P on the default group.

Exercises: point-to-point calls on the default group between pipeline stages, each naming its peer by
global rank, in a job whose groups have no name. picotron (huggingface/picotron at 59714b1) builds its
six families with ``dist.new_subgroups_by_enumeration`` over ``torch.arange(world).view(dp, pp, cp,
tp)`` (``picotron/process_group_manager.py:18-23``, in the order tp, cp, pp, dp, cp_dp, pp_dp, none
named); its stages exchange activations and gradients with one ``dist.P2POp`` per
``dist.batch_isend_irecv``, with no group, to the global ``pp_prev_rank`` / ``pp_next_rank``
(``pipeline_parallel/pp_communications.py:8-29``), all forwards then all backwards (AFAB,
``pipeline_parallel.py:77``); the last stage then sums the loss over ``cp_dp_group``
(``utils.py:94-98``), and the gradients are summed over it only where it holds more than one rank
(``train.py:192``: no ``DataParallelBucket`` at dp 1). This job does the same with cp = 1, so its six families are
picotron's at those sizes (cp is 1-rank groups, cp_dp is dp); its tp ranks hold the same stage whole
and issue no collective of their own (picotron's would all-reduce over tp), each exchanging with the
same tp rank of the next stage, as picotron's do. Each stage is one ``Linear(H, H, bias=False)``; the
loss is the last stage's output's mean square. This is an ordinary user script: it never imports
meshscope.

Launch (world = dp x pp x tp, pp >= 2; 4 by default: pp 2 x dp 2)::

    torchrun --nproc-per-node 4 tests/jobs/picotron_pipeline.py [--pp 2] [--tp 1] [--microbatches 2] [--steps 3]

Independent facts (hand count; defaults --hidden 8 --batch 2, fp32; S = pp stages, T = tp,
M = --microbatches), per rank r = (d * S + p) * T + t and per step (step 0 too: creating groups issues
no collective):

* groups, in creation order, every rank creating every one: tp ``[(d*S + p)*T, ... + T - 1]``, cp
  ``[r]`` for each r, pp ``[d*S*T + t, ... + T, ...]`` (S ranks of stride T), dp (dp ranks of stride
  S*T), cp_dp (= dp's again), pp_dp (dp * S ranks of stride T, one per t);
* first stage (p = 0): M sends to r + T (activations), then M receives from r + T (gradients);
* middle stage (0 < p < S - 1): M receives from r - T and M sends to r + T, then M receives from
  r + T and M sends to r - T: twice an end's P2P;
* last stage (p = S - 1): M receives from r - T, then M sends to r - T;
* every stage where dp > 1, after its backwards: 1 all_reduce of its weight's gradient (H x H fp32 =
  256 B) on its cp_dp group;
* then on the last stage 1 all_reduce of the loss (fp32[1], 4 B) on its cp_dp group (1-rank at dp 1);
  then one SGD step on every stage, which issues none;
* every P2P message is one fp32 [batch, H] tensor (64 B), each on the default group.

So with pp 4 the last stage's ledger is not a middle stage's (half its P2P, and the loss all-reduce),
whatever the parity of its global rank: at tp 3 x pp 4, rank 9 (last stage) and rank 3 (stage 1) are
both odd, and first of their tp, cp and dp groups only.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def communicate(tensor, peer, send):
    """One P2P op in its own batch, to a global rank on the default group (picotron's ``pipeline_communicate``)."""
    op = dist.P2POp(dist.isend if send else dist.irecv, tensor, peer)
    for req in dist.batch_isend_irecv([op]):
        req.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=2)
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
    S, T = args.pp, args.tp
    if S < 2 or world % (S * T):
        raise SystemExit(f"picotron_pipeline.py needs --pp {S} (2 or more) x --tp {T} to divide the world ({world})")
    dp = world // (S * T)

    # picotron's six families at cp = 1, in its order, none named (process_group_manager.py:18-23)
    grid = torch.arange(world).view(dp, S, 1, T)
    D, P, C, Tr = range(dp), range(S), range(1), range(T)
    dist.new_subgroups_by_enumeration([grid[d, q, c, :].tolist() for d in D for q in P for c in C])  # tp
    dist.new_subgroups_by_enumeration([grid[d, q, :, t].tolist() for d in D for q in P for t in Tr])  # cp
    dist.new_subgroups_by_enumeration([grid[d, :, c, t].tolist() for d in D for c in C for t in Tr])  # pp
    dist.new_subgroups_by_enumeration([grid[:, q, c, t].tolist() for q in P for c in C for t in Tr])  # dp
    cp_dp, _ = dist.new_subgroups_by_enumeration([grid[:, q, :, t].flatten().tolist() for q in P for t in Tr])
    dist.new_subgroups_by_enumeration([grid[:, :, c, t].flatten().tolist() for c in C for t in Tr])  # pp_dp
    d, stage = rank // (S * T), rank // T % S
    first, last = stage == 0, stage == S - 1

    torch.manual_seed(stage)  # the stages differ; DP replicas start alike
    layer = nn.Linear(args.hidden, args.hidden, bias=False).to(device)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234 + d)
    shape = (args.batch, args.hidden)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        inputs, outputs, loss_sum = [], [], 0.0
        for _ in range(args.microbatches):  # all forwards
            x = torch.randn(*shape, generator=gen).to(device)
            if not first:
                communicate(x, rank - T, send=False)
                x.requires_grad_(True)
            y = layer(x)
            if last:
                y = y.square().mean()
                loss_sum += y.item() / args.microbatches
            else:
                communicate(y.detach(), rank + T, send=True)
            inputs.append(x)
            outputs.append(y)
        for x, y in zip(inputs, outputs):  # all backwards, in the forwards' order
            grad = None
            if not last:
                grad = torch.empty(*shape, device=device)
                communicate(grad, rank + T, send=False)
            y.backward(grad)
            if not first:
                communicate(x.grad, rank - T, send=True)
        if dp > 1:
            dist.all_reduce(layer.weight.grad, group=cp_dp)
        if last:
            dist.all_reduce(torch.tensor([loss_sum], device=device), group=cp_dp)
        opt.step()
    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # gloo's teardown race on torch 2.13 (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
