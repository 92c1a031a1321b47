#!/usr/bin/env bash
# One H200 host (kind nvidia-h200, torch 2.11): what the trace costs bench_trace.py's steps in trees that
# differ (in how the job's moves, calls or completions are recorded, say), interleaved so that the host's
# drift falls on all of them alike, the trees' order reversed every other round (the first of a round ran
# on a cooler host). Usage (device tool, repository root):
#   OUT=$OUT ROUNDS=2 SAMPLES=20 [TAG=ab] [BENCH="--modes none trace"] bash benchmarks/device_moves_ab.sh LABEL=DIR [LABEL=DIR ...]
# with DIR a tree holding src/ and benchmarks/ (`.` for this one; others e.g. from `git archive REV src
# benchmarks | tar -x -C DIR`) and BENCH bench_trace.py's arguments (e.g. "--modes none trace --steps ddp
# --backend nccl --nproc 1": the DDP step on the GPU). Writes $OUT/<TAG>_<label>_<round>.txt, bench_trace.py's output.
set -uo pipefail
rounds=${ROUNDS:-2}; samples=${SAMPLES:-20}; tag=${TAG:-ab}; read -r -a bench <<< "${BENCH:---modes none trace}"
here=$(pwd)
source benchmarks/device_env.sh
export NCCL_NVLS_ENABLE=0
python3 -c "import torch; print('torch', torch.__version__)" > "$OUT/versions.txt" 2>&1; nproc >> "$OUT/versions.txt"
for round in $(seq 1 "$rounds"); do
  specs=("$@")
  if (( round % 2 == 0 )); then specs=(); for ((i = $#; i >= 1; i--)); do specs+=("${!i}"); done; fi
  for spec in "${specs[@]}"; do
    label=${spec%%=*}; dir=${spec#*=}
    bench_tree "$dir" "$OUT/${tag}_${label}_${round}.txt" --samples "$samples" "${bench[@]}"
  done
done
cd "$here" && for f in "$OUT"/"$tag"_*.txt; do echo "== $f"; grep -E "^  trace |overhead per step" "$f"; done
