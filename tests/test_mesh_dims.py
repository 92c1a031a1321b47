"""`trace.mesh_dims` in one process on a 1-rank gloo world: a DeviceMesh dim that torch gives the
default group (it spans the whole world) is labelled by its name, however the mesh was built. The
oracle is torch's own rule (device_mesh.py, `_init_one_process_group`): on one rank every dim spans
the world, so every dim is the default group."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshscope.trace import mesh_dims


@pytest.fixture
def labelled(monkeypatch):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    monkeypatch.setattr(mesh_dims, "NAMES", {})
    for name in ("__init__", "_create_unflatten_mesh"):  # restored after the test
        monkeypatch.setattr(DeviceMesh, name, getattr(DeviceMesh, name))
    mesh_dims.label_device_meshes()
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


def test_a_dim_on_the_default_group_reads_its_name_unflattened_too(labelled):
    """torchtitan 0.2.2 at TP over the whole world: a ("world",) mesh, unflattened (parallel_dims.py)."""
    world = init_device_mesh("cpu", (1,), mesh_dim_names=("world",))
    assert mesh_dims.label(labelled) == "world"  # the root mesh's name adds nothing to the default group's
    world._unflatten(0, (1,), ("tp",))
    assert mesh_dims.label(labelled) == "tp"
    dense = world._unflatten(0, (1, 1), ("fsdp", "tp"))
    dense["fsdp", "tp"]._flatten("loss_mesh")
    assert mesh_dims.label(labelled) == "fsdp/loss_mesh/tp"  # one group serving three dims names them all
    assert mesh_dims.label("another group") is None
