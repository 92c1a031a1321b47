#!/usr/bin/env bash
# The fake world against a real NCCL job on the device machine (one H200, so world 1), with and without
# --fake-tensors; torch 2.11, nothing installed. (The scale benchmark: device_fake_world.sh.)
# Usage (device tool, repository root): OUT=$OUT bash benchmarks/device_fake_vs_nccl.sh
set -uo pipefail
source benchmarks/device_env.sh
export NCCL_NVLS_ENABLE=0
timeout 200 python3 -c "from meshscope.capture import native_build; native_build.ensure(log=print)" > "$OUT/build.txt" 2>&1
while IFS='|' read -r name args; do
  mkdir -p "$OUT/$name"
  for mode in nccl fake shapes; do
    case $mode in
      nccl) flags=(--nproc-per-node 1) ;;
      fake) flags=(--fake-world 1) ;;
      shapes) flags=(--fake-world 1 --fake-tensors) ;;
    esac
    timeout 150 python3 -m meshscope trace "${flags[@]}" --out "$OUT/$name/$mode" -- $args > "$OUT/$name/$mode.txt" 2>&1
    rc=$?
    echo "$name $mode rc=$rc" >> "$OUT/summary.txt"
    [ $rc != 0 ] && tail -n 4 "$OUT/$name/$mode.txt" >> "$OUT/summary.txt"
  done
  for mode in fake shapes; do
    echo "$name nccl vs $mode: $(python3 -m meshscope diff "$OUT/$name/nccl" "$OUT/$name/$mode" 2>&1 | tail -n 1)" >> "$OUT/summary.txt"
  done
done <<'JOBS'
cuda_style|tests/jobs/cuda_style.py
fsdp|tests/jobs/transformer.py --tp 1 --dp-mode fsdp --steps 3
ddp|tests/jobs/ddp.py --steps 3
tdp|tests/jobs/transformer.py --tp 1 --dp-mode ddp --steps 3
JOBS
cat "$OUT/summary.txt"
