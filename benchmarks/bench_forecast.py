"""``meshscope forecast`` held against published step times: each row rebuilt from public configs, traced in a
fake world of its real size with fake tensors (``--work``), forecast on the cluster specs that describe the
hardware it was measured on, and printed beside the published figure with the error (docs/forecast.md).

Rows (the published figure, its source, and the job as its users start it):

- torchtitan Llama 3.1 8B, FSDP, bf16, selective op AC, local batch 2, seq 8192, on 8 and on 128 H100
  (torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3, row "FSDP": 5,762 and 5,605 TPS/GPU,
  82.4 and 67.0 GiB, torchtitan's logged memory: ``max_memory_reserved``, held against the forecast's reserved
  bytes; the job runs with expandable segments, as torchtitan's launcher ran it: `TITAN_ENV`). Their H100s are
  HBM2e 96 GB parts at 500 W whose bf16 peak the page puts between the SXM's and the NVL's: each row is forecast
  on both bounds (benchmarks/clusters/h100-grand-teton*.json).

- torchtitan Llama 3 70B, FSDP 32 x TP 8 (plain TP), full AC, local batch 16, seq 8192, on 256 of the same H100s
  (torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, "Vanilla TP", bfloat16: 597.3 TPS/GPU), under
  torch.compile as the page ran it (``--training.compile`` then, ``--compile.enable`` in torchtitan 0.2.2: the model's
  blocks and the loss), each compiled call's forward and backward counted as the kernels it fuses into.

- NeMo-Automodel Llama 3.1 70B pre-training, FSDP2 32 x CP 2 (context parallel over SDPA, all-gather rotation),
  activation checkpointing, local batch 1, global batch 128 (4 accumulated microbatches), seq 8192, on 64 DGX H100
  (NeMo-Automodel docs/performance-summary.mdx, pre-training table, row "Llama3 70B": 18.90 s per step; recipe
  examples/llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml). NeMo-Automodel is not
  installed here (its recipe needs Transformer Engine): the row is rebuilt on torchtitan's Llama 3 70B with the
  recipe's layout, batch, sequence and checkpointing, compiled as the recipe compiles (``enable_compile: True``;
  its optimizer is TE's FusedAdam, torchtitan's fused AdamW here).

- NeMo-Automodel Qwen3 30B-A3B pre-training (48 layers, 128 experts, top 8), expert parallel 8 x FSDP2 8 on 8 DGX
  H100, local batch 4, global batch 512 (16 accumulated microbatches), seq 4096, full activation checkpointing, a
  balanced fake gate (NeMo-Automodel docs/performance-summary.mdx, pre-training table, "Qwen3 30B-A3B": 21.773 s per
  step, 12,040 TPS/GPU; config examples/llm_benchmark/qwen/qwen3_moe_30b_te_deepep.yaml, with Transformer Engine and
  DeepEP). Rebuilt on torchtitan's qwen3 30B-A3B with its balanced routing (``--debug.moe_force_load_balance``),
  its all-to-all dispatch and grouped matmuls, traced eager with fake tensors (the routing follows from the job's
  numbers: trace/fake/known.py).

- GPT-3 175B (96 layers, hidden 12288, seq 2048) in megatron-core, as Megatron-LM's pretrain_gpt trains it
  (benchmarks/forecast_megatron_gpt.py): TP 8 x PP 8, an interleaved schedule, sequence parallel, selective
  recomputation, bf16, micro batch 1, on A100 80GB SXM:
  - on 64 GPUs, global batch 64, 96 heads, vocabulary 51,200, 12 virtual stages (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", arXiv 2205.05198: 13.75 s per iteration; 51.4 % MFU in Megatron-LM's README of May 2022, which that
    time and batch give exactly);
  - on 256 / 512 / 768 / 1,024 GPUs (data parallel 4 / 8 / 12 / 16), global batch 768, 128 heads, vocabulary
    64,000, 6 virtual stages, the distributed optimizer (Jiang et al. 2024, "MegaScale", NSDI '24, arXiv 2402.15627, its strong-scaling comparison's Megatron-LM rows:
    40.0 / 21.2 / 15.2 / 11.9 s per iteration). What each row assumes beyond its source is in `_gpt_175b`'s docstring.

torchtitan is run at the installed release (0.2.2 on the CI torch: ``-m torchtitan.train`` with its flags; the
page measured a late-2024 commit), on a word-level tokenizer and generated documents (tests/test_torchtitan.py's
assets: the model's vocabulary is the flavor's, 128,256, whatever the tokenizer's).

Run: python benchmarks/bench_forecast.py [--rows 8b-8,8b-128,70b-256,nemo70b-64,qwen3moe-8,gpt175b-64,...] [--keep DIR]. On this project's 2-core
box a torchtitan row traces in about a minute, a GPT-3 175B row in 19 (64 GPUs) to 115 minutes (MegaScale's
model with Megatron-LM's kernels: 1,024 GPUs 31, 768 GPUs 36, 2026-12-07 evening; with the fallbacks that morning,
512 GPUs 81 beside other work, 256 GPUs 115); since a forecast's trace traces every pipeline stage (2026-12-08),
twice the ranks: 1,024 GPUs 51 minutes (32 ranks, beside the test suite part of the time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "benchmarks" / "clusters"


@dataclass(frozen=True)
class Row:
    key: str
    what: str
    world: int
    job: tuple[str, ...]
    tokens: int
    """Tokens per step of the whole job."""
    published_tps: float | None
    """Tokens per second per GPU."""
    published_gib: float | None
    source: str
    clusters: tuple[str, ...]
    published_step_s: float | None = None
    """Seconds per iteration, where the source gives that rather than a throughput."""
    assets: bool = True
    """The job reads tests/test_torchtitan.py's assets (a tokenizer and documents) from its directory."""
    env: tuple[tuple[str, str], ...] = ()
    """The job's environment beyond the bench's, as its launcher sets it."""


TITAN_ENV = (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)
"""What torchtitan's launcher exported when its rows were measured (run_llama_train.sh at its 2024-12-19 commit
ba24697, since 2024-10-22's "Use expandable segments in run_llama_train.sh"; run_train.sh today): the caching
allocator's reserved memory, which the rows publish, depends on it."""


def _titan_8b(world: int) -> tuple[str, ...]:
    return ("-m", "torchtitan.train", "--model.flavor", "8B", "--model.hf_assets_path", "tokenizer",
            "--training.dataset", "c4_test", "--training.dataset_path", "c4", "--training.steps", "4",
            "--training.seq_len", "8192", "--training.local_batch_size", "2", "--activation_checkpoint.mode",
            "selective", "--activation_checkpoint.selective_ac_option", "op", "--metrics.log_freq", "1")


def _titan_70b(*parallel: str, local_batch: int, global_batch: int | None = None) -> tuple[str, ...]:
    return ("-m", "torchtitan.train", "--model.flavor", "70B", "--model.hf_assets_path", "tokenizer",
            "--training.dataset", "c4_test", "--training.dataset_path", "c4", "--training.steps", "4",
            "--training.seq_len", "8192", "--training.local_batch_size", str(local_batch),
            *(("--training.global_batch_size", str(global_batch)) if global_batch else ()), *parallel,
            "--activation_checkpoint.mode", "full", "--metrics.log_freq", "1")


MEGATRON_GPT = ROOT / "benchmarks" / "forecast_megatron_gpt.py"


def _gpt_175b(dp: int, global_batch: int, megascale: bool) -> tuple[str, ...]:
    """GPT-3 175B on TP 8 x PP 8 x `dp` GPUs in megatron-core, as Megatron-LM's pretrain_gpt trains it.

    Korthikanti et al.'s row: 96 layers, hidden 12288, 96 heads, seq 2048, vocab 51,200 (their Table 1 and
    Megatron-LM's README), TP 8 x PP 8, micro batch 1, batch 64, sequence parallelism and selective recomputation;
    assumed: 12 virtual stages of one layer (the paper gives none; NVIDIA's NeMo-Megatron-Launcher
    conf/training/gpt3/175b.yaml, PP 8, sets virtual_pipeline_model_parallel_size 12, "set to maximum").
    MegaScale's rows (arXiv 2402.15627v1): 96 layers, hidden 12288, 128 heads, TP 8 x PP 8 (Table 1), sequence
    2,048, vocabulary 64,000 (padded as Megatron-LM pads it, to a multiple of 128 x TP: 64,512), six interleaved
    stages (section 6.1), batch 768 (Table 2); assumed: the distributed optimizer (its Figure 1 draws data
    parallelism as ZeRO-2), sequence parallelism, selective recomputation, micro batch 1 (not given). Assumed for
    all: batched point-to-point calls (the launcher file's batch_p2p_comm; Megatron-LM's only mode in 2022, and at
    MegaScale's baseline commit 285068c8, whose p2p_communication.py waits for them and synchronizes the device),
    the word embeddings tied (Megatron-LM's default), dropout 0.1, learned positions, no overlap of the
    data-parallel gradient reduction (Megatron-LM's default; 285068c8 has no option for it). Megatron-LM's fused
    masked softmax and gradient-accumulation fusion on, as its defaults have them (one operator stands in for each
    kernel where Apex is not installed: megatron_fused_kernels.py); its jit-fused bias-GeLU and bias-dropout-add run
    eagerly in the fake world, counted as the kernel each compiles to (`capture.work.run_compiled`), and attention
    is unfused (no flash attention: MegaScale counts FlashAttention-2 among its own changes)."""
    heads, vocab, vpp = ("128", "64512", "6") if megascale else ("96", "51200", "12")
    return (str(MEGATRON_GPT), "--tp", "8", "--pp", "8", "--vpp", vpp, "--layers", "96", "--hidden", "12288",
            "--heads", heads, "--seq", "2048", "--vocab", vocab, "--micro-batch", "1", "--global-batch",
            str(global_batch), "--sequence-parallel", "--no-overlap-p2p", "--steps", "3",
            *(["--distributed-optimizer"] if megascale else []))


KORTHIKANTI = "Korthikanti et al. 2022 (arXiv 2205.05198), 175B, sequence parallel + selective recompute"
MEGASCALE = "Jiang et al. 2024, MegaScale (NSDI '24, arXiv 2402.15627), strong scaling, Megatron-LM, 175B"
TEN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
GRAND_TETON = (str(CLUSTERS / "h100-grand-teton.json"), str(CLUSTERS / "h100-grand-teton-nvl.json"))
ROWS = {r.key: r for r in (
    Row("8b-8", "torchtitan Llama 3.1 8B, FSDP 8, selective op AC, batch 2 x 8192", 8, _titan_8b(8), 8 * 2 * 8192,
        5762, 82.4, f"{TEN}, Table 1, FSDP", GRAND_TETON, env=TITAN_ENV),
    Row("8b-128", "torchtitan Llama 3.1 8B, FSDP 128, selective op AC, batch 2 x 8192", 128, _titan_8b(128),
        128 * 2 * 8192, 5605, 67.0, f"{TEN}, Table 3, FSDP", GRAND_TETON, env=TITAN_ENV),
    Row("70b-256", "torchtitan Llama 3 70B, FSDP 32 x TP 8, full AC, batch 16 x 8192 per data-parallel rank", 256,
        _titan_70b("--parallelism.data_parallel_shard_degree", "32", "--parallelism.tensor_parallel_degree", "8",
                   "--compile.enable", local_batch=16), 32 * 16 * 8192, 597.3, None,
        "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, Llama3 70b, vanilla TP, bfloat16",
        GRAND_TETON, env=TITAN_ENV),
    Row("nemo70b-64", "Llama 3.1 70B as NeMo-Automodel's recipe, FSDP 32 x CP 2, full AC, batch 128 x 8192 "
        "(4 microbatches of 1 per rank pair)", 64,
        _titan_70b("--parallelism.data_parallel_shard_degree", "32", "--parallelism.context_parallel_degree", "2",
                   "--compile.enable", local_batch=1, global_batch=128), 128 * 8192, None, None,
        "NeMo-Automodel docs/performance-summary.mdx, pre-training (DGX-H100, BF16), Llama3 70B", ("h100-sxm",),
        published_step_s=18.90),
    Row("qwen3moe-8", "Qwen3 30B-A3B as NeMo-Automodel's benchmark, EP 8 x FSDP 8, balanced routing, full AC, "
        "batch 512 x 4096 (16 microbatches of 4 per rank)", 8,
        ("-m", "torchtitan.train", "--model.name", "qwen3", "--model.flavor", "30B-A3B", "--model.hf_assets_path",
         "tokenizer", "--training.dataset", "c4_test", "--training.dataset_path", "c4", "--training.steps", "4",
         "--training.seq_len", "4096", "--training.local_batch_size", "4", "--training.global_batch_size", "512",
         "--parallelism.data_parallel_shard_degree", "8", "--parallelism.expert_parallel_degree", "8",
         "--debug.moe_force_load_balance", "--activation_checkpoint.mode", "full", "--metrics.log_freq", "1"),
        512 * 4096, 12040, None, "NeMo-Automodel docs/performance-summary.mdx, pre-training (DGX-H100, BF16), "
        "Qwen3 30B-A3B", ("h100-sxm",), published_step_s=21.773),
    Row("gpt175b-64", "Megatron GPT-3 175B, TP 8 x PP 8 (12 virtual stages), SP + selective recompute, batch 64 x 2048",
        64, _gpt_175b(1, 64, False), 64 * 2048, None, None, KORTHIKANTI, ("a100-sxm",), published_step_s=13.75,
        assets=False),
    *(Row(f"gpt175b-{world}", f"Megatron GPT-3 175B as MegaScale's, TP 8 x PP 8 (6 virtual stages) x DP "
          f"{world // 64}, distributed optimizer, batch 768 x 2048", world, _gpt_175b(world // 64, 768, True),
          768 * 2048, None, None, MEGASCALE, ("a100-sxm",), published_step_s=step, assets=False)
      for world, step in ((256, 40.0), (512, 21.2), (768, 15.2), (1024, 11.9))),
)}


def _error(value: float, published: float | None) -> float | None:
    return None if published is None else (value - published) / published


def run_row(row: Row, where: Path) -> list[dict]:
    work = where / row.key
    work.mkdir(parents=True)
    if row.assets:
        sys.path.insert(0, str(ROOT))
        from tests.test_torchtitan import make_assets

        make_assets(work)
    trace_dir = work / "trace"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "meshscope", "trace", "--fake-world", str(row.world), "--fake-tensors",
                           "--work", "--out", str(trace_dir), "--", *row.job], cwd=work, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True,
                          env={**os.environ, **dict(row.env), "PYTHONPATH": str(ROOT / "src")})
    traced_s = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"{row.key}: the trace failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return []
    out = []
    for cluster in row.clusters:
        proc = subprocess.run([sys.executable, "-m", "meshscope", "forecast", "--from-trace", str(trace_dir),
                               "--cluster", cluster, "--tokens", str(row.tokens), "--json"], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if proc.returncode != 0:
            print(f"{row.key} on {cluster}: forecast failed: {proc.stderr[-2000:]}")
            continue
        doc = json.loads(proc.stdout)
        peak = max(c["peak_bytes"] for c in doc["classes"]) / 2**30
        reserved = max(c["reserved_bytes"] for c in doc["classes"]) / 2**30
        tps = doc["tokens_per_s_per_gpu"]
        out.append({"row": row.key, "cluster": doc["cluster"]["name"], "traced_s": traced_s, "step_s": doc["step_s"],
                    "step_error": _error(doc["step_s"], row.published_step_s), "tps": tps,
                    "tps_error": _error(tps, row.published_tps), "peak_gib": peak, "reserved_gib": reserved,
                    "gib_error": _error(reserved, row.published_gib),
                    "exposed_s": max(sum(a["exposed_s"] for a in c["axes"]) for c in doc["classes"])})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    p.add_argument("--keep", type=Path, default=None, help="keep the traces under this directory")
    args = p.parse_args()
    import torch

    try:
        from importlib.metadata import version
        titan = version("torchtitan")
    except Exception:  # noqa: BLE001 - reported as missing
        titan = "not installed"
    print(f"machine: {platform.node()} ({os.cpu_count()} cores), Python {platform.python_version()}, torch "
          f"{torch.__version__}, torchtitan {titan}, load {os.getloadavg()[0]:.1f}")
    where = args.keep or Path(tempfile.mkdtemp(prefix="bench-forecast-"))
    results = []
    for key in args.rows.split(","):
        if key not in ROWS:
            sys.exit(f"--rows: unknown row {key!r}; rows: {', '.join(ROWS)}")
        row = ROWS[key]
        published = [f"{row.published_tps:,g} TPS/GPU" if row.published_tps is not None else "",
                     f"{row.published_step_s} s per iteration" if row.published_step_s is not None else "",
                     f"{row.published_gib} GiB" if row.published_gib is not None else ""]
        print(f"{row.key}: {row.what}; published {', '.join(p for p in published if p)} ({row.source})", flush=True)
        for r in run_row(row, where):
            results.append(r)
            err = {k: f" ({r[k]:+.1%})" if r[k] is not None else "" for k in ("step_error", "tps_error", "gib_error")}
            print(f"  {r['cluster']:24s} step {r['step_s']:.3f} s{err['step_error']}  {r['tps']:,.0f} TPS/GPU"
                  f"{err['tps_error']}  peak {r['peak_gib']:.1f} GiB, reserved {r['reserved_gib']:.1f} GiB"
                  f"{err['gib_error']}  exposed comm "
                  f"{r['exposed_s'] * 1e3:.0f} ms  (traced in {r['traced_s']:.0f} s)", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
