#!/usr/bin/env bash
# The measurements behind docs/results/h200x2.md, on one host with 2 NVIDIA GPUs (device kind
# nvidia-h200-x2). Run from the repository root: OUT=/some/dir bash benchmarks/gpu_h200x2.sh
set -uo pipefail
source benchmarks/gpu_common.sh

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1

# 1. collective sweep on the 2 GPUs, 20 back-to-back calls per timed sample, and its alpha-beta fits
step $ms sweep --backend nccl --world 2 --iters 30 --warmup 5 --back-to-back 20 --out "$RUNS/sweep" > "$OUT/sweep.txt" 2>&1
keep sweep
# 2. every 2-rank variant, profiled (kernel fingerprints), per-step timing, model vs measured comm time
step $ms suite --backend nccl --world 2 --profile --rounds 2 --iters 100 --sweep "$RUNS/sweep/sweep.json" \
    --out "$RUNS/suite_per_step" > "$OUT/suite_per_step.txt" 2>&1
keep suite_per_step
# 3. the same configurations timed as 20 back-to-back steps per sample
step $ms suite --backend nccl --world 2 --rounds 2 --iters 30 --steps-per-sample 20 \
    --out "$RUNS/suite_20_per_sample" > "$OUT/suite_20_per_sample.txt" 2>&1
keep suite_20_per_sample
# 4. the capture's and the flight log's overhead on the chapter's TP step
step python3 benchmarks/bench_capture.py --backend nccl --iters 600 > "$OUT/capture_overhead.txt" 2>&1
# 5. the compositions that fit on 2 GPUs, profiled: pp 2 x tp 1, tp 2 x pp 1, MoE with ep 2 (carved from dp 2)
for args in "--tp 1 --pp 2 --microbatches 4" "--tp 2 --pp 1" "--tp 1 --pp 1 --moe --ep 2"; do
    name=nd_$(echo "$args" | tr -d ' -')
    step $ms run nd_mlp --world 2 $args --backend nccl --profile --out "$RUNS/$name" --json > "$OUT/$name.json" 2> "$OUT/$name.log"
done
# 6. waits between the GPUs: DDP with a 60 ms kernel planted on rank 1's GPU before its buckets (its CPU on time),
#    then healthy; the trace's time section should name rank 1 with "gpu, ...", and nothing healthy
for slow in "--slow-rank 1 --slow-in gpu --slow-ms 60" ""; do
    name=ddp_gpu_$([ -n "$slow" ] && echo slow || echo healthy)
    step $ms trace --nproc-per-node 2 --out "$RUNS/$name" --json -- tests/jobs/ddp.py --steps 8 $slow > "$OUT/$name.json" 2> "$OUT/$name.log"
    python3 benchmarks/check_gpu_arrivals.py "$OUT/$name.json" --planted "$RUNS/$name/logs/rank1.log" > "$OUT/$name.txt" 2>&1
done
# everything small in one file (the device tool returns a limited number of files)
tar -czf "$OUT/all.tar.gz" -C "$OUT" --exclude all.tar.gz .
