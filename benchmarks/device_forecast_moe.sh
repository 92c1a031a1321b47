#!/usr/bin/env bash
# An MoE block's forecast against the GPU it runs on (docs/forecast.md, "An MoE block on one GPU"):
# benchmarks/forecast_moe_layers.py (Qwen3 30B-A3B's blocks: 128 experts, 8 per token, eager grouped matmuls) timed
# by itself under torchrun at world 1 for each config (blocks x batch x seq), one step of each profiled by kernel
# class (benchmarks/forecast_step_kernels.py --model moe), and the first config forecast with its compute segments
# measured on this GPU (--measure-on cuda; on the spec of this GPU, h100-sxm or h200). The roofline's forecast of the
# same configs is made on a CPU (`meshscope forecast --fake-world 1 --cluster SPEC -- benchmarks/forecast_moe_layers.py
# ARGS --steps 5`).
# Run through the device tool from the repository root (PYTHONPATH=src: nothing is installed there); results in
# $OUT. CONFIGS picks configs (default "4x4x4096 2x4x4096 4x1x4096"); MEASURED=0 skips the measured forecast.
set -uo pipefail
WORK=/tmp/moe LIMIT=240
source benchmarks/device_forecast_common.sh
configs=${CONFIGS:-4x4x4096 2x4x4096 4x1x4096}
cluster=h100-sxm
grep -q H200 "$out/gpu.csv" && cluster=h200
for config in $configs; do
  IFS=x read -r layers batch seq <<< "$config"
  timeout 120 torchrun --standalone --nproc-per-node 1 benchmarks/forecast_moe_layers.py --layers "$layers" \
    --batch "$batch" --seq "$seq" --steps 10 >> "$out/moe_steps.txt" 2>> "$out/stderr.txt"
done
timeout 200 python3 benchmarks/forecast_step_kernels.py --model moe --configs "$(tr ' ' , <<< "$configs")" \
  > "$out/moe_kernels.txt" 2>> "$out/stderr.txt"
if [[ ${MEASURED:-1} == 1 ]]; then
  IFS=x read -r layers batch seq <<< "${configs%% *}"
  forecast moe_measured --fake-world 1 --measure-on cuda --cluster "$cluster" --tokens $((batch * seq)) -- \
    benchmarks/forecast_moe_layers.py --layers "$layers" --batch "$batch" --seq "$seq" --steps 5
fi
cat "$out/gpu.csv" "$out/torch.txt" "$out/moe_steps.txt" "$out/moe_kernels.txt" "$out/runs.txt" 2>/dev/null
tail -20 "$out/stderr.txt" 2>/dev/null
if [[ ${MEASURED:-1} == 1 ]]; then summary moe_measured; fi
