"""``meshscope forecast`` held against published step times: each row rebuilt from public configs, traced in a
fake world of its real size with fake tensors (``--work``), forecast on the cluster specs that describe the
hardware it was measured on, and printed beside the published figure with the error (docs/forecast.md).

Rows (the published figure, its source, and the job as its users start it):

- torchtitan Llama 3.1 8B, FSDP, bf16, selective op AC, local batch 2, seq 8192, on 8 and on 128 H100
  (torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3, row "FSDP": 5,762 and 5,605 TPS/GPU,
  82.4 and 67.0 GiB). Their H100s are HBM2e 96 GB parts at 500 W whose bf16 peak the page puts between the SXM's
  and the NVL's: each row is forecast on both bounds (benchmarks/clusters/h100-grand-teton*.json).

torchtitan is run at the installed release (0.2.2 on the CI torch: ``-m torchtitan.train`` with its flags; the
page measured a late-2024 commit), on a word-level tokenizer and generated documents (tests/test_torchtitan.py's
assets: the model's vocabulary is the flavor's, 128,256, whatever the tokenizer's).

Run: python benchmarks/bench_forecast.py [--rows 8b-8,8b-128] [--keep DIR]
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
    published_tps: float
    """Tokens per second per GPU."""
    published_gib: float
    source: str
    clusters: tuple[str, ...]


def _titan_8b(world: int) -> tuple[str, ...]:
    return ("-m", "torchtitan.train", "--model.flavor", "8B", "--model.hf_assets_path", "tokenizer",
            "--training.dataset", "c4_test", "--training.dataset_path", "c4", "--training.steps", "4",
            "--training.seq_len", "8192", "--training.local_batch_size", "2", "--activation_checkpoint.mode",
            "selective", "--activation_checkpoint.selective_ac_option", "op", "--metrics.log_freq", "1")


TEN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
GRAND_TETON = (str(CLUSTERS / "h100-grand-teton.json"), str(CLUSTERS / "h100-grand-teton-nvl.json"))
ROWS = {r.key: r for r in (
    Row("8b-8", "torchtitan Llama 3.1 8B, FSDP 8, selective op AC, batch 2 x 8192", 8, _titan_8b(8), 8 * 2 * 8192,
        5762, 82.4, f"{TEN}, Table 1, FSDP", GRAND_TETON),
    Row("8b-128", "torchtitan Llama 3.1 8B, FSDP 128, selective op AC, batch 2 x 8192", 128, _titan_8b(128),
        128 * 2 * 8192, 5605, 67.0, f"{TEN}, Table 3, FSDP", GRAND_TETON),
)}


def run_row(row: Row, where: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from tests.test_torchtitan import make_assets

    work = where / row.key
    work.mkdir(parents=True)
    make_assets(work)
    trace_dir = work / "trace"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "meshscope", "trace", "--fake-world", str(row.world), "--fake-tensors",
                           "--work", "--out", str(trace_dir), "--json", "--", *row.job], cwd=work, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
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
        tps = doc["tokens_per_s_per_gpu"]
        out.append({"row": row.key, "cluster": doc["cluster"]["name"], "traced_s": traced_s, "step_s": doc["step_s"],
                    "tps": tps, "tps_error": (tps - row.published_tps) / row.published_tps, "peak_gib": peak,
                    "gib_error": (peak - row.published_gib) / row.published_gib,
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
        print(f"{row.key}: {row.what}; published {row.published_tps:,.0f} TPS/GPU, {row.published_gib} GiB ({row.source})",
              flush=True)
        for r in run_row(row, where):
            results.append(r)
            print(f"  {r['cluster']:24s} step {r['step_s']:.3f} s  {r['tps']:,.0f} TPS/GPU ({r['tps_error']:+.1%})  "
                  f"peak {r['peak_gib']:.1f} GiB ({r['gib_error']:+.1%})  exposed comm {r['exposed_s'] * 1e3:.0f} ms  "
                  f"(traced in {r['traced_s']:.0f} s)", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
