#!/usr/bin/env bash
# The forecast against a job's own measured step on real NCCL, on one host with several GPUs (device kinds
# nvidia-h100-x2/-x4/-x8, nvidia-h200-x2/-x4/-x8; docs/forecast.md, "Held against published measurements"):
# benchmarks/forecast_llama_layers.py (Llama 3 8B blocks, bf16) under DDP and under FSDP2 over every GPU of the
# host, each timed by itself under torchrun (CUDA events around whole steps, the median after warm-up), then
# forecast on the matching cluster spec twice: from the CPU's roofline (--fake-world N) and with each rank
# class's compute measured on this host's GPU (--measure-on cuda). Run through the device tool from the
# repository root (PYTHONPATH=src: nothing is installed there); results in $OUT. The timeouts add up to 560 s.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
work=/tmp/multi
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > "$out/gpu.csv" 2>&1
nvidia-smi topo -m > "$out/topo.txt" 2>&1
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) cluster=h200 ;;
  *A100*) cluster=a100-sxm ;;
  *) cluster=h100-sxm ;;
esac
echo "gpus $gpus cluster $cluster" > "$out/runs.txt"
job="benchmarks/forecast_llama_layers.py --layers 4 --batch 1 --seq 8192"
for mode in ddp fsdp; do
  flag=$([ "$mode" = fsdp ] && echo --fsdp)
  timeout 80 torchrun --standalone --nproc-per-node "$gpus" $job $flag --steps 10 > "$out/${mode}_steps.txt" \
    2>> "$out/stderr.txt"
  for measure in roofline cuda; do
    name=${mode}_$measure
    extra=$([ "$measure" = cuda ] && echo --measure-on cuda)
    start=$(date +%s.%N)
    timeout 100 python3 -m meshscope forecast --fake-world "$gpus" $extra --cluster "$cluster" \
      --tokens $((gpus * 8192)) --out "$work/$name" --json -- $job $flag --steps 5 > "$out/$name.json" 2> "$out/$name.stderr"
    echo "$name rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")" >> "$out/runs.txt"
  done
done
cat "$out/gpu.csv" "$out/ddp_steps.txt" "$out/fsdp_steps.txt" "$out/runs.txt"
for name in ddp_roofline ddp_cuda fsdp_roofline fsdp_cuda; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], 'step_ms', round(d['step_s'] * 1e3, 2), [(c['rank'], round(c['compute_s'] * 1e3, 2), round(c['exposed_s'] * 1e3, 2)) for c in d['classes']], d['compute_source'][:60])" "$out/$name.json" 2>&1 | tail -1
done
