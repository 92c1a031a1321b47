"""A large world on one CPU (``meshscope trace --fake-world N``): each chosen rank of an N-rank job runs
the script alone on torch's fake process-group backend, one mechanism per file:

- `world`: which ranks to trace (one per class of rank 0's group creations, `classes`) and the result;
- `fork_server`: the ranks forked from one process that imported torch once;
- `files`: each forked rank's own layer over the working directory (what it writes there no other rank
  sees);
- `mode`: what a fake rank does at the rank program's fixed points;
- `patches`: the one declared table of what a fake world changes in torch, applied by the mode;
- `backend` (the fake backend for every group), `objects` (what object collectives receive: what the
  ranks traced before sent), `devices` (CUDA devices mapped to the CPU), `cuda_api` (torch.cuda and
  torch.accelerator answered as one GPU per local rank), `placements` (``torch.distributed._shard``
  placements on CUDA), `gpu` (the stand-in GPU: ``--fake-device``),
  `attention` (DTensor's rule for the CPU's flash attention), `tensors` (``--fake-tensors``: tensors
  without data): the installers the table names.
"""
