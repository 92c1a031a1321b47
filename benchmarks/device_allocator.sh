#!/usr/bin/env bash
# The CUDA caching allocator's reserved memory against the forecast's model of it (docs/forecast.md, "Reserved memory"):
# benchmarks/forecast_allocator_trace.py records every allocation request and segment of the Llama 3 8B blocks
# (8 blocks, 1 x 8192, bf16, AdamW, world 1) under DDP and FSDP2, with the allocator's defaults and with
# expandable segments (torchtitan's run_train.sh sets PYTORCH_ALLOC_CONF=expandable_segments:True). On an H100 it
# first profiles a whole step's kernels by class (benchmarks/forecast_step_kernels.py: the H100 profile
# docs/forecast.md waits for; an H200's is docs/results/forecast/step_kernels_h200.txt). Run through the device
# tool from the repository root; results in $OUT (replay them with benchmarks/forecast_allocator_replay.py).
set -uo pipefail
WORK=/tmp/allocator LIMIT=120
source benchmarks/device_forecast_common.sh
if grep -q H100 "$out/gpu.csv"; then
  timeout 300 python3 benchmarks/forecast_step_kernels.py > "$out/step_kernels.txt" 2>> "$out/stderr.txt"
fi
for mode in ddp fsdp; do
  for conf in "" "expandable_segments:True"; do
    name=$mode${conf:+_expandable} flag=""
    [[ $mode == fsdp ]] && flag=--fsdp
    PYTORCH_ALLOC_CONF=$conf PYTORCH_CUDA_ALLOC_CONF=$conf timeout "$LIMIT" torchrun --standalone --nproc-per-node 1 \
      benchmarks/forecast_allocator_trace.py --out "$out/alloc_$name.json" $flag \
      >> "$out/allocator.txt" 2>> "$out/stderr.txt"
  done
done
gzip "$out"/alloc_*.json
cat "$out/gpu.csv" "$out/torch.txt" "$out/allocator.txt" "$out/step_kernels.txt" 2>/dev/null | head -40
