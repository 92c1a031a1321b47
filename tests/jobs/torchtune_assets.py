"""torchtune job: the assets that torchtune 0.6.1's own ``full_finetune_distributed`` recipe needs, written
to a folder, so that the recipe runs unmodified on a tiny Llama 2 with nothing downloaded.

Writes DIR/tokenizer.model (a SentencePiece BPE model trained here on generated text: ``llama2_tokenizer``),
DIR/data.json (generated documents: ``text_completion_dataset`` from local JSON lines), DIR/model/model.pt
(a seeded random state dict in torchtune's own key names: ``FullModelTorchTuneCheckpointer``) and
DIR/config.yaml (the recipe's config: ``torchtune.models.llama2.llama2`` with the shapes below, fp32, AdamW,
``CEWithChunkedOutputLoss``, batch 2, ``max_steps_per_epoch`` steps, one epoch). It imports sentencepiece
and torch, not torchtune, and never meshscope. Needs ``pip install torchtune==0.6.1 torchao==0.10.0``
(torchtune 0.6.1 imports ``torchao.dtypes.nf4tensor``, which torchao 0.11 and later no longer have).

Launch (the recipe is the file ``tune run`` runs: ``recipes/full_finetune_distributed.py`` next to the
installed ``torchtune`` package; ``recipes`` refuses to be imported, so not ``-m``)::

    python tests/jobs/torchtune_assets.py DIR --device cuda [--tp 2] [--world N]
    tune run --nproc_per_node 2 full_finetune_distributed --config DIR/config.yaml
    meshscope trace --fake-world 1024 --ranks auto -- SITE/recipes/full_finetune_distributed.py --config DIR/config.yaml

``--device cpu`` does not run: the recipe asks rank 0 for memory statistics after loading the model
(full_finetune_distributed.py:628, unconditionally), which torchtune refuses on a CPU device
(training/memory.py:264, "Logging memory stats is not supported on CPU devices"). So only the CUDA path
is traced, in a fake world, and the counts below are the oracle.

Model (vocab 256, dim 32, 2 layers, 4 heads, 2 KV heads, FFN 64; fp32): the embedding and ``output``
256 x 32 each, the final norm 32; per layer q 32 x 32, k and v 16 x 32, output_proj 32 x 32, w1 and w3
64 x 32, w2 32 x 64, two norms of 32: 9,280 parameters (37,120 B).

Independent facts (torchtune 0.6.1 and torch 2.13), per rank and steady step, FSDP over the world
(``tensor_parallel_dim`` 1, mesh ("dp", "tp") = (W, 1)):

* units: ``training.shard_model`` (training/_distributed.py:557-568) shards each ``layers.i``, then the
  root (embedding, final norm, ``output``), all with ``reshard_after_forward=True`` (recipe line 299);
* dp: forward L + 1 = 3 all_gather (root, 2 layers); backward L + 1 = 3 all_gather (root, layers in
  reverse: every unit was resharded, the root too) and L + 1 = 3 reduce_scatter; then, at the
  optimizer step, 2 all_reduce on the default group: the token count (int64, 8 B) and the summed loss
  (fp32, 4 B), full_finetune_distributed.py:824 and :826 (phase other: before ``optimizer.step()``);
* each unit's all_gather sends 4 * sum(ceil(rows / W) * cols) bytes (FSDP2 shards dim 0, padded), its
  reduce_scatter W times that: W = 2: root 32,832 B, layer 18,560 B (reduce_scatter 65,664 and 37,120);
  W = 1024: root 260 B, layer 1,032 B (reduce_scatter 266,240 and 1,056,768);
* set-up: ``load_from_full_model_state_dict`` scatters the 21 tensors from rank 0 (21 scatter), the
  recipe's barrier (line 632); the end of the epoch gathers the full state dict for rank 0's checkpoint
  (``gather_cpu_state_dict``, training/_distributed.py:367-382: one all_gather and one barrier per
  tensor) and the optimizer's.
"""

import argparse
import json
import random
from pathlib import Path

WORDS = [f"w{i}" for i in range(150)]
MODEL = {"vocab_size": 256, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 32, "max_seq_len": 64,
         "intermediate_dim": 64}


def state_dict(seed: int = 0) -> dict:
    """``torchtune.models.llama2.llama2(**MODEL).state_dict()``'s keys and shapes, seeded random values
    (the recipe loads them with ``strict=True``, so a missing or extra key fails the run)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    dim, ffn, vocab = MODEL["embed_dim"], MODEL["intermediate_dim"], MODEL["vocab_size"]
    kv = dim // MODEL["num_heads"] * MODEL["num_kv_heads"]
    shapes = {"tok_embeddings.weight": (vocab, dim)}
    for i in range(MODEL["num_layers"]):
        shapes.update({f"layers.{i}.attn.q_proj.weight": (dim, dim), f"layers.{i}.attn.k_proj.weight": (kv, dim),
                       f"layers.{i}.attn.v_proj.weight": (kv, dim), f"layers.{i}.attn.output_proj.weight": (dim, dim),
                       f"layers.{i}.mlp.w1.weight": (ffn, dim), f"layers.{i}.mlp.w2.weight": (dim, ffn),
                       f"layers.{i}.mlp.w3.weight": (ffn, dim), f"layers.{i}.sa_norm.scale": (dim,),
                       f"layers.{i}.mlp_norm.scale": (dim,)})
    shapes.update({"norm.scale": (dim,), "output.weight": (vocab, dim)})
    return {k: (torch.ones(s) if k.endswith("scale") else 0.02 * torch.randn(s, generator=gen))
            for k, s in shapes.items()}


def write(where: Path, device: str = "cuda", steps: int = 3, tp: int = 1, world: int = 2) -> Path:
    """Write the tokenizer, documents, checkpoint and config into `where`; return the config's path."""
    import sentencepiece as spm
    import torch

    where = where.resolve()
    (where / "model").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    # Enough documents for `steps` batches of 2 on every data-parallel rank (the sampler drops the rest).
    docs = [" ".join(rng.choices(WORDS, k=rng.randint(8, 24))) for _ in range(max(400, 2 * steps * world // tp))]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(docs[:400]), model_prefix=str(where / "tokenizer"),
                                   vocab_size=160, hard_vocab_limit=False, model_type="bpe", unk_id=0, bos_id=1,
                                   eos_id=2, pad_id=-1, minloglevel=2)
    (where / "data.json").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    torch.save(state_dict(), where / "model" / "model.pt")
    model = "".join(f"  {k}: {v}\n" for k, v in MODEL.items())
    parallel = (f"tensor_parallel_dim: {tp}\ntensor_parallel_plan:\n"
                f"  _component_: torchtune.models.llama3.base_llama_tp_plan\n") if tp > 1 else ""
    (where / "config.yaml").write_text(f"""\
output_dir: {where}/out
tokenizer:
  _component_: torchtune.models.llama2.llama2_tokenizer
  path: {where}/tokenizer.model
  max_seq_len: 32
  prompt_template: null
dataset:
  _component_: torchtune.datasets.text_completion_dataset
  source: json
  data_files: {where}/data.json
  column: text
  split: train
seed: 0
shuffle: True
model:
  _component_: torchtune.models.llama2.llama2
{model}checkpointer:
  _component_: torchtune.training.FullModelTorchTuneCheckpointer
  checkpoint_dir: {where}/model
  checkpoint_files: [model.pt]
  recipe_checkpoint: null
  output_dir: {where}/out
  model_type: LLAMA2
resume_from_checkpoint: False
batch_size: 2
epochs: 1
max_steps_per_epoch: {steps}
gradient_accumulation_steps: 1
optimizer:
  _component_: torch.optim.AdamW
  lr: 2e-5
  fused: False
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
device: {device}
dtype: fp32
enable_activation_checkpointing: False
clip_grad_norm: null
compile: False
{parallel}metric_logger:
  _component_: torchtune.training.metric_logging.DiskLogger
  log_dir: {where}/out/logs
log_every_n_steps: 1
log_peak_memory_stats: False
""")
    return where / "config.yaml"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--device", default="cuda", help="the recipe's device (cpu fails in the recipe: the docstring)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_dim (torchtune's llama TP plan)")
    p.add_argument("--world", type=int, default=2, help="the world the documents must cover")
    args = p.parse_args()
    print(write(args.dir, args.device, args.steps, args.tp, args.world))


if __name__ == "__main__":
    main()
