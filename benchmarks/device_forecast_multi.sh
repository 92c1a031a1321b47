#!/usr/bin/env bash
# The forecast against a job's own measured step on real NCCL, on one host with several GPUs (device kinds
# nvidia-h100-x2/-x4/-x8, nvidia-h200-x2/-x4/-x8; docs/forecast.md, "Held against published measurements"):
# benchmarks/forecast_llama_layers.py (Llama 3 8B blocks, bf16) under DDP and under FSDP2 over every GPU of the
# host, each timed by itself under torchrun (CUDA events around whole steps, the median after warm-up), then
# forecast on the matching cluster spec twice: from the CPU's roofline (--fake-world N) and with each rank
# class's compute measured on this host's GPU (--measure-on cuda). Run through the device tool from the
# repository root (PYTHONPATH=src: nothing is installed there); results in $OUT. The timeouts add up to 560 s.
set -uo pipefail
WORK=/tmp/multi LIMIT=100
source benchmarks/device_forecast_common.sh
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
    forecast "${mode}_$measure" --fake-world "$gpus" $([ "$measure" = cuda ] && echo --measure-on cuda) \
      --cluster "$cluster" --tokens $((gpus * 8192)) -- $job $flag --steps 5
  done
done
cat "$out/gpu.csv" "$out/ddp_steps.txt" "$out/fsdp_steps.txt" "$out/runs.txt"
summary ddp_roofline ddp_cuda fsdp_roofline fsdp_cuda
