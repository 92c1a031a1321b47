#!/usr/bin/env bash
# The forecast's compute model against one GPU (docs/forecast.md, "Compute on one H100"): Llama 3 8B blocks
# (benchmarks/forecast_llama_layers.py) timed for real under torchrun, each configuration alone, with the GPU's
# name, clocks and power limit beside them. Run through the device tool from the repository root; results in $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,clocks.max.mem,memory.total --format=csv > "$out/gpu.csv" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" > "$out/torch.txt" 2>&1
for cfg in "--layers 4 --batch 1 --seq 8192" "--layers 4 --batch 2 --seq 8192" "--layers 8 --batch 1 --seq 4096" \
           "--layers 8 --batch 4 --seq 2048"; do
  timeout 240 torchrun --standalone --nproc-per-node 1 benchmarks/forecast_llama_layers.py $cfg --steps 10 \
    >> "$out/steps.txt" 2>> "$out/stderr.txt"
done
cat "$out/gpu.csv" "$out/torch.txt" "$out/steps.txt"
