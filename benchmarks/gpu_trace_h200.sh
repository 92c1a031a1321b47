#!/usr/bin/env bash
# One H200 (kind nvidia-h200), torch 2.11, NCCL: meshscope trace of single-rank jobs on NCCL and
# CUDA, and whether the dispatcher kernel sees DDP's bucket all-reduces on CUDA's backward thread.
# Usage (device tool, repository root): OUT=$OUT bash benchmarks/gpu_trace_h200.sh
set -uo pipefail
source benchmarks/gpu_common.sh
for job in "ddp.py --steps 5 --print-buckets" "compiled.py --backend inductor" "compiled.py"; do
  name=$(echo "$job" | cut -d' ' -f1,2 | tr ' ' '_' | tr -d '-')
  # the JSON document alone in its file (step's own log lines go to the terminal and commands.log)
  LIMIT=300 step bash -c "$ms trace --nproc-per-node 1 --out $RUNS/$name --json -- tests/jobs/$job > $OUT/$name.json 2> $RUNS/$name.err"
  grep -h "rebuilt_bucket_sizes" "$RUNS/$name.err" >> "$OUT/summary.txt"
done
python3 - "$OUT" <<'PY' >> "$OUT/summary.txt"
import json, sys, glob, collections
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        d = json.load(open(path))
    except Exception as exc:
        print(path, "unreadable", exc); continue
    if d.get("kind") != "trace":
        continue
    print(path.split("/")[-1], "passed", d["passed"], "error", d.get("error"))
    for s in d["per_rank"][0]["steps"]:
        c = collections.Counter((e["axis"], e["op"], e["phase"]) for e in s["events"])
        print("  step", s["step"], dict(c))
PY
cat "$OUT/summary.txt"
