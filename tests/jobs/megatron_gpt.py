"""Megatron-core job: GPTModel (local layer spec) trained as megatron-core's own loop trains it.

Exercises what megatron-core 0.16.1 does with its defaults: ``initialize_model_parallel``
(``create_gloo_process_groups=True``: the ``_GLOO`` twins of its data-parallel groups),
``model_parallel_cuda_manual_seed`` (its CUDA RNG tracker), ``GPTModel`` with
``get_gpt_layer_local_spec()`` (no Transformer Engine), megatron's own
``DistributedDataParallel`` with a default ``DistributedDataParallelConfig``,
``get_megatron_optimizer`` (Adam), and ``get_forward_backward_func()`` with
``finalize_model_grads`` as the config's grad hook, ``--sequence-parallel`` to turn on SP.
It never imports meshscope. Written for CUDA + NCCL (megatron-core allocates on
``torch.cuda.current_device()``); on a machine without CUDA it runs only in a fake world.
Needs ``pip install megatron-core==0.16.1``.

One choice differs from megatron-core's defaults (its gradient clipping, ``clip_grad=1.0``, which
asserts ``grad.type() == 'torch.cuda.FloatTensor'`` at clip_grads.py:167, is kept). With
``--sequence-parallel``, the layer norms are the
script's own: without Apex the local spec's norm is ``WrappedTorchNorm``, which refuses sequence
parallelism (torch_norm.py:32), and ``FusedLayerNorm`` needs Apex; ``SequenceParallelLayerNorm``
below is torch's LayerNorm with its parameters marked as FusedLayerNorm marks them.

Launch (WORLD_SIZE divisible by --tp)::

    torchrun --nproc-per-node 4 tests/jobs/megatron_gpt.py [--tp 2] [--sequence-parallel]

Per step, per rank, with L = --layers (2), TP = --tp (2), the counts follow from megatron-core's
tensor_parallel/layers.py and mappings.py (read at 0.16.1):

* TP (no SP), on the tp group: forward 2L + 4 all_reduce: the embedding's
  ``reduce_from_tensor_model_parallel_region`` (1), each layer's two RowParallelLinear outputs
  (attention proj, fc2: 2L), and ``vocab_parallel_cross_entropy``'s max, predicted logit and sum
  of exponentials (3); backward 2L + 1 all_reduce: the input gradient of every ColumnParallelLinear
  (qkv, fc1 of each layer, and the output layer: ``allreduce_dgrad``).
* TP + SP, on the tp group: forward 3L + 1 all_gather, L + 1 reduce_scatter, 3 all_reduce: the
  embedding scatters to sequence shards (1 RS), each ColumnParallelLinear gathers its input
  (qkv, fc1, output layer: 2L + 1 AG), each RowParallelLinear reduce-scatters its output (2L RS),
  the cross entropy's 3 AR; backward: each ColumnParallelLinear gathers its input again for its
  weight gradient and reduce-scatters its input gradient (2L + 1 AG, 2L + 1 RS), each
  RowParallelLinear gathers its output gradient (2L AG), the embedding's scatter gathers its
  gradient back (1 AG); then ``finalize_model_grads``: 1 all_reduce of the layernorms' coalesced
  gradients (sequence-parallel parameters, summed over tp).
  So forward (2L + 1) AG, (2L + 1) RS, 3 AR; backward (4L + 2) AG, (2L + 1) RS; 1 AR after.
* DP, on the dp group (WORLD_SIZE / TP ranks; megatron's DDP with overlap_grad_reduce off keeps one
  bucket): 1 all_reduce of the gradient buffer in ``finish_grad_sync``.
"""

import argparse
import os
import sys
import warnings

import torch
import torch.distributed as dist

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
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """torch's LayerNorm with megatron-core's ``sequence_parallel`` mark on its parameters (as
    fused_layer_norm.py:90 sets it), so that ``finalize_model_grads`` sums their gradients over tp."""

    def __init__(self, config, hidden_size, eps=1e-5):
        super().__init__(hidden_size, eps=eps)
        for param in self.parameters():
            param.sequence_parallel = config.sequence_parallel


def layer_spec(args):
    """The local spec; under sequence parallelism with its norms (each layer's and the final one) SP's."""
    spec = get_gpt_layer_local_spec()
    if not args.sequence_parallel:
        return spec
    spec.submodules.input_layernorm = SequenceParallelLayerNorm
    spec.submodules.pre_mlp_layernorm = SequenceParallelLayerNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * args.layers, layer_norm=SequenceParallelLayerNorm)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    return p.parse_args()


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % args.tp:
        sys.exit("megatron_gpt.py needs WORLD_SIZE divisible by --tp (got WORLD_SIZE=%d, tp=%d)"
                 % (world, args.tp))
    if not torch.cuda.is_available():
        sys.exit("megatron_gpt.py needs CUDA (megatron-core allocates on torch.cuda.current_device())")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend="nccl")
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp)
    model_parallel_cuda_manual_seed(1234)

    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        tensor_model_parallel_size=args.tp, sequence_parallel=args.sequence_parallel,
        use_cpu_initialization=True, pipeline_dtype=torch.float32)
    model = GPTModel(config=config, transformer_layer_spec=layer_spec(args),
                     vocab_size=args.vocab, max_sequence_length=args.seq).cuda()
    model = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    config.no_sync_func = model.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3), [model])

    gen = torch.Generator().manual_seed(1000 + ps.get_data_parallel_rank())
    positions = torch.arange(args.seq).unsqueeze(0).expand(args.batch, -1).cuda()
    causal = (torch.tril(torch.ones(1, 1, args.seq, args.seq)) < 0.5).cuda()

    def batches():
        while True:
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen).cuda()
            yield tokens[:, :-1], tokens[:, 1:]

    def forward_step(data, model):
        tokens, labels = next(data)
        losses = model(tokens, positions, causal, labels=labels)

        def loss_func(output):
            loss = output.float().mean()
            return loss, {"lm loss": loss.detach()}

        return losses, loss_func

    forward_backward = get_forward_backward_func()
    data = batches()
    for step in range(args.steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        out = forward_backward(forward_step_func=forward_step, data_iterator=data, model=[model],
                               num_microbatches=1, seq_length=args.seq, micro_batch_size=args.batch,
                               forward_only=False)
        optimizer.step()
        if dist.get_rank() == 0:
            print("step %d loss %.4f" % (step, out[0]["lm loss"].item()), flush=True)

    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
