#!/usr/bin/env bash
# `meshscope forecast --measure-on cuda` against the GPU it runs on (docs/forecast.md, "Measured compute"):
# each job timed by itself under torchrun at world 1, then forecast with each compute segment measured on the same
# GPU. tests/jobs/timed_steps.py (an fp32 MLP under DDP that prints its own step times) and
# benchmarks/forecast_llama_layers.py (Llama 3 8B blocks, bf16) at world 1 hold the forecast to the job's own step;
# the blocks under FSDP2 over a fake world of 8 give every rank class's kernels at its own shard shapes, one rank at
# a time on this GPU. Run through the device tool from the repository root (PYTHONPATH=src: nothing is installed
# there); results in $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
work=/tmp/measured
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > "$out/gpu.csv" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" > "$out/torch.txt" 2>&1
# the timeouts below add up to 570 s, inside the device tool's 600 s per command
mlp="tests/jobs/timed_steps.py --layers 4 --hidden 4096 --batch 8192"
llama="benchmarks/forecast_llama_layers.py --layers 4 --batch 1 --seq 8192"
timeout 60 torchrun --standalone --nproc-per-node 1 $mlp --steps 12 > "$out/mlp_steps.txt" 2>> "$out/stderr.txt"
[[ "${CASES:-w1}" == *w1* || "${CASES:-}" == *fsdp8* ]] && \
  timeout 90 torchrun --standalone --nproc-per-node 1 $llama --steps 10 > "$out/llama_steps.txt" 2>> "$out/stderr.txt"
# CASES="mlp1 w1" runs those alone (430 s at most, where less device time is left; CASES=mlp1 200 s)
for case in "mlp1|1|8192|$mlp --steps 6" "w1|1|8192|$llama --steps 6" "fsdp8|8|65536|$llama --fsdp --steps 5"; do
  IFS="|" read -r name world tokens args <<< "$case"
  [[ " ${CASES:-mlp1 w1 fsdp8} " == *" $name "* ]] || continue
  start=$(date +%s.%N)
  timeout 140 python3 -m meshscope forecast --fake-world "$world" --measure-on cuda --cluster h100-sxm \
    --tokens "$tokens" --out "$work/$name" --json -- $args > "$out/$name.json" 2> "$out/$name.stderr"
  echo "$name rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")" >> "$out/runs.txt"
  tail -5 "$out/$name.stderr" >> "$out/runs.txt"
done
cat "$out/gpu.csv" "$out/torch.txt" "$out/mlp_steps.txt" "$out/llama_steps.txt" "$out/runs.txt" 2>/dev/null
for name in ${CASES:-mlp1 w1 fsdp8}; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], 'step_s', d['step_s'], [(c['rank'], c['compute_s'], c['exposed_s'], c['peak_bytes']/2**30) for c in d['classes']], d['compute_source'][:90])" "$out/$name.json" 2>&1 | tail -1
done
