# Shared by the forecast's device scripts (device_forecast_measured.sh, device_forecast_multi.sh): source it from
# the repository root after `set -uo pipefail`, with WORK naming a folder for the runs' directories. It writes
# the GPU's and torch's description to $OUT (default /tmp/out) and defines `forecast NAME ARGS...` (a
# `meshscope forecast ... --json` under a wall-clock limit of $LIMIT seconds, its JSON in $OUT/NAME.json, its exit
# and wall time in $OUT/runs.txt) and `summary NAME...` (each forecast's step and per-class terms, one line each).
export NCCL_NVLS_ENABLE=0 PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out" "$WORK"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > "$out/gpu.csv" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" > "$out/torch.txt" 2>&1
forecast() {
  local name=$1 start
  shift
  start=$(date +%s.%N)
  timeout "$LIMIT" python3 -m meshscope forecast --out "$WORK/$name" --json "$@" > "$out/$name.json" 2> "$out/$name.stderr"
  echo "$name rc=$? wall_s=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")" >> "$out/runs.txt"
  tail -5 "$out/$name.stderr" >> "$out/runs.txt"
}
summary() {
  for name in "$@"; do
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], 'step_ms', round(d['step_s'] * 1e3, 2), [(c['rank'], round(c['compute_s'] * 1e3, 2), round(c['exposed_s'] * 1e3, 2), round(c['peak_bytes'] / 2**30, 2)) for c in d['classes']], d['compute_source'][:90])" "$out/$name.json" 2>&1 | tail -1
  done
}
