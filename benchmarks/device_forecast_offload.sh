#!/usr/bin/env bash
# FSDP2's CPU offload against the forecast (docs/forecast.md, "CPU offload on one H100"): the rate torch's AdamW
# reads and writes the forecast's counted elements on this GPU host's CPU (benchmarks/forecast_host_rate.py, fp32 and
# bf16, 1 and 16 threads),
# then benchmarks/forecast_llama_layers.py's Llama 3 8B blocks under FSDP2 at world 1 with and without
# CPUOffloadPolicy, each timed by itself under torchrun with one intra-op thread (OMP_NUM_THREADS=1, what torchrun
# gives each of several ranks a node). The roofline's forecast of the same jobs is made on a CPU (`meshscope
# forecast --fake-world 1 --cluster h100-sxm -- benchmarks/forecast_llama_layers.py ARGS --steps 5`).
# And the MoE blocks' permutation as torchtitan writes it (forecast_moe_layers.py --permutation torchtitan), timed
# and profiled by kernel class, beside the index_add_ one device_forecast_moe.sh measured.
# Run through the device tool from the repository root (PYTHONPATH=src: nothing is installed there); results in $OUT.
set -uo pipefail
WORK=/tmp/offload LIMIT=240
source benchmarks/device_forecast_common.sh
lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Socket" > "$out/cpu.txt" 2>&1
for dtype in float32 bfloat16; do
  timeout 60 python3 benchmarks/forecast_host_rate.py --threads 1,16 --dtype $dtype >> "$out/host_rate.txt" \
    2>> "$out/stderr.txt"
done
for offload in "" --cpu-offload; do
  OMP_NUM_THREADS=1 timeout 150 torchrun --standalone --nproc-per-node 1 benchmarks/forecast_llama_layers.py \
    --layers 2 --batch 1 --seq 8192 --fsdp $offload --steps 8 >> "$out/offload_steps.txt" 2>> "$out/stderr.txt"
done
timeout 90 torchrun --standalone --nproc-per-node 1 benchmarks/forecast_moe_layers.py --layers 4 --batch 4 \
  --seq 4096 --permutation torchtitan --steps 10 >> "$out/moe_steps.txt" 2>> "$out/stderr.txt"
timeout 90 python3 benchmarks/forecast_step_kernels.py --model moe-torchtitan --configs 4x4x4096 \
  > "$out/moe_kernels.txt" 2>> "$out/stderr.txt"
cat "$out/gpu.csv" "$out/torch.txt" "$out/cpu.txt" "$out/host_rate.txt" "$out/offload_steps.txt" "$out/moe_steps.txt" \
  "$out/moe_kernels.txt" 2>/dev/null
tail -20 "$out/stderr.txt" 2>/dev/null
