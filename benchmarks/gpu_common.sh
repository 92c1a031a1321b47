# Shared by the GPU measurement scripts (source it from the repository root after `set -uo pipefail`).
# Runs write to $RUNS (default /tmp/meshscope-runs); $OUT receives the terminal output of every command
# (commands.log lists each with its start time) and the small documents of each run, one folder per
# run: result.json, report.md, sweep.json.
: "${OUT:?set OUT to an output directory}"
RUNS=${RUNS:-/tmp/meshscope-runs}
mkdir -p "$RUNS"
export PYTHONPATH=src NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
ms="python3 -m meshscope"
# step CMD...: log and run CMD, under a wall-clock limit of $LIMIT seconds when set (0: none)
step() { echo "== $(date -u +%T) $*" | tee -a "$OUT/commands.log"; timeout "${LIMIT:-0}" "$@"; echo "   exit $?" | tee -a "$OUT/commands.log"; }
# keep RUN: copy run RUN's small documents to $OUT/RUN/
keep() { mkdir -p "$OUT/$1"; for f in result.json report.md sweep.json; do [ -f "$RUNS/$1/$f" ] && cp "$RUNS/$1/$f" "$OUT/$1/$f"; done; }
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" > "$OUT/versions.txt"
