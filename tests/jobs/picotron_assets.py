"""picotron job: everything picotron's own ``train.py`` would download, written to a folder, so that it runs
unmodified on a tiny Llama with nothing downloaded (huggingface/picotron at 59714b1; tests/test_picotron.py).

Writes, under DIR (the working directory of the run: train.py:183 passes
``save_dir="./hf_model_safetensors/"``, relative to it):

* ``hf_model_safetensors/``: one model folder for picotron's three reads of ``config["model"]["name"]``,
  given as its absolute path: ``AutoConfig.from_pretrained`` (train.py:154), ``AutoTokenizer.from_pretrained``
  (data.py:25) and the weights, ``model.safetensors`` in Hugging Face's names (checkpoint.py:78-84);
  ``download_model`` (utils.py:101-107) finds ``os.path.join("hf_model", <absolute path>)/config.json``
  there and downloads nothing. A ``LlamaConfig`` (vocab 256, hidden 64, FFN 128, 4 layers, 4 heads, 2 KV
  heads), random weights from ``LlamaForCausalLM.save_pretrained``, and a word-level tokenizer of 256 ids;
* ``data/train.jsonl``: 400 generated documents in a ``text`` column (``load_dataset(DIR/data)``, data.py:21);
* ``config.json``: picotron's config (template/base_config.json's keys): ``--tp/--pp/--dp``, cp 1, 1F1B,
  micro batch 1, 2 gradient-accumulation steps (the pipeline's microbatches), sequence 32, 3 steps;
  ``use_cpu`` false (nccl, cuda, bf16: what a user runs on GPUs) unless ``--cpu``; ``FLASH_ATTEN`` "0"
  (picotron's CPU setting: tests/jobs/picotron_shim stands in for flash-attn, which it then never calls).

It imports transformers (picotron's pin, 4.47.0), tokenizers and torch, and never meshscope.

Launch (in DIR; tests/jobs/picotron_shim on the path for ``import flash_attn``)::

    python tests/jobs/picotron_assets.py DIR [--tp 2 --pp 2 --dp 2] [--cpu]
    cd DIR && HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled PYTHONPATH=.../tests/jobs/picotron_shim \\
        torchrun --nproc-per-node 8 PICOTRON/train.py --config config.json
"""

import argparse
import json
import random
from pathlib import Path

WORDS = [f"w{i}" for i in range(250)]
MODEL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2}


def write(where: Path, tp: int = 2, pp: int = 2, dp: int = 2, cpu: bool = False, steps: int = 3) -> Path:
    """Write the model folder, the documents and picotron's config into `where`; return the config's path."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    where = where.resolve()
    model, data = where / "hf_model_safetensors", where / "data"
    model.mkdir(parents=True, exist_ok=True)
    data.mkdir(exist_ok=True)
    vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2, "[PAD]": 3, **{w: 4 + i for i, w in enumerate(WORDS)}}
    vocab.update({f"x{i}": i for i in range(len(vocab), MODEL["vocab_size"])})  # vocab divisible by tp
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "[BOS]",
        "eos_token": "[EOS]", "pad_token": "[PAD]", "model_max_length": 4096}))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**MODEL, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                                 tie_word_embeddings=False)).save_pretrained(model, safe_serialization=True)
    rng = random.Random(0)
    (data / "train.jsonl").write_text("".join(
        json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(20, 120)))}) + "\n" for _ in range(400)))
    config = {
        "distributed": {"tp_size": tp, "cp_size": 1, "pp_size": pp, "dp_size": dp, "pp_engine": "1f1b",
                        "backend": "gloo" if cpu else "nccl", "use_cpu": cpu},
        "model": {"name": str(model), "num_hidden_layers": MODEL["num_hidden_layers"],
                  "num_attention_heads": MODEL["num_attention_heads"],
                  "num_key_value_heads": MODEL["num_key_value_heads"], "dtype": "bfloat16",
                  "use_flash_attention": False, "use_fused_adam": False},
        "training": {"seed": 42, "learning_rate": 3e-4, "total_train_steps": steps, "seq_length": 32,
                     "micro_batch_size": 1, "gradient_accumulation_steps": 2, "num_samples": None,
                     "max_tokens": None},
        "dataset": {"name": str(data), "subset_name": None, "num_workers": 0, "num_proc": 1},
        "checkpoint": {"save_dir": str(where / "ckpt"), "save_frequency": 1000, "load_path": ""},
        "logging": {"use_wandb": False, "project_name": "picotron", "run_name": "meshscope"},
        "environment": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "FLASH_ATTEN": "0",
                        "HF_TOKEN": "offline"},  # train.py:69-70 raises without one; nothing is downloaded
    }
    (where / "config.json").write_text(json.dumps(config, indent=2))
    return where / "config.json"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--cpu", action="store_true", help="picotron's use_cpu: gloo, cpu, fp32")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    print(write(args.dir, args.tp, args.pp, args.dp, args.cpu, args.steps))


if __name__ == "__main__":
    main()
