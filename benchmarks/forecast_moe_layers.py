"""Qwen3 30B-A3B's decoder blocks in plain torch under DDP: an MoE job whose measured step on one GPU holds the
forecast's compute model to a real kernel timeline (docs/forecast.md, "An MoE block on one GPU").

Run as a user would (``torchrun --nproc-per-node 1 benchmarks/forecast_moe_layers.py``), with the options and the
timed loop of forecast_llama_layers.py (``train``): on a GPU it prints the median step time of the steps after the
warm-up and the most memory its tensors held; on the CPU (a fake world) it just runs. Shapes are Qwen3 30B-A3B's
(dim 2048, 32 query heads and 4 KV heads of 128, RMSNorm on queries and keys, rotary embeddings, 128 experts of FFN
768 with SwiGLU, 8 chosen per token), bf16 parameters and AdamW, causal SDPA; only the number of blocks is smaller.
Each token's experts follow from its position (token t takes experts 8t .. 8t + 7 modulo 128: every expert gets the
same rows, as torchtitan's ``--debug.moe_force_load_balance`` gives), weighted by the router's softmax at those
experts. The experts run eager, as torchtitan's do up to their output: the routed rows sorted by expert
(``argsort``), gathered, three grouped matmuls (``torch._grouped_mm`` over the experts' row offsets); then scattered
back weighted with ``index_add_``; with ``--permutation torchtitan`` as torchtitan 0.2.2 does it (models/moe/moe.py
``_forward``: gathered by indexing, ``x[rows]``, whose backward accumulates through ``index_put_``; unsorted by an
indexed assignment, then each token's eight rows summed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from forecast_llama_layers import Stack, parser, rotate, train


class Experts(nn.Module):
    def __init__(self, dim: int, ffn: int, experts: int, top: int, permutation: str):
        super().__init__()
        self.experts, self.top, self.permutation = experts, top, permutation
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, ffn, dim) * dim ** -0.5)
        self.w3 = nn.Parameter(torch.randn(experts, ffn, dim) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, dim, ffn) * ffn ** -0.5)

    def forward(self, h):
        tokens = h.reshape(-1, h.shape[-1])
        n = tokens.shape[0]
        chosen = (torch.arange(n, device=h.device)[:, None] * self.top
                  + torch.arange(self.top, device=h.device)) % self.experts
        weights = self.router(tokens).float().softmax(-1).gather(1, chosen).to(h.dtype)
        order = chosen.flatten().argsort(stable=True)
        rows = order // self.top
        ends = torch.bincount(chosen.flatten(), minlength=self.experts).cumsum(0).to(torch.int32)
        x = tokens[rows] if self.permutation == "torchtitan" else tokens.index_select(0, rows)
        y = F.silu(torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=ends)) \
            * torch._grouped_mm(x, self.w3.transpose(-2, -1), offs=ends)
        y = torch._grouped_mm(y, self.w2.transpose(-2, -1), offs=ends) * weights.flatten()[order, None]
        if self.permutation == "torchtitan":
            unsorted = y.new_zeros(n * self.top, y.shape[-1])
            unsorted[order] = y
            return unsorted.view(n, self.top, -1).sum(1).view_as(h)
        return torch.zeros_like(tokens).index_add_(0, rows, y).view_as(h)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int, experts: int, top: int,
                 permutation: str):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attn_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.q_norm, self.k_norm = nn.RMSNorm(head_dim), nn.RMSNorm(head_dim)
        self.wq = nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, dim, bias=False)
        self.moe = Experts(dim, ffn, experts, top, permutation)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_norm(self.wq(h).view(b, s, self.heads, self.head_dim))
        k = self.k_norm(self.wk(h).view(b, s, self.kv_heads, self.head_dim))
        v = self.wv(h).view(b, s, self.kv_heads, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        return x + self.moe(self.ffn_norm(x))


def qwen3_moe(layers: int, seq: int, permutation: str = "index_add", dim: int = 2048, heads: int = 32,
              kv_heads: int = 4, head_dim: int = 128, ffn: int = 768, experts: int = 128, top: int = 8) -> Stack:
    return Stack([Block(dim, heads, kv_heads, head_dim, ffn, experts, top, permutation) for _ in range(layers)], seq,
                 head_dim, 1000000.0)


def main() -> None:
    p = parser(batch=4, seq=4096)
    p.add_argument("--permutation", choices=("index_add", "torchtitan"), default="index_add",
                   help="how the experts' rows are gathered and scattered back (module doc)")
    args = p.parse_args()
    train(qwen3_moe(args.layers, args.seq, args.permutation), 2048, args)


if __name__ == "__main__":
    main()
