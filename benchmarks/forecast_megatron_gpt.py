"""Megatron-core GPT pretraining as Megatron-LM's pretrain_gpt.py runs it: tensor, pipeline (interleaved) and data
parallelism, sequence parallelism, selective recomputation, bf16, megatron's DDP and optimizer.

An ordinary user training script (it never imports meshscope), written for CUDA + NCCL: launch it with torchrun,
one process per GPU. Needs ``pip install megatron-core==0.16.1`` (no Transformer Engine or Apex: the local layer
spec, megatron-core's own modules).

What it does, following Megatron-LM's training.py / pretrain_gpt.py (read at the 0.16-era code):

* ``initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp)`` and
  ``model_parallel_cuda_manual_seed``;
* the model is a list of chunks (``get_model``): with an interleaved schedule one ``GPTModel`` per virtual stage,
  ``pre_process`` / ``post_process`` from ``is_pipeline_first_stage`` / ``is_pipeline_last_stage`` with
  ``ignore_virtual=False`` and that chunk's ``vp_stage``, each holding ``get_num_layers_to_build`` layers of the
  local spec; each chunk cast to bf16 in ``Float16Module``, then wrapped in megatron's
  ``DistributedDataParallel`` (``grad_reduce_in_fp32``: Megatron-LM turns it on with bf16; bucketing only in
  the first chunk); the word embeddings are tied to the output layer (Megatron-LM's default);
* ``config.no_sync_func`` / ``grad_sync_func`` / ``param_sync_func`` / ``finalize_model_grads_func`` set as
  ``setup_model_and_optimizer`` / ``train`` set them; ``get_megatron_optimizer`` (Adam, bf16 with fp32 main
  parameters, gradient clipping at 1.0; ``--distributed-optimizer`` shards its state over dp);
* each step: ``zero_grad_buffer`` on every chunk, ``optimizer.zero_grad()``, ``get_forward_backward_func()``
  over ``global batch / (micro batch x dp)`` micro-batches, ``optimizer.step()``, and on the last stage the
  losses all-reduced over dp (``train_step``'s reporting);
* data as ``get_batch_on_this_tp_rank``: tp rank 0 of the first and last stages makes the micro-batch (random
  tokens here) and broadcasts it over tp: tokens, attention mask and positions on the first stage, labels, loss
  mask and attention mask on the last; the other virtual chunks read none;
* the loss as pretrain_gpt's ``loss_func``: the masked sum with its token count (the schedule divides it).

Megatron-LM's fused softmax and gradient-accumulation fusion are on, as its defaults have them (off with
``--no-masked-softmax-fusion`` / ``--no-gradient-accumulation-fusion``): where their CUDA extensions are not
installed, ``megatron_fused_kernels.py`` stands one operator in for each kernel. One choice differs from a CUDA
install with Apex / Transformer Engine, because neither is installed: the layer norms under
``--sequence-parallel`` are torch's ``LayerNorm`` with megatron's ``sequence_parallel`` mark on their parameters
(the local spec's ``WrappedTorchNorm`` refuses sequence parallelism, ``FusedLayerNorm`` needs Apex); torch's
layer norm is one kernel too.

Launch (WORLD_SIZE divisible by tp x pp; global batch divisible by micro batch x dp)::

    torchrun --nproc-per-node 8 benchmarks/forecast_megatron_gpt.py --tp 2 --pp 2 --vpp 2 --layers 4 \\
        --hidden 256 --heads 8 --seq 128 --vocab 1024 --micro-batch 1 --global-batch 8 --steps 3

GPT-3 175B as Korthikanti et al. 2022 trained it (64 GPUs: TP 8 x PP 8)::

    torchrun ... benchmarks/forecast_megatron_gpt.py --tp 8 --pp 8 --vpp 12 --layers 96 --hidden 12288 \\
        --heads 96 --seq 2048 --vocab 51200 --micro-batch 1 --global-batch 64 --sequence-parallel --no-overlap-p2p

(benchmarks/bench_forecast.py's rows ``gpt175b-*``, traced in a fake world of their size: docs/forecast.md)
"""

import argparse
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import megatron_fused_kernels

megatron_fused_kernels.install()  # before megatron-core's layers.py looks for fused_weight_gradient_mlp_cuda

with warnings.catch_warnings():
    # "Transformer Engine and Apex are not installed" on a plain install.
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.utils import get_attr_wrapped_model


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """torch's LayerNorm with megatron-core's ``sequence_parallel`` mark on its parameters (as
    fused_layer_norm.py sets it), so that ``finalize_model_grads`` sums their gradients over tp."""

    def __init__(self, config, hidden_size, eps=1e-5):
        super().__init__(hidden_size, eps=eps)
        for param in self.parameters():
            param.sequence_parallel = config.sequence_parallel


def block_spec(config, vp_stage):
    """The local spec's layers this chunk builds (``get_num_layers_to_build``), with SP's norms under SP."""
    layer = get_gpt_layer_local_spec()
    if config.sequence_parallel:
        layer.submodules.input_layernorm = SequenceParallelLayerNorm
        layer.submodules.pre_mlp_layernorm = SequenceParallelLayerNorm
        norm = SequenceParallelLayerNorm
    else:
        norm = get_gpt_layer_local_spec().submodules.input_layernorm
    return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                      layer_norm=norm)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=None, help="FFN hidden size (default 4 x hidden)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024, help="padded vocabulary (divisible by tp)")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=None, help="model chunks per pipeline rank (interleaved schedule)")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--recompute", choices=("selective", "full", "none"), default="selective")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--overlap-grad-reduce", action="store_true")
    p.add_argument("--overlap-param-gather", action="store_true")
    p.add_argument("--no-overlap-p2p", action="store_true",
                   help="batched send/recv instead of Megatron-LM's default overlapped p2p (interleaved schedule)")
    p.add_argument("--untie-embeddings", action="store_true")
    p.add_argument("--no-masked-softmax-fusion", action="store_true",
                   help="megatron-core's softmax in torch ops (Megatron-LM's --no-masked-softmax-fusion)")
    p.add_argument("--no-gradient-accumulation-fusion", action="store_true",
                   help="bf16 weight gradients added to main_grad after (Megatron-LM's flag of that name)")
    p.add_argument("--steps", type=int, default=3)
    return p.parse_args()


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mp = args.tp * args.pp
    if world % mp:
        sys.exit(f"WORLD_SIZE {world} is not divisible by tp x pp = {mp}")
    dp = world // mp
    if args.global_batch % (args.micro_batch * dp):
        sys.exit(f"global batch {args.global_batch} is not divisible by micro batch x dp = {args.micro_batch * dp}")
    microbatches = args.global_batch // (args.micro_batch * dp)
    vpp = args.vpp if args.pp > 1 and args.vpp and args.vpp > 1 else None
    if not torch.cuda.is_available():
        sys.exit("forecast_megatron_gpt.py needs CUDA (megatron-core allocates on torch.cuda.current_device())")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="nccl")
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                                 virtual_pipeline_model_parallel_size=vpp)
    model_parallel_cuda_manual_seed(1234)

    overlap_p2p = vpp is not None and not args.no_overlap_p2p  # Megatron-LM: on unless --no-overlap-p2p-communication
    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        ffn_hidden_size=args.ffn or 4 * args.hidden,
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        virtual_pipeline_model_parallel_size=vpp, sequence_parallel=args.sequence_parallel and args.tp > 1,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        recompute_granularity=None if args.recompute == "none" else args.recompute,
        recompute_method="uniform" if args.recompute == "full" else None,
        recompute_num_layers=1 if args.recompute == "full" else None,
        overlap_p2p_comm=overlap_p2p, batch_p2p_comm=not overlap_p2p,
        gradient_accumulation_fusion=not args.no_gradient_accumulation_fusion, bias_activation_fusion=True,
        masked_softmax_fusion=not args.no_masked_softmax_fusion,
        init_method_std=0.006)

    # Megatron-LM's get_model: one chunk per virtual stage
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        chunk = GPTModel(
            config=config, transformer_layer_spec=block_spec(config, stage), vocab_size=args.vocab,
            max_sequence_length=args.seq, pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=not args.untie_embeddings, vp_stage=stage)
        chunk.vp_stage = stage
        chunks.append(chunk)
    for chunk in chunks:
        chunk.cuda(torch.cuda.current_device())
    chunks = [Float16Module(config, chunk) for chunk in chunks]
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather, use_distributed_optimizer=args.distributed_optimizer,
        check_for_nan_in_grad=True)
    model = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
             for i, chunk in enumerate(chunks)]
    for chunk in model:
        chunk.broadcast_params()  # Megatron-LM: data-parallel replicas start from rank 0's weights

    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=6e-5, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, clip_grad=1.0, bf16=True,
        params_dtype=torch.bfloat16, use_distributed_optimizer=args.distributed_optimizer), model)

    # training.py's train(): the hooks the schedules call
    config.no_sync_func = [c.no_sync for c in model] if len(model) > 1 else model[0].no_sync
    if args.overlap_grad_reduce:
        config.grad_sync_func = [c.start_grad_sync for c in model]
        if len(model) == 1:
            config.grad_sync_func = config.grad_sync_func[0]
    if args.overlap_param_gather and args.distributed_optimizer:
        config.param_sync_func = [c.start_param_sync for c in model]
        if len(model) == 1:
            config.param_sync_func = config.param_sync_func[0]
    config.finalize_model_grads_func = finalize_model_grads

    gen = torch.Generator().manual_seed(1000 + ps.get_data_parallel_rank())
    tp_src, tp_group = ps.get_tensor_model_parallel_src_rank(), ps.get_tensor_model_parallel_group()
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    dev = torch.cuda.current_device()
    shape = (args.micro_batch, args.seq)

    def get_batch_on_this_tp_rank():
        """training/utils.py's: tp rank 0 reads, then broadcasts over tp what this stage needs."""
        if ps.get_tensor_model_parallel_rank() == 0:
            text = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1), generator=gen)
            batch = {"tokens": text[:, :-1].contiguous().to(dev), "labels": text[:, 1:].contiguous().to(dev),
                     "loss_mask": torch.ones(shape, dtype=torch.float).to(dev),
                     "attention_mask": (torch.tril(torch.ones(1, 1, args.seq, args.seq)) < 0.5).to(dev),
                     "position_ids": torch.arange(args.seq).unsqueeze(0).expand(*shape).contiguous().to(dev)}
        else:
            batch = {"tokens": torch.empty(shape, dtype=torch.int64, device=dev),
                     "labels": torch.empty(shape, dtype=torch.int64, device=dev),
                     "loss_mask": torch.empty(shape, dtype=torch.float, device=dev),
                     "attention_mask": torch.empty((1, 1, args.seq, args.seq), dtype=torch.bool, device=dev),
                     "position_ids": torch.empty(shape, dtype=torch.int64, device=dev)}
        names = (("tokens", "labels", "loss_mask", "attention_mask", "position_ids") if args.pp == 1 else
                 ("tokens", "attention_mask", "position_ids") if first else
                 ("labels", "loss_mask", "attention_mask") if last else ())
        for name in names:
            dist.broadcast(batch[name], tp_src, group=tp_group)
        return {k: (v if k in names else None) for k, v in batch.items()}

    def forward_step(data_iterator, model_chunk):
        """pretrain_gpt.py's forward_step: chunks neither first nor last read no batch."""
        stage = get_attr_wrapped_model(model_chunk, "vp_stage")
        if ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage) or \
                ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage):
            batch = get_batch_on_this_tp_rank()
        else:
            batch = dict.fromkeys(("tokens", "labels", "loss_mask", "attention_mask", "position_ids"))
        output = model_chunk(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])

        def loss_func(output_tensor):
            losses = output_tensor.view(-1).float()
            loss_mask = batch["loss_mask"].view(-1).float()
            loss = torch.sum(losses * loss_mask)
            num_tokens = loss_mask.sum().clone().detach().to(torch.int)
            return loss, num_tokens, {"lm loss": torch.cat([loss.detach().view(1), num_tokens.view(1)])}

        return output, loss_func

    forward_backward = get_forward_backward_func()
    data = [None] * len(model)  # the batches are made in forward_step (random tokens)
    for step in range(args.steps):
        started = time.perf_counter()
        for chunk in model:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=data if len(model) > 1 else data[0],
                                  model=model, num_microbatches=microbatches, seq_length=args.seq,
                                  micro_batch_size=args.micro_batch, forward_only=False)
        optimizer.step()
        if last:  # train_step's loss reduction over dp, for the log
            total = torch.vstack([x["lm loss"].view(-1) for x in losses]).sum(dim=0)
            dist.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
            if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
                print(f"step {step} loss {(total[0] / total[1]).item():.4f} ({time.perf_counter() - started:.2f} s)",
                      flush=True)

    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
