#!/usr/bin/env bash
# One H200 host (kind nvidia-h200, torch 2.11): the trace's overhead benchmark (bench_trace.py) on the
# host's 16 CPU cores (gloo, 2 ranks: a quieter CPU than this project's 2-core box) or on its GPU
# (NCCL, 1 rank, the DDP step: autograd's CUDA device thread issues the bucket all-reduces).
# Usage (device tool, repository root): OUT=$OUT bash benchmarks/device_trace_overhead.sh cpu|gpu [SAMPLES]
set -uo pipefail
source benchmarks/device_env.sh
export NCCL_NVLS_ENABLE=0
which=${1:-cpu}; samples=${2:-30}
{ g++ --version 2>&1 | head -1; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nproc; } > "$OUT/versions.txt"
timeout 300 python3 -c "from meshscope.capture import native_build; native_build.ensure(log=print); print('built')" > "$OUT/build.txt" 2>&1
if [ "$which" = cpu ]; then
  timeout 560 python3 benchmarks/bench_trace.py --samples "$samples" ${K:+--steps-per-sample $K} ${STEPS:+--steps $STEPS} > "$OUT/cpu.txt" 2>&1
else
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/versions.txt"
  timeout 400 python3 benchmarks/bench_trace.py --backend nccl --nproc 1 --steps ddp --samples "$samples" ${K:+--steps-per-sample $K} > "$OUT/gpu_ddp.txt" 2>&1
fi
tail -n 5 "$OUT"/*.txt
