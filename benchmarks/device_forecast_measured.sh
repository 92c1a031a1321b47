#!/usr/bin/env bash
# `meshscope forecast --measure-on cuda` against the GPU it runs on (docs/forecast.md, "Measured compute"):
# each job timed by itself under torchrun at world 1, then forecast with each compute segment measured on the same
# GPU. tests/jobs/timed_steps.py (an fp32 MLP under DDP that prints its own step times) and
# benchmarks/forecast_llama_layers.py (Llama 3 8B blocks, bf16) at world 1 hold the forecast to the job's own step;
# the blocks under FSDP2 over a fake world of 8 give every rank class's kernels at its own shard shapes, one rank at
# a time on this GPU. Run through the device tool from the repository root (PYTHONPATH=src: nothing is installed
# there); results in $OUT. CASES picks cases (default "mlp1 w1 fsdp8"; "mlp1 w1" takes 430 s at most, "mlp1"
# 200 s, where less device time is left); all of them 570 s at most, inside the device tool's 600 s per command.
set -uo pipefail
WORK=/tmp/measured LIMIT=140
source benchmarks/device_forecast_common.sh
cases=" ${CASES:-mlp1 w1 fsdp8} "
mlp="tests/jobs/timed_steps.py --layers 4 --hidden 4096 --batch 8192"
llama="benchmarks/forecast_llama_layers.py --layers 4 --batch 1 --seq 8192"
[[ $cases == *" mlp1 "* ]] && \
  timeout 60 torchrun --standalone --nproc-per-node 1 $mlp --steps 12 > "$out/mlp_steps.txt" 2>> "$out/stderr.txt"
[[ $cases == *" w1 "* || $cases == *" fsdp8 "* ]] && \
  timeout 90 torchrun --standalone --nproc-per-node 1 $llama --steps 10 > "$out/llama_steps.txt" 2>> "$out/stderr.txt"
# mem: the blocks' own peak memory (allocated and reserved) under DDP and under FSDP2 at world 1, against the
# forecast's tensor bytes (made on a CPU: `meshscope forecast --fake-world 1 ... -- $llama8 [--fsdp]`)
llama8="benchmarks/forecast_llama_layers.py --layers 8 --batch 1 --seq 8192"
[[ $cases == *" mem "* ]] && for mode in "" "--fsdp"; do
  timeout 90 torchrun --standalone --nproc-per-node 1 $llama8 --steps 6 $mode >> "$out/memory.txt" 2>> "$out/stderr.txt"
done
for case in "mlp1|1|8192|$mlp --steps 6" "w1|1|8192|$llama --steps 6" "fsdp8|8|65536|$llama --fsdp --steps 5"; do
  IFS="|" read -r name world tokens args <<< "$case"
  [[ $cases == *" $name "* ]] || continue
  forecast "$name" --fake-world "$world" --measure-on cuda --cluster h100-sxm --tokens "$tokens" -- $args
done
cat "$out/gpu.csv" "$out/torch.txt" "$out/mlp_steps.txt" "$out/llama_steps.txt" "$out/memory.txt" "$out/runs.txt" 2>/dev/null
summary $cases
