"""CUDA idioms of frameworks: what a GPU job asks of torch.cuda and torch.accelerator before and while it trains.

Exercises what pytorch/examples, Lightning, Megatron-core and torchtitan do on a GPU node (each
idiom is marked where it occurs below): the accelerator gate of pytorch/examples
(``torch.accelerator.is_available()`` and ``device_count()``), ``torch.cuda.set_device`` and NCCL, the
device queries of torchtitan's memory monitor and Lightning's precision check
(``get_device_name``, ``get_device_properties(...).total_memory``, ``get_device_capability``,
``reset_peak_memory_stats``, ``memory_stats()``, ``max_memory_allocated``), ordinals as devices
(``model.to(local_rank)``, ``torch.zeros(..., device=torch.cuda.current_device())``), Megatron's RNG
tracker (``torch.cuda.random.get_rng_state``), a custom autograd Function whose backward allocates
on ``torch.cuda.current_device()`` and all-reduces there (Megatron's sequence-parallel linear),
Lightning's DDP built inside ``torch.cuda.stream(torch.cuda.Stream())``, CUDA events timing a step,
a DataLoader with ``pin_memory=True``, Adam (which asks ``torch.accelerator`` for the current stream
every step), a ``torch.compile``'d loss, and a checkpoint loaded back with ``map_location="cuda:N"``
and ``torch.device("cuda", N)``. Without an accelerator it takes the same path on the CPU and gloo.
This is an ordinary user script: it never imports meshscope.

Launch::

    torchrun --nproc-per-node 4 tests/jobs/cuda_idioms.py

On its accelerator path it prints one line, ``device: NAME TOTAL_MEMORY MAJOR.MINOR SMS``, of
``torch.cuda.get_device_properties(local_rank)``.

Independent facts, per rank (--hidden 16, --batch 4, fp32; W ranks; the model is one
Linear(16, 16) without bias, 16*16*4 = 1,024 B):

* DDP construction: its parameter-shape check (an all_gather of 8 B in, 8 * W B out, and a
  broadcast of 32 B) and one broadcast of the module states from rank 0 (1,024 B); step 1's forward
  rebuilds its buckets (broadcasts of 8 B and 4 B);
* every step, in the backward: first the custom Function's all_reduce of the activation's gradient
  (--batch x --hidden fp32 = 256 B), then DDP's one bucket all_reduce (1,024 B);
* nothing else: the device queries, events, streams, RNG states, the compiled loss and the
  checkpoint issue no collective.

So 2 calls per step plus DDP's set-up, the same on the accelerator path and the CPU path (measured:
torch 2.13 CPU, the gloo trace at world 4 equals the fake world's mapped CUDA path call for call).
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


class AllReduceGradient(torch.autograd.Function):
    """Forward: identity; backward: the gradient all-reduced into a buffer allocated on the current
    device (Megatron-core 0.16.1 tensor_parallel/layers.py:551 allocates its all-gather buffer so)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        buffer = torch.empty(grad.shape, dtype=grad.dtype, device=device)
        buffer.copy_(grad)
        dist.all_reduce(buffer)
        return buffer


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # pytorch/examples' gate (tensor_parallelism/log_utils.py verify_min_gpu_count)
    accelerated = torch.accelerator.is_available() and torch.accelerator.device_count() >= local_world
    if accelerated:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        # torchtitan's memory monitor (components/metrics.py) and Lightning's precision check
        props = torch.cuda.get_device_properties(local_rank)
        major, minor = torch.cuda.get_device_capability()
        print(f"device: {torch.cuda.get_device_name(local_rank)} {props.total_memory} {major}.{minor} "
              f"{props.multi_processor_count}", flush=True)
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory_stats().get("active_bytes.all.peak", 0)
        device = local_rank  # pytorch/examples' ddp-tutorial-series: model.to(self.gpu_id)
    else:
        dist.init_process_group("gloo")
        device = "cpu"
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = nn.Linear(args.hidden, args.hidden, bias=False).to(device)
    if accelerated:
        rng = torch.cuda.random.get_rng_state()  # Megatron's CudaRNGStatesTracker
        torch.cuda.random.set_rng_state(rng)
        counts = torch.zeros(args.hidden, device=torch.cuda.current_device())  # Megatron's grad buffers
        with torch.cuda.stream(torch.cuda.Stream()):  # Lightning's DDPStrategy._setup_model
            ddp = DDP(model, device_ids=[local_rank])
    else:
        counts = torch.zeros(args.hidden)
        ddp = DDP(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    loss_of = torch.compile(lambda y: y.square().mean(), backend="aot_eager")
    data = TensorDataset(torch.randn(args.batch * args.steps, args.hidden))
    loader = DataLoader(data, batch_size=args.batch, pin_memory=True)

    for (x,) in loader:
        if accelerated:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        x = x.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss_of(AllReduceGradient.apply(ddp(x))).backward()
        optimizer.step()
        counts += 1
        if accelerated:
            end.record()
            torch.cuda.synchronize()
            start.elapsed_time(end)
            torch.cuda.max_memory_allocated()

    with tempfile.TemporaryDirectory() as folder:  # each rank its own checkpoint
        path = os.path.join(folder, f"rank{rank}.pt")
        torch.save(ddp.module.state_dict(), path)
        for where in ((f"cuda:{local_rank}", torch.device("cuda", local_rank)) if accelerated else ("cpu",)):
            ddp.module.load_state_dict(torch.load(path, map_location=where))

    if dist.get_backend() == "gloo":
        time.sleep(0.5)  # torch 2.13 + gloo: let the workers free their works before teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
