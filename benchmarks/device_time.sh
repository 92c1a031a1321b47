#!/usr/bin/env bash
# One H200 host (kind nvidia-h200, torch 2.11): the time analysis on NCCL, and what recording completions
# and moves costs. Usage (device tool, repository root): OUT=$OUT bash benchmarks/device_time.sh nccl|cpu [PARENT]
#   nccl: `meshscope trace` of tests/jobs/ddp.py on the one GPU (NCCL world 1, 8 steps): how many calls got
#         a completion and a GPU time from the Flight Recorder (TORCH_NCCL_ENABLE_TIMING=1) matched to them,
#         and the time section's per-axis figures; each call's arrival on the GPU, healthy and with a kernel
#         planted before the buckets (benchmarks/check_gpu_arrivals.py, both recorders); then bench_trace.py's DDP step on the GPU (modes none,
#         trace, cheap), for this tree and for PARENT (a checkout of the tree before, e.g. its src/ and
#         benchmarks/ from `git archive`);
#   cpu:  bench_trace.py's three CPU steps on 2 gloo ranks (the host's 16 cores), this tree then PARENT.
set -uo pipefail
which=${1:-nccl}; parent=${2:-}; samples=${SAMPLES:-20}
here=$(pwd)
source benchmarks/device_env.sh
export NCCL_NVLS_ENABLE=0
{ python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$OUT/versions.txt" 2>&1
bench() {  # tree label args...
  local tree=$1 label=$2; shift 2
  bench_tree "$tree" "$OUT/bench_${which}_${label}.txt" --samples "$samples" --modes none trace cheap "$@"
}
if [ "$which" = nccl ]; then
  timeout 280 python3 -c "from meshscope.capture import native_build; native_build.ensure(log=print)" > "$OUT/build.txt" 2>&1
  timeout 240 python3 -m meshscope trace --nproc-per-node 1 --out /tmp/ddp1 --json -- tests/jobs/ddp.py --steps 8 \
    > /tmp/ddp1.json 2> "$OUT/ddp1.err"
  python3 - > "$OUT/nccl_plumbing.txt" 2>&1 <<'PY'
import json
d = json.load(open("/tmp/ddp1.json"))
events = [e for r in d["per_rank"] for s in r["steps"] for e in s["events"]]
print("outcome", d["outcome"], "calls", len(events))
print("with t_complete", sum(e["t_complete"] is not None for e in events),
      "with gpu_ms", sum(e["gpu_ms"] is not None for e in events))
for e in events[:3] + events[-4:]:
    print(" ", e["seq"], e["op"], e["bytes_in"], "step", e["step"], "issue->complete ms",
          None if e["t_complete"] is None else round((e["t_complete"] - e["t_issue"]) * 1e3, 4), "gpu_ms", e["gpu_ms"])
by = {}
for e in events:
    if e["gpu_ms"] is not None and e["step"] is not None and e["step"] >= 2:
        by.setdefault((e["op"], e["bytes_in"]), []).append(e["gpu_ms"])
for k, v in sorted(by.items()):
    v.sort()
    print("steady", k, "n", len(v), "gpu ms median", v[len(v) // 2], "min", v[0], "max", v[-1])
t = d["time"]
print("time analysed", t["analysed"], t["note"], "step_ms", t["step_ms"])
print("axes", t["axes"])
PY
  # each call's arrival on the GPU (CommEvent.t_gpu): healthy; then a 60 ms kernel planted in net.2's forward
  # on each step (delays.py --slow-in gpu, timed by the job's own CUDA events), with the C++ recorder and
  # with the Python kernel
  python3 benchmarks/check_gpu_arrivals.py /tmp/ddp1.json > "$OUT/gpu_arrivals_healthy.txt" 2>&1
  for recorder in native python; do
    timeout 240 python3 -m meshscope trace --nproc-per-node 1 --recorder "$recorder" --out "/tmp/slow_$recorder" --json \
      -- tests/jobs/ddp.py --steps 8 --slow-rank 0 --slow-in gpu --slow-ms 60 > "/tmp/slow_$recorder.json" 2> "$OUT/slow_$recorder.err"
    python3 benchmarks/check_gpu_arrivals.py "/tmp/slow_$recorder.json" --planted "/tmp/slow_$recorder/logs/rank0.log" \
      > "$OUT/gpu_arrivals_planted_$recorder.txt" 2>&1
  done
  # what the NCCL Flight Recorder holds after three timed all-reduces (the entries gpu_durations reads)
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 RANK=0 WORLD_SIZE=1 TORCH_NCCL_ENABLE_TIMING=1 TORCH_FR_BUFFER_SIZE=100 \
  timeout 120 python3 - > "$OUT/fr_probe.txt" 2>&1 <<'PY'
import json, time
import torch, torch.distributed as dist
from torch._C import _distributed_c10d as c10d
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize(); time.sleep(1.0)
print("dump functions", [n for n in dir(c10d) if "dump" in n])
for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
    fn = getattr(c10d, name, None)
    if fn is None:
        continue
    doc = json.loads(fn())
    print(name, "version", doc.get("version"), "entries", len(doc.get("entries") or []), "pg_config", doc.get("pg_config"))
    for e in (doc.get("entries") or [])[:4]:
        print("  ", {k: e.get(k) for k in ("process_group", "profiling_name", "collective_seq_id", "state", "retired", "duration_ms")})
dist.destroy_process_group()
PY
  bench "$here" now --backend nccl --nproc 1 --steps ddp
  [ -n "$parent" ] && bench "$parent" parent --backend nccl --nproc 1 --steps ddp
else
  bench "$here" now
  [ -n "$parent" ] && bench "$parent" parent
fi
tail -n 25 "$OUT"/*.txt
