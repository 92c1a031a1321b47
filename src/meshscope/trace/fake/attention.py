"""Attention on the CPU standing in for CUDA: DTensor's rule of CUDA's flash kernel for the CPU's, and
flex attention's backward.

``F.scaled_dot_product_attention`` picks its kernel by the device of its inputs. On a GPU, DTensor
shards the kernel it picks (flash, memory-efficient or cuDNN: torch 2.13
torch/distributed/tensor/_ops/_matrix_ops.py:490-1130, each replicated, or sharded on the heads
dim 1, or on the batch dim 0). In a fake world CUDA's tensors are the CPU's, so the same call picks
the CPU's flash kernel, ``aten._scaled_dot_product_flash_attention_for_cpu``, for which torch has no
sharding rule: its forward without a mask goes through DTensor's decomposition-based propagation,
whose causal mask is a plain tensor ("got mixed torch.Tensor and DTensor"), and its backward has no
decomposition at all (pytorch/examples distributed/tensor_parallelism/fsdp_tp_example.py fails at
llama2_model.py:223). Steering the choice to a kernel DTensor does shard is no way out on the CPU:
CUDA's three have no CPU kernel, and the math backend decomposes into matmuls whose placements
need not be the flash kernel's (and meets the same causal mask).

So the CPU kernel and its backward get DTensor's own rule for CUDA's flash kernel: the same three
placements of query, key, value, output and logsumexp (the CPU kernel's two outputs are the first two
of CUDA's; its backward's six tensor inputs are in the order of CUDA's backward). The strategy DTensor
then picks, and with it every redistribution around the attention, is the one it picks on the GPU. An
``attn_mask`` (for which CUDA takes the memory-efficient kernel, with its own rule for the bias) is
not covered: that call fails with one line (`explain`) naming torch's limit and what to pass.

``flex_attention`` refuses inputs that need a gradient on the CPU ("FlexAttention does not support
backward on CPU", torch 2.13 and 2.15 nn/attention/flex_attention.py ``_validate_device``), a check of
the device only: its eager backward, the dense one, runs on the CPU. Under ``torch.compile`` with
inductor (how torchtitan 0.3.0's llama3 calls it, models/common/attention.py
``FlexAttention._compiled_flex_attn``) the backward has no CPU kernel (torch 2.15: "IndexError: tuple
index out of range" in inductor's flex backward lowering), so a fake world runs flex attention eagerly
wherever it is called (`cpu_flex_attention`): it issues no collective, so the ledger is the GPU's.
"""

from __future__ import annotations

import functools

from ..entry_points import rebind
from .devices import _libraries, mark

CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu"
_FORWARD = (0, 1, 9, 10, 11)
"""The CPU kernel's placements (output, logsumexp, query, key, value) among the 12 of CUDA's rule
(output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask, q, k, v)."""


@functools.cache
def cpu_flash_attention_rule() -> None:
    import torch
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops import _matrix_ops as cuda_rules
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy

    aten = torch.ops.aten

    @register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default,
                          schema_info=RuntimeSchemaInfo(3, static_kwargkey=["attn_mask", "scale"]))
    def forward(op_schema):
        if op_schema.kwargs_schema.get("attn_mask") is not None:
            raise NotImplementedError(f"{CPU_FLASH} with an attn_mask has no DTensor sharding rule")
        mark("DTensor's flash-attention rule for the CPU kernel")
        strategies = [[placements[i] for i in _FORWARD]
                      for placements in cuda_rules._scaled_dot_product_flash_attention_base_strategies(op_schema)]
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, strategies, input_index=2)

    @register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                          schema_info=RuntimeSchemaInfo(6, static_kwargkey=["attn_mask", "scale"]))
    def backward(op_schema):
        if op_schema.kwargs_schema.get("attn_mask") is not None:
            raise NotImplementedError(f"{CPU_FLASH}_backward with an attn_mask has no DTensor sharding rule")
        strategies = cuda_rules._scaled_dot_product_flash_attention_backward_base_strategies(op_schema)
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(validate=False), op_schema, strategies,
                                               input_index=3)


def cudnn_takes(query, key, value, attn_mask, dropout_p, enable_gqa) -> bool:
    """Whether a Hopper GPU's SDPA runs this call as cuDNN's attention: what torch 2.13 checks of it
    (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp ``can_use_cudnn_attention``) that a script can vary
    here: the backend enabled (``sdpa_kernel``), no mask and no dropout, 4-D bf16 or fp16 operands of one dtype,
    one head dim of at most 128 in multiples of 8, and key/value heads that divide the query's where
    ``enable_gqa`` asks for grouped heads (equal heads otherwise)."""
    import torch

    from . import gpu

    if not torch.backends.cuda.cudnn_sdp_enabled() or gpu.capability() < (9, 0):
        return False
    if attn_mask is not None or dropout_p != 0.0 or not all(t.dim() == 4 for t in (query, key, value)):
        return False
    if query.dtype not in (torch.bfloat16, torch.float16) or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    dim = query.size(-1)
    if key.size(-1) != dim or value.size(-1) != dim or dim > 128 or dim % 8:
        return False
    heads, kv_heads = query.size(1), key.size(1)
    return value.size(1) == kv_heads and (heads == kv_heads or (enable_gqa and heads % kv_heads == 0))


def _every_head(query, key, value):
    """Key and value with a head per query head: grouped heads repeated, as SDPA's ``enable_gqa`` does."""
    groups = query.size(1) // key.size(1)
    return (key, value) if groups == 1 else (key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1))


@functools.cache
def cudnn_attention() -> None:
    """``F.scaled_dot_product_attention`` runs as a Hopper GPU's: cuDNN's attention, torch's first choice on
    one (an H100 under torch 2.11 ran cuDNN's kernel, benchmarks/forecast_step_kernels.py; torchtitan 0.2.2
    puts it first itself, models/attention.py), where on the CPU standing for it SDPA takes the CPU's flash
    kernel. The op's name is what a selective checkpointing policy reads: torchtitan's saves cuDNN's, flash's
    and the memory-efficient kernel's outputs by name (models/llama3/infra/parallelize.py ``_op_sac_save_list``)
    and recomputed the CPU kernel's in backward, so a fake world counted a forward attention twice and missed
    its saved outputs at the peak. Under fake tensors torch's meta kernels run it; with real tensors its CPU
    kernels compute it with the CPU's flash kernel and its backward, key and value repeated across grouped
    heads. DTensor shards it by its own rule, as on the GPU."""
    import torch
    import torch.nn.functional as F

    aten = torch.ops.aten
    original = F.scaled_dot_product_attention

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                     enable_gqa=False):
        if not cudnn_takes(query, key, value, attn_mask, dropout_p, enable_gqa):
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        mark("SDPA as cuDNN's attention")
        log_sumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return aten._scaled_dot_product_cudnn_attention(query, key, value, None, log_sumexp, 0.0, is_causal, False,
                                                        scale=scale)[0]

    def forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                return_debug_mask=False, scale=None):
        key, value = _every_head(query, key, value)
        out, log_sumexp = aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                            attn_mask=attn_bias, scale=scale)
        nothing = query.new_empty(0)
        philox = [torch.empty((), dtype=torch.long) for _ in range(2)]  # dropout's RNG state: no dropout here
        return (out, log_sumexp.unsqueeze(-1), nothing, nothing, query.size(2), key.size(2), *philox, nothing)

    def backward(grad_out, query, key, value, out, log_sumexp, philox_state, philox_offset, attn_bias, cum_seq_q,
                 cum_seq_k, max_q, max_k, dropout_p, is_causal, scale=None):
        kv_heads, groups = key.size(1), query.size(1) // key.size(1)
        key, value = _every_head(query, key, value)
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, log_sumexp.squeeze(-1), dropout_p, is_causal,
            attn_mask=attn_bias if attn_bias is not None and attn_bias.numel() else None, scale=scale)
        grad_q, grad_k, grad_v = grads
        if groups > 1:  # each key/value head served `groups` query heads: its gradient is their sum
            grad_k, grad_v = (g.unflatten(1, (kv_heads, groups)).sum(2) for g in (grad_k, grad_v))
        return grad_q, grad_k, grad_v

    library = torch.library.Library("aten", "IMPL")
    library.impl("_scaled_dot_product_cudnn_attention", forward, "CPU")
    library.impl("_scaled_dot_product_cudnn_attention_backward", backward, "CPU")
    _libraries.append(library)
    rebind(original, scaled_dot_product_attention)  # a module that imported it by name
    F.scaled_dot_product_attention = scaled_dot_product_attention  # and every caller of F.scaled_dot_product_attention


@functools.cache
def cpu_flex_attention() -> None:
    """flex_attention's device check takes the CPU for the CUDA it stands for, and every call runs it eagerly:
    a torch.compile of it, or around it, traces the replacement up to its call of the disabled original (a
    graph break; a compile of the disabled function itself would trace what it wraps)."""
    import torch
    from torch.nn.attention import flex_attention as module

    validate = module._validate_device

    def validate_device(query, key, value) -> None:
        if query.device.type != "cpu":
            validate(query, key, value)

    module._validate_device = validate_device
    original = module.flex_attention
    eager = torch.compiler.disable(original)

    @functools.wraps(original)
    def flex_attention(*args, **kwargs):
        mark("flex_attention (eager, on the CPU)")
        return eager(*args, **kwargs)

    rebind(original, flex_attention)  # torchtitan and torch's own context parallelism import it by name


def explain(exc: BaseException, where: str) -> str | None:
    """One line for DTensor's missing rule of the CPU attention kernel, at the script's `where`."""
    text = str(exc)
    if not isinstance(exc, NotImplementedError) or CPU_FLASH not in text:
        return None
    import torch

    masked = " with an attn_mask" if "attn_mask" in text else ""
    return (f"DTensor (torch {torch.__version__.split('+')[0]}) has no sharding rule for {CPU_FLASH}{masked}, the "
            f"kernel F.scaled_dot_product_attention picks on the CPU that stands for CUDA in a fake world"
            f"{f' (at {where})' if where else ''}: run that attention under "
            f"torch.nn.attention.sdpa_kernel(SDPBackend.MATH), whose matmuls DTensor shards"
            f"{', or with is_causal=True instead of a causal mask' if masked else ''}")
