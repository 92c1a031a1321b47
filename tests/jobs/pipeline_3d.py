"""torch's test Transformer on a (pp, dp, tp) mesh: pipeline stages x FSDP2 x tensor parallel.

Exercises the three together as torchtitan arranges them: the whole model is built from one seed
and parallelized over ``mesh["tp"]`` (``Transformer.parallelize``, no sequence parallel), then each
pipeline rank keeps its stage (stage 0: the embeddings and the first L/pp blocks; the last stage:
the last blocks, the final norm and the output layer), shards it with FSDP2 ``fully_shard`` over
``mesh["dp"]`` (each block, then the stage), and runs ``torch.distributed.pipelining``'s
``Schedule1F1B`` over ``mesh["pp"]`` with static stage shapes (``input_args`` / ``output_args``), so
no shape metadata crosses the pipeline. One AdamW step per iteration. This is an ordinary user
script: it never imports meshscope.

Launch (WORLD_SIZE = pp * dp * tp, pp >= 2, --layers divisible by pp)::

    torchrun --nproc-per-node 8 tests/jobs/pipeline_3d.py --pp 2 --tp 2
    meshscope trace --fake-world 1024 -- tests/jobs/pipeline_3d.py --pp 4 --tp 8 --layers 8 --dim 1024 --seq 2048

Independent facts per rank per steady step (M = --microbatches, b = --batch / M tokens rows per
microbatch, s = --seq, d = --dim; fp32):

* pp (default group of the pp mesh dim, P2P): a stage that is not the last sends M activations
  [b, s, d] forward and receives M gradients of them; a stage that is not the first receives M
  activations and sends M gradients (Narayanan et al. 2021's 1F1B: the order interleaves, the counts
  do not change).
* tp: per block the row-parallel outputs (wo, w2) are all-reduced forward and wq, wk, wv, w1's input
  gradients backward, per microbatch; the embeddings and the output layer add theirs on the first and
  last stage (tests/jobs/transformer.py gives the per-layer facts).
* dp: FSDP2's all-gathers and reduce-scatters of each unit of the stage.
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
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer, TransformerBlock


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    return p.parse_args()


class Stage(nn.Module):
    """One pipeline stage of the (already tensor-parallel) Transformer."""

    def __init__(self, model: Transformer, index: int, stages: int):
        super().__init__()
        per = len(model.layers) // stages
        self.first, self.last = index == 0, index == stages - 1
        self.layers = nn.ModuleList(model.layers[index * per:(index + 1) * per])
        if self.first:
            self.tok_embeddings, self.pos_embeddings = model.tok_embeddings, model.pos_embeddings
        if self.last:
            self.norm, self.output = model.norm, model.output

    def forward(self, x):
        if self.first:  # x: token ids [b, s]
            x = self.tok_embeddings(x) + self.pos_embeddings(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x)).float() if self.last else x


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pp, tp = args.pp, args.tp
    mb, rest = divmod(args.batch, args.microbatches)
    if (pp < 2 or tp < 1 or world % (pp * tp) or args.layers % pp or rest or args.heads % tp or args.vocab % tp
            or args.dim % args.heads):
        sys.exit(f"pipeline_3d.py needs WORLD_SIZE = pp * dp * tp with pp >= 2, --layers divisible by --pp, --batch "
                 f"by --microbatches, --tp dividing --heads and --vocab; got WORLD_SIZE={world}, --pp {pp}, --tp {tp}, "
                 f"--layers {args.layers}, --batch {args.batch}, --microbatches {args.microbatches}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    mesh = init_device_mesh(device.type, (pp, world // (pp * tp), tp), mesh_dim_names=("pp", "dp", "tp"))

    torch.manual_seed(0)
    model_args = ModelArgs(n_layers=args.layers, vocab_size=args.vocab, max_seq_len=args.seq, dim=args.dim,
                           n_heads=args.heads, dropout_p=0.0, weight_tying=False)  # the two ends are on different stages
    model = Transformer(model_args).to(device)
    if tp > 1:  # local_output_for_attn: SDPA's CPU kernel has no DTensor strategy in torch 2.13
        model = Transformer.parallelize(model, mesh["tp"], use_seq_parallel=False, local_output_for_attn=True)
    index = mesh["pp"].get_local_rank()
    stage_module = Stage(model, index, pp)
    del model
    for m in stage_module.modules():
        if isinstance(m, TransformerBlock):
            fully_shard(m, mesh=mesh["dp"])
    fully_shard(stage_module, mesh=mesh["dp"])

    def example(shape, dtype=torch.float32, grad=True):
        return torch.empty(shape, dtype=dtype, device=device, requires_grad=grad)

    hidden = (mb, args.seq, args.dim)
    stage = PipelineStage(
        stage_module, stage_index=index, num_stages=pp, device=device, group=mesh["pp"].get_group(),
        input_args=(example((mb, args.seq), torch.int64, grad=False) if index == 0 else example(hidden),),
        output_args=(example((mb, args.seq, args.vocab)) if index == pp - 1 else example(hidden),))

    def loss_fn(logits, tokens):
        return nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens.reshape(-1))

    schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_module.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1234 + mesh["dp"].get_local_rank())
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        if index == 0:
            schedule.step(tokens)
        elif index == pp - 1:
            schedule.step(target=tokens)
        else:
            schedule.step()
        opt.step()

    if dist.get_backend() == "gloo":  # let gloo's worker threads free their works (tests/jobs/README.md)
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
