#!/usr/bin/env bash
# CUDA-graph timing, the alpha-beta model against graph-replayed kernels, and the capture's overhead
# on 2 NVIDIA GPUs (device kind nvidia-h200-x2): the measurements behind the "CUDA-graph replay" and
# "capture overhead" sections of docs/results/h200x2.md.
# Run from the repository root: OUT=/some/dir bash benchmarks/gpu_graph_h200x2.sh
# Every command has a wall-clock limit (a capture that hangs must not eat the session).
set -uo pipefail
source benchmarks/gpu_common.sh

# 1. the capture's and the flight log's overhead on the chapter's TP step (per-phase breakdown), the
#    per-call cost in isolation, and the variants that locate it
for i in 1 2 3; do
    LIMIT=90 step python3 benchmarks/bench_capture.py --backend nccl --iters 600 >> "$OUT/capture_overhead.txt" 2>&1
done
LIMIT=60 step python3 benchmarks/bench_capture_calls.py > "$OUT/capture_calls.txt" 2>&1
LIMIT=90 step python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/diag_capture_variants.py \
    > "$OUT/capture_variants.txt" 2>&1
# 2. the collective sweep with every call a CUDA-graph replay (nccl-tests -G) and its alpha-beta fits
LIMIT=150 step $ms sweep --backend nccl --world 2 --iters 30 --warmup 5 --back-to-back 20 --cuda-graph --timeout 60 \
    --out "$RUNS/sweep_graph" > "$OUT/sweep_graph.txt" 2>&1
keep sweep_graph
# 3. every 2-rank configuration as CUDA-graph replays: per step, and 20 replays per sample with the
#    kernel fingerprints and the model's error against graph-replayed NCCL kernel time
LIMIT=200 step $ms suite --backend nccl --world 2 --cuda-graph --rounds 2 --iters 100 --timeout 60 \
    --out "$RUNS/suite_graph" > "$OUT/suite_graph.txt" 2>&1
keep suite_graph
LIMIT=240 step $ms suite --backend nccl --world 2 --cuda-graph --rounds 2 --iters 50 --steps-per-sample 20 --timeout 60 \
    --profile --sweep "$RUNS/sweep_graph/sweep.json" --out "$RUNS/suite_graph_20" > "$OUT/suite_graph_20.txt" 2>&1
keep suite_graph_20
# 4. eager steps, now without recording while sampling: per step and 20 per sample
LIMIT=200 step $ms suite --backend nccl --world 2 --rounds 2 --iters 100 --timeout 60 \
    --out "$RUNS/suite_eager" > "$OUT/suite_eager.txt" 2>&1
keep suite_eager
LIMIT=200 step $ms suite --backend nccl --world 2 --rounds 2 --iters 30 --steps-per-sample 20 --timeout 60 \
    --out "$RUNS/suite_eager_20" > "$OUT/suite_eager_20.txt" 2>&1
keep suite_eager_20
tar -czf "$OUT/all.tar.gz" -C "$OUT" --exclude all.tar.gz .
