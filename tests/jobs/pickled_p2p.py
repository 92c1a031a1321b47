"""Two pipeline stages that tell each other their shapes in a pickle, as Colossal-AI 0.5.0's pipeline P2P does.

Exercises: P2P messages whose size is the value an earlier P2P message carried, in both directions of a
pipeline. Colossal-AI 0.5.0 sends a stage's metadata (its tensors' shapes, dtypes, ``requires_grad``) as
a pickled Python object in two ``dist.batch_isend_irecv`` calls on the pair's group, peers named by global
rank: first an int64 tensor of one element holding the pickle's length, then a uint8 tensor of the
pickle's bytes, sized on the receiver from what the first delivered; the receiver unpickles it and
allocates from it the tensors it then receives; a stage that both sends and receives puts its send and
its receive in one batch, sends first (``colossalai/pipeline/p2p.py``: ``_send_recv_serialization_object``,
``_batch_send_recv_tensor``, ``_communicate``; its receive buffers are ``torch.empty``). torch's own
``send_object_list`` / ``recv_object_list`` do the like with plain ``send`` / ``recv``; this is not them.
Here each of the 2 stages is one ``Linear(H, H, bias=False)`` whose output is summed over the stage's T
tensor-parallel ranks (Megatron's "forward: all-reduce, backward: identity"); the stages run one forward
one backward (1F1B, as Colossal-AI's ``OneForwardOneBackwardSchedule`` at pp 2: stage 0 sends microbatch
m's activation in the batch that receives microbatch m - 1's gradient) over M microbatches of 2 + m rows
(m = 0..M-1); stage 1's loss is its output's mean square. Each activation and each gradient follows its
metadata object: the receiver allocates what it receives from the unpickled shape, so a stage that did not
get the sender's bytes cannot go on. This is an ordinary user script: it never imports meshscope.

Launch (world = 2 x T, rank r = p * T + t: stage p, tp rank t, as Colossal-AI's ``ProcessGroupMesh`` lays
out pp x tp; 4 by default: pp 2 x tp 2)::

    torchrun --nproc-per-node 4 tests/jobs/pickled_p2p.py [--tp 2] [--microbatches 2] [--steps 3] [--check]

Independent facts (hand count; defaults --hidden 8, fp32; rows_m = 2 + m), per rank and per step:

* groups, in creation order, every rank creating every one, none named: tp ``[0 .. T-1]``, ``[T .. 2T-1]``,
  then pp ``[t, T + t]`` for each t; every P2P call is on the pp group, to the other stage's rank t;
* a metadata object is ``{"shape": (rows_m, H), "dtype": "float32", "requires_grad": bool, "microbatch": m}``
  pickled by ``pickle.dumps`` at protocol 4: 80 bytes whatever m and the flag (integers below 256 are one
  BININT1 each, a bool one opcode), so each object is a message of 8 B (int64[1]) then one of 80 B (uint8);
  an activation or a gradient of microbatch m is rows_m x H fp32 (64 B, 96 B);
* stage 0 (M = 2, in order): 1 all_reduce on tp (64 B); 3 sends (8, 80, 64 B); 1 all_reduce (96 B); 3
  batches each of a send and a receive: (8, 8), (80, 80), (96, 64) B; 3 receives (8, 80, 96 B);
* stage 1 (in order): 3 receives (8, 80, 64 B); 1 all_reduce on tp (64 B); 3 batches each of a send and a
  receive: (8, 8), (80, 80), (64, 96) B; 1 all_reduce (96 B); 3 sends (8, 80, 96 B);
* so every rank issues M all_reduces, 3M sends and 3M receives a step (2, 6 and 6 at M = 2), and one SGD
  step, which issues none; every batch_isend_irecv's ops are ledger calls of their own.

``--check`` makes a rank exit 1 with a one-line error where a metadata object it unpickled is not the one
the sender built (its microbatch index, its shape), as a real framework would fail later.
"""

import argparse
import io
import os
import pickle
import time

import torch
import torch.distributed as dist
from torch import nn


class _SumOverTP(torch.autograd.Function):
    """forward: all-reduce over tp, backward: identity (Megatron's ``_ReduceFromModelParallelRegion``)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def send_recv_object(obj, peer, receive, group, device):
    """Send `obj` to `peer` (None: nothing) and/or receive one from it, as Colossal-AI 0.5.0's
    ``_send_recv_serialization_object``: one batch of the pickles' lengths, then one of their bytes, the
    receive's sized from what the first delivered, each batch sends first, both issued here."""
    ops, data, size = [], None, None
    if obj is not None:
        pickled = pickle.dumps(obj, protocol=4)
        data = torch.frombuffer(bytearray(pickled), dtype=torch.uint8).to(device)
        ops.append(dist.P2POp(dist.isend, torch.tensor([len(pickled)], dtype=torch.long, device=device), peer, group))
    if receive:
        size = torch.empty(1, dtype=torch.long, device=device)
        ops.append(dist.P2POp(dist.irecv, size, peer, group))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    ops, received = [], None
    if data is not None:
        ops.append(dist.P2POp(dist.isend, data, peer, group))
    if receive:
        received = torch.empty(size.item(), dtype=torch.uint8, device=device)
        ops.append(dist.P2POp(dist.irecv, received, peer, group))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return pickle.Unpickler(io.BytesIO(received.cpu().numpy().tobytes())).load() if receive else None


def send_recv(tensor, sent, received, peer, group, device, hidden=None):
    """Send `tensor` of microbatch `sent` (None: nothing) and/or receive one of microbatch `received` (None:
    nothing), each after its metadata, a send and a receive in one batch (Colossal-AI's ``_communicate``);
    `hidden`: the width a received shape must have (``--check``)."""
    meta = None
    if tensor is not None:
        meta = {"shape": tuple(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
                "requires_grad": tensor.requires_grad, "microbatch": sent}
    got = send_recv_object(meta, peer, received is not None, group, device)
    ops, buffer = [], None
    if tensor is not None:
        ops.append(dist.P2POp(dist.isend, tensor.detach().contiguous(), peer, group))
    if received is not None:
        if hidden and (got["microbatch"], got["shape"]) != (received, (2 + received, hidden)):
            raise SystemExit(f"rank {dist.get_rank()} received metadata {got} for microbatch {received}")
        buffer = torch.empty(got["shape"], dtype=getattr(torch, got["dtype"]), device=device)
        ops.append(dist.P2POp(dist.irecv, buffer, peer, group))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return buffer


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    T, M, H = args.tp, args.microbatches, args.hidden
    if world != 2 * T:
        raise SystemExit(f"pickled_p2p.py runs 2 pipeline stages x --tp {T}: a world of {2 * T}, not {world}")

    tp_groups = [dist.new_group(list(range(q * T, (q + 1) * T))) for q in range(2)]
    pp_groups = [dist.new_group([t, T + t]) for t in range(T)]
    stage, t = divmod(rank, T)
    tp, pp = tp_groups[stage], pp_groups[t]
    peer = rank + T if stage == 0 else rank - T

    def exchange(tensor, sent, received):
        return send_recv(tensor, sent, received, peer, pp, device, H if args.check else None)

    torch.manual_seed(stage)  # the stages differ; a stage's tp ranks start alike
    layer = nn.Linear(H, H, bias=False).to(device)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1234)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        if stage == 0:
            outputs = []
            for m in range(M):  # forward m; its activation goes in the batch that brings m - 1's gradient
                y = _SumOverTP.apply(layer(torch.randn(2 + m, H, generator=gen).to(device)), tp)
                outputs.append(y)
                grad = exchange(y, m, m - 1 if m else None)
                if m:
                    outputs[m - 1].backward(grad)
            outputs[-1].backward(exchange(None, None, M - 1))
        else:
            x, grad = exchange(None, None, 0), None
            for m in range(M):  # the gradient of m - 1 goes in the batch that brings m's activation
                if m:
                    x = exchange(grad, m - 1, m)
                x.requires_grad_(True)
                _SumOverTP.apply(layer(x), tp).square().mean().backward()
                grad = x.grad
            exchange(grad, M - 1, None)
        opt.step()
    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # gloo's teardown race on torch 2.13 (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
