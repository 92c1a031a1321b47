"""DDP job with a communication hook of its own: torch's (fp16 compression, Python or built-in; the built-in
all-reduce), or a hand-written one.

This is an ordinary user script: it never imports meshscope.

Launch (any world size >= 1)::

    torchrun --nproc-per-node 2 tests/jobs/ddp_comm_hook.py --hook fp16
    torchrun --nproc-per-node 2 tests/jobs/ddp_comm_hook.py --hook own
    torchrun --nproc-per-node 2 tests/jobs/ddp_comm_hook.py --hook builtin-fp16
    torchrun --nproc-per-node 2 tests/jobs/ddp_comm_hook.py --hook builtin-allreduce
    torchrun --nproc-per-node 2 tests/jobs/ddp_comm_hook.py --hook bf16   # NCCL 2.10+ on CUDA only

Independent facts (--steps 3, one ``Linear(16, 16, bias=False)``: 256 fp32 weights, 1,024 B, one bucket):

* ``--hook fp16``: torch's ``default_hooks.fp16_compress_hook`` (torch 2.13 ddp_comm_hooks/default_hooks.py:
  ``buffer.to(float16).div_(world)``, one ``all_reduce`` of it, then ``fut.value()[0]`` copied back into the
  bucket): **one all_reduce of 256 float16 = 512 B per step**.
* ``--hook bf16``: torch's ``default_hooks.bf16_compress_hook`` (the same with ``bfloat16``), which DDP takes
  from a CUDA build with NCCL 2.10+ only (torch 2.13 nn/parallel/distributed.py ``_check_comm_hook``; a CPU
  build raises): **one all_reduce of 256 bfloat16 = 512 B per step**.
* ``--hook own``: nanotron's pattern (2411b02 optim/gradient_accumulator.py:333-392): the hook all-reduces
  a copy of the bucket (fp32, 1,024 B) asynchronously and returns a future of its own holding the bucket:
  **one all_reduce of 1,024 B float32 per step**.
* ``--hook builtin-fp16``: ``ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)``, torch's
  C++ ``FP16CompressCommHook`` (torch 2.13 csrc/distributed/c10d/default_comm_hooks.cpp:19-42: the bucket
  ``.to(kFloat16)`` divided by the world size, one ``allreduce``, copied back): **one all_reduce of 256
  float16 = 512 B per step**, as ``fp16``.
* ``--hook builtin-allreduce``: ``BuiltinCommHookType.ALLREDUCE``, C++'s ``AllReduceCommHook`` (ibid. 11-17: the
  fp32 bucket divided by the world size, one ``allreduce``): **one all_reduce of 1,024 B per step**.
* The Python hooks run once per step (printed: ``hook ran 3``; the built-in ones run in C++: ``hook ran 0``),
  and the gradient DDP hands the optimizer is the hook's: fp16's is the bucket divided by the world size;
  ``own`` keeps the local gradient.
* The script's ``dist.get_backend()`` is the backend it named (printed: ``backend nccl`` where CUDA is
  available, else ``backend gloo``).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

ran = []
BUILTIN = {"builtin-fp16": dist.BuiltinCommHookType.FP16_COMPRESS,
           "builtin-allreduce": dist.BuiltinCommHookType.ALLREDUCE}


def own_hook(group, bucket):
    ran.append(1)
    dist.all_reduce(bucket.buffer().clone(), group=group, async_op=True)
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def counted_fp16(group, bucket):
    ran.append(1)
    return default_hooks.fp16_compress_hook(group, bucket)


def bf16_compress_hook(group, bucket):  # DDP knows bf16 hooks by this name
    ran.append(1)
    return default_hooks.bf16_compress_hook(group, bucket)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hook", choices=("fp16", "bf16", "own", *BUILTIN), default="fp16")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    print(f"rank {rank} backend {dist.get_backend()}")
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(16, 16, bias=False).to(device))
    if args.hook in BUILTIN:
        ddp._register_builtin_comm_hook(BUILTIN[args.hook])
    else:
        hooks = {"fp16": counted_fp16, "bf16": bf16_compress_hook, "own": own_hook}
        ddp.register_comm_hook(dist.group.WORLD, hooks[args.hook])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        ddp(torch.randn(4, 16, generator=gen).to(device)).sum().backward()
        opt.step()
    print(f"rank {rank} hook ran {len(ran)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
