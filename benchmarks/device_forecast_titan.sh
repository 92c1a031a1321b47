#!/usr/bin/env bash
# The 8B rows' rank classes measured on one GPU (docs/forecast.md, "The 8B row's rank classes on one GPU"):
# benchmarks/forecast_llama_layers.py --torchtitan is Llama 3.1 8B trained as torchtitan trains it in
# bench_forecast.py's 8B rows (FSDP2 in bf16 mixed precision, selective op checkpointing, batch 2 x 8192), in plain
# torch, since torchtitan's own loop needs packages this image lacks (tokenizers, datasets). Cases (CASES, default
# "w1 w8"):
#   w1     4 layers at world 1, timed by itself under torchrun, then forecast with its compute measured on this GPU;
#   w8     all 32 layers over a fake world of 8 (the 8B row's size), each rank class measured on this GPU;
#   w1024  the same over a fake world of 1,024: the wall time of a 1,024-rank forecast with --measure-on cuda.
# The roofline's forecasts of the same jobs are made on a CPU (`meshscope forecast --fake-world N --cluster
# h100-sxm -- benchmarks/forecast_llama_layers.py --torchtitan ARGS`). Run through the device tool from the
# repository root (PYTHONPATH=src: nothing is installed there); results in $OUT. "w1 w8" took 267 s on an H200,
# "w8 w1024" 291 s on an H100 (2026-12-07): each pair fits the device tool's 600 s per command.
set -uo pipefail
WORK=/tmp/titan LIMIT=${LIMIT:-420}
source benchmarks/device_forecast_common.sh
# torchtitan's launcher sets it (bench_forecast.py's TITAN_ENV); the forecast's reserved memory follows it too
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
cases=" ${CASES:-w1 w8} "
# the spec of the GPU measured, which times the communication (an H200 where the tool lends one)
cluster=h100-sxm
grep -q H200 "$out/gpu.csv" && cluster=h200
job="benchmarks/forecast_llama_layers.py --torchtitan --seq 8192"
[[ $cases == *" w1 "* ]] && \
  timeout 120 torchrun --standalone --nproc-per-node 1 $job --layers 4 --batch 2 --steps 10 > "$out/w1_steps.txt" \
    2>> "$out/stderr.txt"
for case in "w1|1|16384|--layers 4 --batch 2" "w8|8|131072|--layers 32 --batch 2" \
            "w1024|1024|16777216|--layers 32 --batch 2"; do
  IFS="|" read -r name world tokens args <<< "$case"
  [[ $cases == *" $name "* ]] || continue
  forecast "$name" --fake-world "$world" --measure-on cuda --cluster "$cluster" --tokens "$tokens" -- $job $args --steps 4
done
cat "$out/gpu.csv" "$out/torch.txt" "$out/w1_steps.txt" "$out/runs.txt" 2>/dev/null
summary $cases
tail -20 "$out/stderr.txt" 2>/dev/null
