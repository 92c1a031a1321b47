"""A job that exits at its GPU-count check, before its first collective, as the distributed examples of
pytorch/examples do on a machine with fewer GPUs than they ask for.

Exercises: nothing of torch.distributed beyond ``init_process_group``: a trace of it holds no call.
This is an ordinary user script: it never imports meshscope.

Launch::

    torchrun --nproc-per-node 2 tests/jobs/early_exit.py --gpus 64
    torchrun --nproc-per-node 2 tests/jobs/early_exit.py --gpus 64 --exit-code 2

Independent facts: every rank initialises the default process group (gloo, or nccl where CUDA is
there), prints ``Unable to locate sufficient 64 gpus to run this example. Exiting.`` when
``torch.cuda.device_count()`` is below ``--gpus``, and exits with ``--exit-code`` (default 0); it
issues no collective and steps no optimizer.
"""

import argparse
import sys

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=2, help="GPUs the example needs")
    p.add_argument("--exit-code", type=int, default=0, help="exit status when there are too few")
    args = p.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.device_count() < args.gpus:
        print(f"Unable to locate sufficient {args.gpus} gpus to run this example. Exiting.", flush=True)
        sys.exit(args.exit_code)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
