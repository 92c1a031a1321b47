#!/usr/bin/env bash
# A torch.compile'd job's forecast against the GPU it runs on (docs/forecast.md, "Compiled blocks on one GPU"):
# benchmarks/forecast_llama_layers.py's Llama 3 8B blocks (DDP, world 1) eager and with each block compiled
# (--compile: inductor's fused kernels), each timed by itself under torchrun, then one step of each profiled by
# kernel class (benchmarks/forecast_step_kernels.py). The roofline's forecasts of the same jobs are made on a CPU
# (`meshscope forecast --fake-world 1 --cluster SPEC -- benchmarks/forecast_llama_layers.py ARGS [--compile]
# --steps 5`), where a compiled call's forward and backward are counted as the kernels it fuses into.
# Run through the device tool from the repository root; results in $OUT. CONFIGS picks configs (blocks x batch x
# seq; default "4x2x8192 4x1x8192"); TITAN=1 times instead the 4-layer model trained as torchtitan trains the 8B
# (--torchtitan: FSDP2, selective op checkpointing, fused AdamW), eager and compiled, 2 x 8192.
set -uo pipefail
WORK=/tmp/compiled LIMIT=240
source benchmarks/device_forecast_common.sh
configs=${CONFIGS:-4x2x8192 4x1x8192}
if [[ ${TITAN:-0} == 1 ]]; then
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # as device_forecast_titan.sh runs it
  for mode in "" "--compile"; do
    timeout 240 torchrun --standalone --nproc-per-node 1 benchmarks/forecast_llama_layers.py --torchtitan --layers 4 \
      --batch 2 --seq 8192 --steps 10 $mode >> "$out/steps.txt" 2>> "$out/stderr.txt"
  done
  cat "$out/gpu.csv" "$out/torch.txt" "$out/steps.txt" 2>/dev/null
  tail -20 "$out/stderr.txt" 2>/dev/null
  exit 0
fi
for config in $configs; do
  IFS=x read -r layers batch seq <<< "$config"
  for mode in "" "--compile"; do
    timeout 240 torchrun --standalone --nproc-per-node 1 benchmarks/forecast_llama_layers.py --layers "$layers" \
      --batch "$batch" --seq "$seq" --steps 10 $mode >> "$out/steps.txt" 2>> "$out/stderr.txt"
  done
done
for mode in "" "--compile"; do
  timeout 240 python3 benchmarks/forecast_step_kernels.py --configs "$(tr ' ' , <<< "$configs")" $mode \
    >> "$out/kernels.txt" 2>> "$out/stderr.txt"
done
cat "$out/gpu.csv" "$out/torch.txt" "$out/steps.txt" "$out/kernels.txt" 2>/dev/null
tail -20 "$out/stderr.txt" 2>/dev/null
