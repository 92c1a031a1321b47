"""Megatron-LM's compiled kernels, for an install that lacks them (no Apex, no megatron/fused_kernels build).

Megatron-LM trains GPT with ``masked_softmax_fusion`` and ``gradient_accumulation_fusion`` on unless
``--no-masked-softmax-fusion`` / ``--no-gradient-accumulation-fusion`` turn them off (arguments.py); both need CUDA
extensions that Apex (or Megatron-LM's own fused_kernels/, which ``_compile_dependencies`` built at start-up in
2022-2023) provides:

* ``scaled_upper_triang_masked_softmax_cuda`` (and ``scaled_masked_softmax_cuda``, whose ``get_batch_per_block``
  megatron-core's ``FusedScaleMaskSoftmax.is_kernel_available`` asks): scale, causal mask and softmax in one
  kernel that reads its bf16 input once and writes its bf16 output once (its backward reads the gradient and the
  saved output and writes one gradient). Without it megatron-core runs ``forward_torch_softmax``: a cast to fp32,
  a scale, a masked fill, the softmax and a cast back, five passes over the b x heads x s x s scores, each
  element moved in fp32;
* ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32``: the weight-gradient GEMM accumulating into the fp32
  ``main_grad`` in its epilogue. Without it megatron-core writes a bf16 weight gradient and megatron's DDP adds it
  to ``main_grad`` in a separate pass.

Each stand-in is one operator (``torch.library.custom_op``, or the GEMM as ``addmm`` into an fp32 output), so that
a profiler, a dispatch mode or a fake tensor sees what the real kernel is: one op with those operands. Its eager
body computes the same values in plain torch (slower than the CUDA kernel; correct on any device).

``install()`` puts a stand-in in ``sys.modules`` only for a module that cannot be imported; a real build wins.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import torch


@torch.library.custom_op("megatron_fused::causal_softmax", mutates_args=())
def causal_softmax(inputs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """softmax(scale x inputs) over the last dim, with keys after the query masked (Megatron's upper-triangular
    kernel: inputs are [batches x heads, sq, sk])."""
    x = inputs.float() * scale.to(inputs.device)
    future = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).triu(1)
    return torch.softmax(x.masked_fill(future, float("-inf")), dim=-1).to(inputs.dtype)


@causal_softmax.register_fake
def _(inputs, scale):
    return torch.empty_like(inputs)


@torch.library.custom_op("megatron_fused::softmax_backward_", mutates_args=("grads",))
def softmax_backward_(grads: torch.Tensor, probs: torch.Tensor, scale: torch.Tensor) -> None:
    """The gradient of the scaled softmax from its output, scale x p x (g - sum(g x p)), written over the incoming
    gradient, as Megatron's kernel writes it (no buffer of its own)."""
    g, p = grads.float(), probs.float()
    grads.copy_(scale.to(g.device) * p * (g - (g * p).sum(dim=-1, keepdim=True)))


def softmax_backward(grads: torch.Tensor, probs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    softmax_backward_(grads, probs, scale)
    return grads


def get_batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
    """Rows of one CUDA block in Megatron's masked-softmax kernels (scaled_masked_softmax.h): a warp of up to 32
    threads per row, two rows per warp for rows of at most 128 keys, 128 threads a block."""
    width = 1 << max(sk - 1, 0).bit_length()
    warp = min(width, 32)
    return (128 // warp) * (2 if width <= 128 else 1)


def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (fp32, [out, in]) += grad_output^T @ total_input, accumulated in the GEMM's fp32 output."""
    a = grad_output.reshape(-1, grad_output.shape[-1]).t()
    b = total_input.reshape(-1, total_input.shape[-1])
    try:
        torch.addmm(main_grad, a, b, out_dtype=torch.float32, out=main_grad)
    except NotImplementedError:  # the CPU has no bf16 GEMM into fp32 (torch 2.13: aten::addmm.dtype_out)
        main_grad.add_(a.float() @ b.float())


def wgrad_gemm_accum_fp16(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (16-bit) += grad_output^T @ total_input."""
    main_grad.addmm_(grad_output.reshape(-1, grad_output.shape[-1]).t(),
                     total_input.reshape(-1, total_input.shape[-1]))


def install() -> list[str]:
    """Stand in for each of Megatron's kernel modules that cannot be imported; the names stood in for."""
    modules = {
        "scaled_upper_triang_masked_softmax_cuda": dict(forward=causal_softmax, backward=softmax_backward),
        "scaled_masked_softmax_cuda": dict(get_batch_per_block=get_batch_per_block),
        "fused_weight_gradient_mlp_cuda": dict(wgrad_gemm_accum_fp32=wgrad_gemm_accum_fp32,
                                               wgrad_gemm_accum_fp16=wgrad_gemm_accum_fp16),
    }
    stood_in = []
    for name, functions in modules.items():
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            continue
        module = types.ModuleType(name, f"meshscope benchmarks' stand-in for Megatron's {name}")
        module.__dict__.update(functions)
        sys.modules[name] = module
        stood_in.append(name)
    return stood_in
