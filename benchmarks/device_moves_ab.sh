#!/usr/bin/env bash
# One H200 host (kind nvidia-h200, torch 2.11): what the trace costs bench_trace.py's three CPU steps (2 gloo
# ranks) in trees that differ (in how the job's moves or calls are recorded, say), interleaved so that the host's drift
# falls on all of them alike. Usage (device tool, repository root):
#   OUT=$OUT ROUNDS=2 SAMPLES=20 bash benchmarks/device_moves_ab.sh LABEL=DIR [LABEL=DIR ...]
# with DIR a tree holding src/ and benchmarks/ (`.` for this one; others e.g. from `git archive REV src
# benchmarks tests | tar -x -C DIR`). Writes $OUT/ab_<label>_<round>.txt, bench_trace.py's output.
set -uo pipefail
rounds=${ROUNDS:-2}; samples=${SAMPLES:-20}
here=$(pwd)
source benchmarks/device_env.sh
python3 -c "import torch; print('torch', torch.__version__)" > "$OUT/versions.txt" 2>&1; nproc >> "$OUT/versions.txt"
for round in $(seq 1 "$rounds"); do
  for spec in "$@"; do
    label=${spec%%=*}; dir=${spec#*=}
    bench_tree "$dir" "$OUT/ab_${label}_${round}.txt" --samples "$samples" --modes none trace
  done
done
cd "$here" && for f in "$OUT"/ab_*.txt; do echo "== $f"; tail -n 8 "$f"; done
