"""A job whose script raises after a healthy ``distribute_tensor``: the scatter that distributes a
sharded DTensor is not a fault, the script's exception is.

Exercises: ``torch.distributed.tensor.distribute_tensor`` with ``Shard(0)`` on a 1-D mesh, which
scatters the root's tensor (torch 2.13: ``mesh_scatter`` -> ``c10d::scatter_``; the root passes a
list of one chunk per rank, the others none), then a ``ValueError`` raised on rank 0 only.
This is an ordinary user script: it never imports meshscope.

Launch::

    torchrun --nproc-per-node 2 tests/jobs/scatter_then_raise.py

Independent facts (world 2): every rank issues one ``scatter`` on the mesh's group (root 0; each
rank receives a [4, 4] float32 chunk, 64 B; the root's list holds 2 x 64 B), then rank 0 raises
``ValueError: bad batch 7`` in ``load_batch`` (the line marked below) while rank 1 waits in a
barrier that rank 0 never reaches.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def load_batch(step: int) -> torch.Tensor:
    if dist.get_rank() == 0:
        raise ValueError(f"bad batch {step}")  # the script's own error: rank 0 fails here
    return torch.zeros(1)


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    weight = distribute_tensor(torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4), mesh, [Shard(0)])
    assert weight.to_local().shape == (8 // dist.get_world_size(), 4)
    load_batch(7)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
