#!/usr/bin/env bash
# The fake-world scale benchmark (bench_fake_world.py) on 2 cores of the device machine's host
# (taskset: two of its 16 cores, a quiet stand-in for this project's shared 2-core box; torch 2.11).
# Usage (device tool, repository root): OUT=$OUT bash benchmarks/device_fake_world.sh [ARGS for bench_fake_world.py]
set -uo pipefail
source benchmarks/device_env.sh
# CUDA hidden: the job scripts take cuda:LOCAL_RANK when CUDA is there, and this host has one GPU
export CUDA_VISIBLE_DEVICES=""
timeout 560 taskset -c 0,1 python3 benchmarks/bench_fake_world.py "$@" > "$OUT/fake_world.txt" 2>&1
echo "rc=$?" >> "$OUT/fake_world.txt"
tail -n 8 "$OUT/fake_world.txt"
