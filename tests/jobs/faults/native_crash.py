"""Fault: one rank dies in native code (a C library's abort or a segfault, as a C++ kernel that corrupts
the heap dies), after issuing collectives of its own.

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/native_crash.py [--signal abort|segv|abort-holding-gil] [--steps 3]

Every step each rank all-reduces 4 floats (16 B) on the default group and steps SGD; after ``--steps``
steps rank 1 dies by ``--signal``: ``abort`` calls libc's ``abort()`` (SIGABRT, exit status -6 as
torchrun reports it), ``segv`` writes through a null pointer (SIGSEGV, -11); both through ctypes,
which releases the GIL for the call as a C++ kernel called from torch does; ``abort-holding-gil``
calls ``os.abort()``, which holds it. Rank 0 then blocks in its
next all-reduce until its peer's connection closes. Hand count: rank 1 issued ``--steps`` all-reduces,
each 16 B, then died; rank 0 issued one more. An ordinary user script: it never imports meshscope.
"""

import argparse
import ctypes
import os

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--signal", choices=("abort", "segv", "abort-holding-gil"), default="abort")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(args.steps):
        g = torch.ones(4)
        dist.all_reduce(g)
        w.grad = g
        opt.step()
    if dist.get_rank() == 1:
        if args.signal == "abort":
            ctypes.CDLL(None).abort()
        elif args.signal == "segv":
            ctypes.memset(0, 0, 1)
        else:
            os.abort()
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
