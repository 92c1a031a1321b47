#!/usr/bin/env bash
# `meshscope forecast --measure-on cuda` against the GPU it runs on (docs/forecast.md, "Measured compute"):
# benchmarks/forecast_llama_layers.py (Llama 3 8B blocks) timed by itself under torchrun at world 1, then forecast
# with each compute segment measured on the same GPU (world 1: the job's own step; FSDP2 over a fake world of 8:
# every rank class's kernels at its own shard shapes, one rank at a time on this GPU). Run through the device tool
# from the repository root (PYTHONPATH=src: nothing is installed there); results in $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONPATH=src
out=${OUT:-/tmp/out}
work=/tmp/measured
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > "$out/gpu.csv" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" > "$out/torch.txt" 2>&1
job="benchmarks/forecast_llama_layers.py --layers 4 --batch 1 --seq 8192"
timeout 150 torchrun --standalone --nproc-per-node 1 $job --steps 10 >> "$out/steps.txt" 2>> "$out/stderr.txt"
for case in "w1|1|$job --steps 6" "fsdp8|8|$job --fsdp --steps 5"; do
  IFS="|" read -r name world args <<< "$case"
  start=$(date +%s.%N)
  timeout 240 python3 -m meshscope forecast --fake-world "$world" --measure-on cuda --cluster h100-sxm \
    --tokens $((world * 8192)) --out "$work/$name" --json -- $args > "$out/$name.json" 2>> "$out/$name.stderr"
  echo "$name rc=$? wall_s=$(echo "$(date +%s.%N) - $start" | bc)" >> "$out/runs.txt"
  mkdir -p "$out/$name" && cp -r "$work/$name/work" "$work/$name/result.json" "$out/$name/" 2>/dev/null
  grep -h "step_ms\|Error" "$work/$name"/logs/rank*.log | tail -3 >> "$out/runs.txt"
done
cat "$out/gpu.csv" "$out/torch.txt" "$out/steps.txt" "$out/runs.txt"
for name in w1 fsdp8; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], 'step_s', d['step_s'], [(c['rank'], c['compute_s'], c['exposed_s'], c['peak_bytes']/2**30) for c in d['classes']], d['compute_source'][:90])" "$out/$name.json" 2>&1 | tail -1
done
