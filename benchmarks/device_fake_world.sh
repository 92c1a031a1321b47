#!/usr/bin/env bash
# The fake-world scale benchmark (bench_fake_world.py, --fake-tensors) on 2 cores of the device machine's
# host (taskset: two of its 16 cores, a quiet stand-in for this project's shared 2-core box; CUDA hidden,
# torch 2.11). Without arguments both variants run: FSDP2 x TP 8 + SP, and tp 8 x pp 4 x dp 32 with 1F1B.
# Usage (device tool, repository root): OUT=$OUT bash benchmarks/device_fake_world.sh [ARGS for bench_fake_world.py]
set -uo pipefail
source benchmarks/device_env.sh
export CUDA_VISIBLE_DEVICES=""  # the job scripts take cuda:LOCAL_RANK when CUDA is there
if [ $# -gt 0 ]; then variants=("$*"); else variants=("" "--pp 4 --batch 4"); fi
for args in "${variants[@]}"; do
  timeout 280 taskset -c 0,1 python3 benchmarks/bench_fake_world.py $args >> "$OUT/fake_world.txt" 2>&1
  echo "rc=$?" >> "$OUT/fake_world.txt"
done
grep -E "^(meshscope|machine|wall|resident|rc=)" "$OUT/fake_world.txt"
