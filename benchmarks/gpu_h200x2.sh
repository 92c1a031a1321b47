#!/usr/bin/env bash
# The measurements behind docs/results/h200x2.md, on one host with 2 NVIDIA GPUs (device kind
# nvidia-h200-x2). Run from the repository root: OUT=/some/dir bash benchmarks/gpu_h200x2.sh
# Every command writes its output under $OUT; raw traces and flight logs are deleted at the end
# (the fingerprints and timings they produced are kept in each run's result.json).
set -uo pipefail
: "${OUT:?set OUT to an output directory}"
export PYTHONPATH=src NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
ms="python3 -m meshscope"
step() { echo "== $(date -u +%T) $*" | tee -a "$OUT/commands.log"; "$@"; echo "   exit $?" | tee -a "$OUT/commands.log"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" > "$OUT/versions.txt"

# 1. collective sweep on the 2 GPUs and its alpha-beta fits
step $ms sweep --backend nccl --world 2 --iters 50 --warmup 10 --out "$OUT/sweep" > "$OUT/sweep.txt" 2>&1
# 2. every 2-rank variant, profiled: per-step timing (barrier + device sync before every step)
step $ms suite --backend nccl --world 2 --profile --rounds 2 --iters 100 --sweep "$OUT/sweep/sweep.json" \
    --out "$OUT/suite_per_step" > "$OUT/suite_per_step.txt" 2>&1
# 3. the same, timing 20 back-to-back steps per sample
step $ms suite --backend nccl --world 2 --rounds 2 --iters 30 --steps-per-sample 20 \
    --out "$OUT/suite_20_per_sample" > "$OUT/suite_20_per_sample.txt" 2>&1
# 4. the capture's overhead on the seed's TP step
step python3 benchmarks/bench_capture.py --backend nccl --iters 600 > "$OUT/capture_overhead.txt" 2>&1
rm -rf "$OUT"/*/traces "$OUT"/*/flight
