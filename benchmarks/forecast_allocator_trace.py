"""What torch's CUDA caching allocator did under a real step: every allocation and free the job asked for, with its
size and stream, and every segment the allocator reserved for them, recorded by torch's own memory history
(``torch.cuda.memory._record_memory_history``). The forecast's peak is tensor bytes (``max_memory_allocated``);
what a job reports is often ``max_memory_reserved`` (torchtitan's logs and docs/performance tables): replaying the
requests of this trace through the forecast's model of the allocator (`meshscope.capture.caching_allocator`) and
holding its reserved peak against the one this GPU reached is the check of that model (docs/forecast.md,
"Reserved memory").

On a machine with a CUDA GPU, for the Llama 3 8B blocks of benchmarks/forecast_llama_layers.py under DDP or FSDP2
at a world of 1 on NCCL it records the history from before the model is built through `--steps` steps and writes
one JSON file: the config, ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, the allocator's
settings (``PYTORCH_ALLOC_CONF`` where set, else ``PYTORCH_CUDA_ALLOC_CONF``, as torch reads them), and the
trace as rows ``[action, addr, size, stream]``.

Run: torchrun --nproc-per-node 1 benchmarks/forecast_allocator_trace.py --out FILE [--fsdp] [--layers 8 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast_llama_layers import llama  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--fsdp", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("forecast_allocator_trace.py: needs a CUDA GPU (it records the CUDA caching allocator)")
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    model = llama(args.layers, args.seq).to("cuda", torch.bfloat16)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.seq, 4096, device="cuda", dtype=torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = [[e["action"], e["addr"], e["size"], e["stream"]] for e in snapshot["device_traces"][0]]
    doc = {"config": {"layers": args.layers, "batch": args.batch, "seq": args.seq, "steps": args.steps,
                      "mode": "FSDP2" if args.fsdp else "DDP"},
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "alloc_conf": os.environ["PYTORCH_ALLOC_CONF"] if "PYTORCH_ALLOC_CONF" in os.environ else
           os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
           "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
           "trace": trace}
    Path(args.out).write_text(json.dumps(doc))
    print(f"{args.out}: {doc['config']} alloc_conf={doc['alloc_conf']!r} {len(trace)} trace rows, "
          f"max allocated {doc['max_allocated'] / 2**30:.2f} GiB, reserved {doc['max_reserved'] / 2**30:.2f} GiB",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
