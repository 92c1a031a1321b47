"""torch's test Transformer on a (dp, tp) mesh: TP (optionally sequence parallel) x DDP or FSDP2.

Exercises: ``common_dtensor.Transformer`` (token + position embeddings, ``layers`` blocks of
LayerNorm -> attention (wq, wk, wv, wo, no bias) and LayerNorm -> MLP (w1 [4d, d], GELU, w2
[d, 4d], with biases), a final LayerNorm and an output Linear, tied to the token embedding unless --no-weight-tying),
``Transformer.parallelize(model, mesh["tp"], use_seq_parallel=...)`` when ``--tp`` > 1, then
data parallelism over ``mesh["dp"]``: ``--dp-mode ddp`` is ``DistributedDataParallel(model,
device_mesh=mesh["dp"], bucket_cap_mb=...)``, ``--dp-mode fsdp`` is FSDP2 ``fully_shard`` of
every block and then of the root. This is an ordinary user script: it never imports meshscope.

Launch (WORLD_SIZE = dp * tp)::

    torchrun --nproc-per-node 4 tests/jobs/transformer.py --tp 2 --sequence-parallel --dp-mode fsdp
    torchrun --nproc-per-node 4 tests/jobs/transformer.py --tp 2 --dp-mode ddp --bucket-cap-mb 0.05

Shapes: b = --batch, s = --seq (also ModelArgs.max_seq_len), d = --dim, V = --vocab, L = --layers,
fp32 (4 B); the MLP width is 4d (ModelArgs has no field for it). Dropout 0. With ``--dp-mode ddp``
and ``--tp`` > 1 the script needs ``--no-weight-tying``: torch 2.13's DDP + TP transform
(``_pre_dp_module_transform``) localizes a tied parameter under its first name only, and DDP's
first broadcast then fails on a DTensor / Tensor mix.

Independent facts, per rank per steady step (step >= 2), derived from torch's parallel plan and
confirmed on torch 2.13 (gloo at world 4, and the fake backend), A = b*s*d*4 bytes, P = s*d*4:

* TP (Narayanan et al. 2021), group "tp", without sequence parallelism: forward **all_reduce**
  of each embedding's partial lookup (token: A; position table, split by rows too: P) and of
  wo's and w2's outputs (A each per block): **2L + 2**; the output Linear (ColwiseParallel,
  output Replicate) **all_gathers** the logits [b, s, V]: **1**. Backward **all_reduce** of the
  input gradients of wq, wk, wv (three separate ColwiseParallel layers), w1 and the output
  Linear, A each: **4L + 1**.
* TP with ``--sequence-parallel`` (Korthikanti et al. 2022): forward **all_gather** (A out) of the
  attention input and of w1's per block, of the output Linear's input, plus the logits: **2L + 2**;
  **reduce_scatter** (A in) of wo's and w2's outputs per block and of the token lookup, plus the
  position lookup (P in): **2L + 2**. Backward the duals: **all_gather 2L + 2** (blocks and both
  embeddings), **reduce_scatter 2L + 1** (blocks and the output Linear's input). Each LayerNorm's
  weight and bias (replicated, applied to a sequence shard) gets its gradient **all_reduced**
  (d*4 bytes) in the backward: **4L + 2**. w2's bias (replicated) gets none.
* FSDP2 (``--dp-mode fsdp``), group "dp", units = L blocks + root: forward 1 all-gather per unit,
  backward re-gathers each block (the root keeps its parameters): **all_gather 2L + 1,
  reduce_scatter L + 1** (backward), each unit's local parameters with dim 0 padded to a multiple
  of dp (the tied output weight once, in the root). No all-reduce on dp.
* DDP (``--dp-mode ddp``), group "dp": one **all_reduce** per bucket in the backward, the buckets
  rebuilt after the first iteration in gradient-ready order (the output layer first, the
  embeddings last), a bucket closing once it holds --bucket-cap-mb (without it: the first at
  1 MiB, the rest at 25 MiB); together every parameter's local gradient once. Step 0 runs one
  bucket; step 1 adds the rebuild's 2 broadcasts.

Defaults (L 2, d 64, 8 heads, V 64, s 32, b 4, tp 2 x dp 2, fsdp): tp 15 all_reduce + 1 all_gather;
with --sequence-parallel tp 12 all_gather, 11 reduce_scatter, 10 all_reduce; dp 5 all-gather + 3
reduce-scatter. ``meshscope place --compare-trace`` holds the analytic model against these
(tests/test_place_trace.py; the measured table is in docs/place.md).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.distributed._tensor.common_dtensor import (
    ModelArgs,
    Transformer,
    TransformerBlock,
)

import delays


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--dp-mode", choices=("ddp", "fsdp"), default="fsdp")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP only (default: DDP's own, 25)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--weight-tying", action=argparse.BooleanOptionalAction, default=True,
                   help="the output Linear shares the token embedding's weight (ModelArgs' default)")
    p.add_argument("--lr", type=float, default=1e-3)
    delays.add_arguments(p, module="layers.0.feed_forward")
    return p.parse_args()


def setup():
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return device


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp = args.tp
    if tp < 1 or world % tp or args.heads % tp or args.vocab % tp or args.seq % tp or args.dim % args.heads:
        sys.exit(f"transformer.py needs WORLD_SIZE = dp * tp with --tp dividing --heads, --vocab and --seq, and "
                 f"--heads dividing --dim; got WORLD_SIZE={world}, --tp {tp}, --heads {args.heads}, --vocab "
                 f"{args.vocab}, --seq {args.seq}, --dim {args.dim}")
    if args.dp_mode == "ddp" and tp > 1 and args.weight_tying:
        sys.exit("transformer.py: --dp-mode ddp with --tp > 1 needs --no-weight-tying (torch 2.13's DDP + TP "
                 "transform localizes a tied parameter under its first name only, and DDP's first broadcast fails)")
    device = setup()
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))

    torch.manual_seed(0)
    model_args = ModelArgs(n_layers=args.layers, vocab_size=args.vocab, max_seq_len=args.seq, dim=args.dim,
                           n_heads=args.heads, dropout_p=0.0, weight_tying=args.weight_tying)
    model = Transformer(model_args).to(device)
    if tp > 1:
        # local_output_for_attn: wq/wk/wv hand plain local tensors (their heads) to SDPA, whose CPU
        # kernel has no DTensor sharding strategy in torch 2.13
        model = Transformer.parallelize(model, mesh["tp"], use_seq_parallel=args.sequence_parallel,
                                        local_output_for_attn=True)
    if args.dp_mode == "fsdp":
        for m in model.modules():
            if isinstance(m, TransformerBlock):
                fully_shard(m, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    else:
        model = DistributedDataParallel(model, device_mesh=mesh["dp"], bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    delay = delays.Delay(args, dist.get_rank())
    delay.attach(model.module if args.dp_mode == "ddp" else model)

    gen = torch.Generator().manual_seed(1234 + mesh["dp"].get_local_rank())
    for _ in range(args.steps):
        delay.next_step()
        delay.data()
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        out = model(tokens)
        loss = nn.functional.cross_entropy(out.reshape(-1, args.vocab), tokens.reshape(-1))
        loss.backward()
        opt.step()

    # torch 2.13 + gloo: let gloo's worker threads free their finished works before teardown
    # (tests/jobs/README.md, "Teardown on gloo")
    if dist.get_backend() == "gloo":
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
