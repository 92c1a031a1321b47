"""Fault of a fake world, not of the job: a GPU job that reads one of torch's CUDA bindings directly.

Launch (any world; on GPUs)::

    torchrun --nproc-per-node 2 tests/jobs/faults/cuda_binding.py

Each rank initialises NCCL on its GPU, all-reduces 4 floats on it, then asks torch which CUDA it was
built with through the binding itself, ``torch._C._cuda_getCompiledVersion()`` (as torch's own test
utilities do, testing/_internal/jit_utils.py:49, torch 2.13), and prints it. On a CUDA build the
binding exists, so the job runs to its end. A CPU build of torch has no ``torch._C._cuda_*`` binding
(torch 2.13.0+cpu: ``AttributeError: module 'torch._C' has no attribute '_cuda_getCompiledVersion'``),
so in a fake world on one, each rank raises that (or the fake world's one line for it) at the line
marked "the binding": after 1 all_reduce, on the world. An ordinary user script: it never imports
meshscope.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    x = torch.ones(4, device="cuda")
    dist.all_reduce(x)
    version = torch._C._cuda_getCompiledVersion()  # the binding
    print(f"rank {dist.get_rank()}: CUDA {version}, sum {x.sum().item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
