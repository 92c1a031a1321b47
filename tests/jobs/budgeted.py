"""A job for communication budgets: torch's test Transformer with TP on "tp" and FSDP2 (bf16
reduce) on "dp", a loss logged over dp, and its own logging groups.

Exercises: ``Transformer.parallelize`` (``use_seq_parallel=False``), ``fully_shard`` of every block
and of the root with ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``, one ``all_reduce`` of
the loss per step on a logging group of the dp axis, and logging groups created with ``new_group``
axis by axis in the order ``LOG_AXES``. Each feature sits on one line, so that a regression is a
one-line change (tests/test_budget.py plants them). This is an ordinary user script: it never
imports meshscope.

Launch (WORLD_SIZE = dp * tp; bf16 reduce-scatters need a backend that has them: the fake world,
or NCCL)::

    meshscope trace --fake-world 4 -- tests/jobs/budgeted.py --layers 2 --steps 4

Independent facts, per rank per steady step (step >= 2), L = --layers, as tests/jobs/transformer.py
counts them (its docstring) plus: dp reduce-scatters in bfloat16 (the policy's reduce_dtype, L + 1
of them) and one float32 all_reduce of the loss on the logging dp group (axis ``dp``). Logging
groups: one per dp group, then one per tp group, after the mesh's own.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer, TransformerBlock

LOG_AXES = ("dp", "tp")
"""The order the logging groups are created in: every rank creates every group, in this order."""


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    return p.parse_args()


def logging_groups(dp: int, tp: int) -> dict:
    """This rank's group of each logging axis (the (dp, tp) mesh's rows and columns), every group created
    on every rank."""
    members = {"dp": [[d * tp + t for d in range(dp)] for t in range(tp)],
               "tp": [[d * tp + t for t in range(tp)] for d in range(dp)]}
    mine = {}
    for axis in LOG_AXES:
        for ranks in members[axis]:
            group = dist.new_group(ranks, group_desc=axis)  # named after its axis, as a mesh dim is
            if dist.get_rank() in ranks:
                mine[axis] = group
    return mine


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp = args.tp
    if tp < 1 or world % tp or args.heads % tp or args.vocab % tp or args.seq % tp:
        sys.exit(f"budgeted.py needs WORLD_SIZE = dp * tp with --tp dividing --heads, --vocab and --seq; got "
                 f"WORLD_SIZE={world}, --tp {tp}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else \
        torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    log = logging_groups(world // tp, tp)

    torch.manual_seed(0)
    model = Transformer(ModelArgs(n_layers=args.layers, vocab_size=args.vocab, max_seq_len=args.seq, dim=args.dim,
                                  n_heads=args.heads, dropout_p=0.0)).to(device)
    model = Transformer.parallelize(model, mesh["tp"], use_seq_parallel=False, local_output_for_attn=True)
    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)
    for m in model.modules():
        if isinstance(m, TransformerBlock):
            fully_shard(m, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(1234 + mesh["dp"].get_local_rank())
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(tokens).reshape(-1, args.vocab), tokens.reshape(-1))
        loss.backward()
        logged = loss.detach().clone()
        dist.all_reduce(logged, group=log["dp"])
        opt.step()

    if dist.get_backend() == "gloo":  # tests/jobs/README.md, "Teardown on gloo"
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
