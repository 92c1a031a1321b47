"""Subgroups made with every way of naming a backend, each used for one all_reduce.

Exercises ``new_group(backend=...)`` with ``"gloo"``, the device's backend (``"nccl"`` on CUDA),
``"cpu:gloo,cuda:nccl"`` (a CPU and a device tensor on the same group), a DeviceMesh with a
``backend_override`` (its tp dim on gloo) and ``split_group``. On CUDA it runs as a GPU job would:
``init_process_group("nccl", device_id=...)``, the nccl and mixed groups, ``split_group`` of the
default group. On a CPU-only torch there is no NCCL and ``split_group`` needs an accelerator, so the
same groups are made with gloo and ``new_group`` (same members, same descriptions): the calls are the
same. One SGD step follows, so everything is step 0.

Launch (WORLD_SIZE 4)::

    torchrun --nproc-per-node 4 tests/jobs/subgroups.py

Per rank, in this order, one all_reduce (SUM, fp32) per line, numel k so each can be matched by size:

  k  group                                         backend (CUDA / CPU)       members (world 4)
  1  pairs_gloo                                    gloo / gloo                {0,1} {2,3}
  2  pairs_device                                  nccl / gloo                {0,1} {2,3}
  3  mixed, a CPU tensor                           cpu:gloo,cuda:nccl / gloo  {0,1,2,3}
  4  mixed, a device tensor                        (same group)               {0,1,2,3}
  5  mesh dp (init_device_mesh (2, 2), dp x tp)    default                    {0,2} {1,3}
  6  mesh tp (backend_override {"tp": "gloo"})     gloo                       {0,1} {2,3}
  7  split_pairs (split_group of the world)        nccl split / gloo          {0,1} {2,3}

=> 7 all_reduce per rank, 4 * k bytes each, and nothing else.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def pairs(backend, desc):
    made = [dist.new_group([0, 1], backend=backend, group_desc=desc),
            dist.new_group([2, 3], backend=backend, group_desc=desc)]
    return made[dist.get_rank() // 2]


def main():
    if int(os.environ.get("WORLD_SIZE", "1")) != 4:
        sys.exit("subgroups.py needs WORLD_SIZE 4")
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()

    on_gloo = pairs("gloo", "pairs_gloo")
    on_device = pairs("nccl" if cuda else "gloo", "pairs_device")
    mixed = dist.new_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo", group_desc="mixed")
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"), backend_override={"tp": "gloo"})
    if cuda:
        split = dist.split_group(split_ranks=[[0, 1], [2, 3]], group_desc="split_pairs")
    else:
        split = pairs("gloo", "split_pairs")

    calls = [(on_gloo, "cpu"), (on_device, device), (mixed, "cpu"), (mixed, device),
             (mesh.get_group("dp"), device), (mesh.get_group("tp"), "cpu"), (split, device)]
    for k, (group, where) in enumerate(calls, start=1):
        t = torch.full((k,), float(rank), device=where)
        dist.all_reduce(t, group=group)

    model = torch.nn.Linear(4, 4).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 4, device=device)).sum().backward()
    opt.step()

    if not cuda:
        time.sleep(0.5)  # gloo teardown (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
