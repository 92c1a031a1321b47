"""Fault of the script: an all-gather into an output of the wrong size.

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/faults/gather_size.py

Each rank gathers 2 floats from each of the 2 ranks into an output of 3 floats, not 4, at the line
marked "the bad output". torch 2.13's gloo refuses it on every rank before anything is sent
(``RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 1 (expected (2), got
(1))``): the script's own error, whichever wrappers of the call it passed through. An ordinary user
script: it never imports meshscope.
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    out = torch.empty(3)
    dist.all_gather_into_tensor(out, torch.ones(2))  # the bad output
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
