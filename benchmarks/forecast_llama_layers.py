"""Llama 3 8B decoder blocks in plain torch under DDP or FSDP2: a job whose measured step on one GPU holds the
forecast's compute model to a real kernel timeline (docs/forecast.md, "Compute on one H100"). With
``--torchtitan``, the whole model trained as bench_forecast.py's torchtitan 8B rows train it (docs/forecast.md,
"The 8B row's rank classes on one GPU"), for a GPU whose image lacks torchtitan's own packages.

Run as a user would (``torchrun --nproc-per-node 1 benchmarks/forecast_llama_layers.py``): on a GPU it prints
the median step time of the steps after the warm-up, timed with CUDA events around each whole step, and the most
memory its tensors held (``torch.cuda.max_memory_allocated``); on the CPU
(a fake world) it just runs. Shapes are Llama 3 8B's (dim 4096, 32 heads, 8 KV heads, FFN 14336, RMSNorm,
rotary embeddings, SwiGLU), bf16 parameters and AdamW, causal SDPA; only the number of blocks is smaller, so
the model fits one GPU with its optimizer state. With ``--torchtitan``: fp32 parameters in bf16 mixed precision,
and the embedding and the output too (`train_as_torchtitan` says what differs from torchtitan's own loop).
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.attn_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, self.heads, self.head_dim)
        k = self.wk(h).view(b, s, self.kv_heads, self.head_dim)
        v = self.wv(h).view(b, s, self.kv_heads, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotate(x, cos, sin):
    """Rotary embedding on the last dim's two halves."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Stack(nn.Module):
    """`blocks`, with the rotary tables of the sequence (for heads of `head_dim`, base `theta`) as buffers."""

    def __init__(self, blocks: list[nn.Module], seq: int, head_dim: int, theta: float):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        half = head_dim // 2
        angles = torch.outer(torch.arange(seq, dtype=torch.float32),
                             theta ** (-torch.arange(half, dtype=torch.float32) / half))
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, x):
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return x


def llama(layers: int, seq: int, dim: int = 4096, heads: int = 32, kv_heads: int = 8, ffn: int = 14336) -> Stack:
    return Stack([Block(dim, heads, kv_heads, ffn) for _ in range(layers)], seq, dim // heads, 500000.0)


def parser(batch: int, seq: int) -> argparse.ArgumentParser:
    """The options of a blocks job (this one's and forecast_moe_layers.py's), with its default batch and sequence."""
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--seq", type=int, default=seq)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard per block and the root) instead of DDP")
    p.add_argument("--cpu-offload", action="store_true",
                   help="with --fsdp: fully_shard's CPUOffloadPolicy (sharded state and the optimizer step on the host)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (fullgraph, inductor), as torchtitan's --compile.enable does")
    return p


def compiled(blocks: nn.ModuleList) -> None:
    """Each of `blocks` replaced by its torch.compile'd self (``--compile``; torchtitan 0.2.2's apply_compile: per
    block, fullgraph, after activation checkpointing and before FSDP)."""
    for i, block in enumerate(blocks):
        blocks[i] = torch.compile(block, fullgraph=True)


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """One training step on input `x`."""
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def setup() -> torch.device:
    """Join the job's process group (NCCL on a GPU, gloo on the CPU) and return this rank's device."""
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return device


def timed(steps: int, one_step, what: str) -> None:
    """Run `one_step` `steps` times; on a GPU rank 0 prints the steady steps' times (CUDA events around each whole
    step) and the memory the tensors held, with `what` the job ran."""
    cuda = torch.cuda.is_available()
    times = []
    for _ in range(steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        one_step()
        if cuda:
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    if cuda and dist.get_rank() == 0:
        first = 3 if steps > 3 else 0  # the warm-up, where there are steps after it
        steady = times[first:]
        print(f"step_ms median {statistics.median(steady):.2f} min {min(steady):.2f} max {max(steady):.2f} "
              f"peak_allocated_gib {torch.cuda.max_memory_allocated() / 2**30:.2f} "
              f"peak_reserved_gib {torch.cuda.max_memory_reserved() / 2**30:.2f} "
              f"(steps {first}-{steps - 1}; {what} over {dist.get_world_size()}, threads {torch.get_num_threads()}, "
              f"{torch.cuda.get_device_name()}, torch {torch.__version__})", flush=True)


def train(stack: nn.Module, width: int, args) -> None:
    """`args.steps` steps of `stack` (its ``blocks``) on this rank's GPU, or its CPU, in bf16 under DDP or FSDP2, on
    random inputs of `width`."""
    if args.cpu_offload and not args.fsdp:
        raise SystemExit("--cpu-offload is FSDP2's: give --fsdp too")
    device = setup()
    model = stack.to(device, torch.bfloat16)
    if args.compile:
        compiled(model.blocks)
    if args.fsdp:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        offload = {"offload_policy": CPUOffloadPolicy()} if args.cpu_offload else {}
        for block in model.blocks:
            fully_shard(block, **offload)
        fully_shard(model, **offload)
    else:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timed(args.steps, lambda: step(model, opt, torch.randn(args.batch, args.seq, width, device=device,
                                                           dtype=torch.bfloat16)),
          f"layers {args.layers}, batch {args.batch}, seq {args.seq}, "
          f"{'FSDP2' if args.fsdp else 'DDP'}{' with CPU offload' if args.cpu_offload else ''}"
          f"{', compiled' if args.compile else ''}")
    dist.destroy_process_group()


class Llama(nn.Module):
    """Llama 3 8B's whole model: the token embedding, `layers` blocks, a final RMSNorm and the output projection
    over the vocabulary."""

    def __init__(self, layers: int, seq: int, vocab: int = 128256, dim: int = 4096):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = llama(layers, seq, dim)
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        return self.output(self.norm(self.layers(self.tok_embeddings(tokens))))


SAVED = {torch.ops.aten.mm.default, torch.ops.aten.max.default,
         torch.ops._c10d_functional.reduce_scatter_tensor.default,
         *(getattr(torch.ops.aten, f"_scaled_dot_product_{kernel}").default
           for kernel in ("flash_attention", "efficient_attention", "cudnn_attention", "attention_math",
                          "fused_attention_overrideable") if hasattr(torch.ops.aten, f"_scaled_dot_product_{kernel}"))}
"""The ops whose outputs torchtitan's selective op checkpointing keeps (torchtitan 0.2.2,
models/llama3/infra/parallelize.py's save list, less flex, varlen and compiled attention, which this model does
not run; of the matmuls only the first of each two: see `selective`)."""


def selective(block: nn.Module) -> nn.Module:
    """`block` under selective op activation checkpointing as torchtitan 0.2.2 applies it
    (distributed/activation_checkpoint.py): the outputs of SAVED's ops are kept, but of the matmuls only the
    first, third, ... of each pass; the rest is recomputed in the backward."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def context():
        matmuls = {False: 0, True: 0}

        def policy(ctx, func, *args, **kwargs):
            keep = func in SAVED
            if func is torch.ops.aten.mm.default:
                matmuls[ctx.is_recompute] += 1
                keep = matmuls[ctx.is_recompute] % 2 == 1
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    # early_stop=False, torchtitan's default (its ActivationCheckpoint config): the backward recomputes the whole
    # block, where torch's default stops once the last saved tensor is made again
    return checkpoint_wrapper(block, context_fn=context, early_stop=False)


def train_as_torchtitan(args) -> None:
    """`args.steps` steps of the whole model (`Llama`) as torchtitan 0.2.2 trains it (bench_forecast.py's 8B
    rows: ``--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op``): fp32
    parameters, each block, the embedding and the norm with the output sharded by FSDP2 in bf16 mixed precision
    (reduced in fp32; the last unit kept gathered after the forward), summed cross-entropy on fp32 logits,
    gradients clipped to norm 1, fused AdamW. Unlike torchtitan's loop: the model is made on the GPU and then
    sharded (torchtitan makes it on the meta device), FSDP2 averages the gradients (torchtitan divides the summed
    loss by the tokens, one all-reduce of their count a step), and there is no data loader, logging or
    learning-rate schedule."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = setup()
    model = Llama(args.layers, args.seq).to(device)
    model.layers.blocks = nn.ModuleList(selective(block) for block in model.layers.blocks)
    if args.compile:
        compiled(model.layers.blocks)
    mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    fully_shard(model.tok_embeddings, **mp)
    for block in model.layers.blocks:
        fully_shard(block, **mp)
    fully_shard([model.norm, model.output], **mp, reshard_after_forward=False)
    fully_shard(model, **mp)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, eps=1e-8, weight_decay=0.1, fused=True)

    def one_step():
        tokens = torch.randint(0, model.output.out_features, (args.batch, args.seq + 1), device=device)
        # One expression, so that the bf16 logits are freed before the backward, as torchtitan's `del pred` does.
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten(0, 1),
                        reduction="sum").backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    timed(args.steps, one_step, f"the whole model with {args.layers} layers, batch {args.batch}, seq {args.seq}, "
          f"as torchtitan trains it{', compiled' if args.compile else ''}")
    dist.destroy_process_group()


def main() -> None:
    p = parser(batch=1, seq=8192)
    p.add_argument("--torchtitan", action="store_true",
                   help="the whole model (embedding, blocks, output over 128,256 words) as torchtitan trains its 8B: "
                        "FSDP2 in bf16 mixed precision over fp32 parameters, selective op checkpointing, fused AdamW")
    args = p.parse_args()
    if args.torchtitan:
        train_as_torchtitan(args)
    else:
        train(llama(args.layers, args.seq), 4096, args)


if __name__ == "__main__":
    main()
