"""Hugging Face job: a tiny ``LlamaForCausalLM`` trained by transformers' ``Trainer`` under torchrun.

What every ``Trainer.train()`` does on a cluster, with its defaults: accelerate's ``PartialState``
initialises the process group (gloo on a CPU-only torch, nccl where CUDA answers), the model is
wrapped in torch's DDP (or, with ``--fsdp``, in FSDP2 by accelerate's ``fsdp2_prepare_model``), the
batch's label count is gathered before each step (``average_tokens_across_devices``), and each step's
loss and flops are gathered for the log (``logging_steps=1``). The model is built from a config in code
(nothing is downloaded), the data is generated token ids. It never imports meshscope.
Needs ``pip install transformers==5.25.0 accelerate==1.16.0`` (torch 2.13).

Launch::

    torchrun --nproc-per-node 2 tests/jobs/hf_trainer.py [--steps 3]
    # FSDP2 needs a CUDA device: accelerate keeps its FSDP plugin for MULTI_GPU-like states only
    # (accelerate/state.py:971, under the MULTI_GPU branch), so on a CPU-only torch --fsdp trains with
    # DDP; in a fake world, where CUDA is mapped to the CPU, it shards:
    meshscope trace --fake-world 1024 --ranks auto -- tests/jobs/hf_trainer.py --fsdp

Model (``LlamaConfig`` below): vocab 128, hidden 32, 2 layers, 2 heads, MLP 64, untied: 21
parameters, 28,832 fp32 (115,328 B): the embedding and ``lm_head`` 128 x 32 each; per layer q, k, v,
o 32 x 32, gate and up 64 x 32, down 32 x 64 and two norms of 32 (10,304); the final norm 32. Buffers:
the rotary embedding's ``inv_freq`` and ``original_inv_freq``, 8 fp32 each (64 B).

Independent facts (transformers 5.25.0, accelerate 1.16.0, torch 2.13; read from their code and
confirmed with a ``dist.*`` wrapper that prints each call's caller), per rank, all on the default group;
a step runs from one ``optimizer.step()`` to the next, so the log of step k opens step k + 1:

* DDP (default): set-up: DDP's parameter check (1 all_gather of 8 B, 1 broadcast of 592 B) and its
  broadcast of parameters and buffers (115,392 B). Every step (phase other unless said):
  - 1 all_gather of the batch's label count (int64, 8 B: trainer.py:2387 ``_get_num_items_in_batch``,
    through accelerate's ``gather``);
  - forward: 1 broadcast of the 2 buffers (64 B: DDP's ``broadcast_buffers=True``, its ``_pre_forward``
    -> ``_sync_buffers``, torch/nn/parallel/distributed.py:1782);
  - backward: 1 all_reduce of the one bucket (115,328 B; 25 MB cap) and 1 all_reduce of the 21-entry
    unused-parameter map (int32, 84 B): Trainer passes ``find_unused_parameters=True`` for a
    ``PreTrainedModel`` without activation checkpointing (trainer.py:754), which also means no bucket
    rebuild (reducer.cpp rebuilds only when static or not finding unused parameters);
  - after the step, the log: 1 all_gather of the loss (fp32, 4 B: trainer.py:2294 ``nested_gather``) and
    1 of the flops (fp32, 4 B: ``store_flos``, trainer.py:4261, ``distributed_broadcast_scalars``).
  The gradient clipping (``max_grad_norm=1.0``) is local under DDP. So the steady step (step 1 of 3):
  3 all_gather (4, 4, 8 B, other), 1 broadcast (64 B, forward), 2 all_reduce (115,328 B and 84 B,
  backward); the last step's log and ``train()``'s final ``store_flos`` (int64 8 B) end the run.
* ``--fsdp`` (FSDP2, ``fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": [...]}``):
  accelerate/utils/fsdp_utils.py:874 shards each ``LlamaDecoderLayer`` (reshard after forward),
  :885 the input embedding (reshard), :898 the tail ``[norm, lm_head]`` (``reshard_after_forward=False``),
  :904 the root (no parameters of its own: no call). Per steady step, on the default group:
  forward L + 2 = 4 all_gather (embedding, 2 layers, tail); backward L + 1 = 3 all_gather (the layers,
  the embedding) and L + 2 = 4 reduce_scatter; then 1 all_reduce of the 21 gradients' norms (fp32, 84 B:
  the clip, accelerator.py:2884 ``full_tensor()``, phase other); the 3 all_gathers of the log and label
  count as under DDP. FSDP2 shards each parameter's dim 0 in ceil(rows / W) rows per rank, so a unit's
  all_gather sends 4 * sum(ceil(rows / W) * cols) bytes and its reduce_scatter W times that:
  W = 2: embedding 8,192 B, layer 20,608 B, tail 8,256 B (reduce_scatter 16,384, 41,216, 16,512 B);
  W = 1024: embedding 128 B, layer 1,032 B, tail 132 B (reduce_scatter 131,072, 1,056,768, 135,168 B).

A fake world equals the gloo trace call for call (DDP; there the CUDA path: nccl, DDP with
``device_ids``).
"""

import argparse
import os
import tempfile
import time

import torch
from torch import distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    """`n` sequences of `seq` random token ids, each its own labels (causal LM)."""

    def __init__(self, n, seq, vocab):
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 through Trainer's fsdp_config (needs CUDA)")
    return p.parse_args()


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    fsdp = {}
    if args.fsdp:
        fsdp = {"fsdp": True, "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                              "reshard_after_forward": True}}
    training = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf_trainer_"), max_steps=args.steps,
                                 per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, report_to=[],
                                 save_strategy="no", use_cpu=not torch.cuda.is_available(),
                                 dataloader_num_workers=0, disable_tqdm=True, seed=0, **fsdp)
    trainer = Trainer(model=LlamaForCausalLM(config), args=training,
                      train_dataset=Tokens(2 * world * args.steps, 16, config.vocab_size))
    trainer.train()
    if dist.is_initialized():
        if dist.get_backend() == "gloo":
            time.sleep(0.5)  # tests/jobs/README.md, "Teardown on gloo"
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
