#!/usr/bin/env bash
# The fake world's CUDA mapping on a CUDA build of torch with no GPU (the device machine with
# CUDA_VISIBLE_DEVICES empty): torch.accelerator there names CUDA and asks torch.cuda.is_available, so
# the mapping must answer both APIs alike (trace/fake/cuda_api.py). Checks, in one process, what torch
# answers after the fake world's CUDA rows, then traces the CUDA jobs at fake world 2.
# Usage (device tool, repository root): OUT=$OUT bash benchmarks/device_fake_cuda_build.sh
set -uo pipefail
source benchmarks/device_env.sh
export CUDA_VISIBLE_DEVICES=
python3 - > "$OUT/answers.txt" 2>&1 <<'PY'
import io, os
import torch
print("torch", torch.__version__, "before: cuda", torch.cuda.is_available(), "accelerator",
      torch.accelerator.current_accelerator(), torch.accelerator.is_available())
os.environ.update(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
from meshscope.trace.fake import patches
print("rows", patches.apply(patches.modes(fake_tensors=False)))
print("after: cuda", torch.cuda.is_available(), torch.cuda.device_count(), "accelerator",
      torch.accelerator.current_accelerator(check_available=True), torch.accelerator.device_count(),
      torch.accelerator.current_device_index())
w = torch.ones(3, requires_grad=True, device=torch.cuda.current_device())
torch.optim.Adam([w]).step()
print("Adam steps on", w.device, "; stream", torch.accelerator.current_stream())
buffer = io.BytesIO()
torch.save({"w": w.detach()}, buffer)
buffer.seek(0)
print("map_location cuda:1 ->", torch.load(buffer, map_location="cuda:1")["w"].device)
for name, call in (("reset_peak_memory_stats", torch.cuda.reset_peak_memory_stats),
                   ("memory_snapshot", torch.cuda.memory_snapshot), ("CUDAGraph", torch.cuda.CUDAGraph)):
    try:
        print(name, "->", call())
    except Exception as exc:  # noqa: BLE001 - what each says is the point
        print(name, "->", type(exc).__name__, str(exc)[:160])
PY
timeout 200 python3 -c "from meshscope.capture import native_build; native_build.ensure(log=print)" > "$OUT/build.txt" 2>&1
while IFS='|' read -r name args; do
  timeout 200 python3 -m meshscope trace --fake-world 2 --out "/tmp/$name" -- $args > "/tmp/$name.txt" 2>&1
  echo "$name rc=$? $(grep -E '^(PASSED|FAILED|EMPTY|INCOMPLETE)' /tmp/$name.txt | cut -c1-200)" >> "$OUT/summary.txt"
done <<'JOBS'
cuda_idioms|tests/jobs/cuda_idioms.py
cuda_style|tests/jobs/cuda_style.py
compiled|tests/jobs/compiled.py --steps 3
compiled_inductor|tests/jobs/compiled.py --steps 3 --backend inductor
JOBS
cat "$OUT/answers.txt" "$OUT/summary.txt"
