"""The DeviceMesh dim name of a traced job's process groups, learned from the meshes the job builds.

A group's axis comes from its description (`core.axes`), but a 1-D mesh over the whole world reuses
the default group, whose description stays ``default_pg``: only the mesh knows it is ``tp``.
"""

from __future__ import annotations

MESH_DIMS: dict[str, str] = {}
"""Process-group name -> the DeviceMesh dim name it serves. A 1-D mesh over the whole world reuses
the default group (whose description stays ``default_pg``), so only the mesh knows it is ``tp``."""


def label_device_meshes() -> None:
    """Remember the dim name of every group of every DeviceMesh the job builds."""
    from torch.distributed import device_mesh

    original = device_mesh.DeviceMesh.__init__

    def init(mesh, *args, **kwargs):
        original(mesh, *args, **kwargs)
        names = getattr(mesh, "mesh_dim_names", None)
        if not names:
            return
        for i, name in enumerate(names):
            try:
                MESH_DIMS.setdefault(mesh.get_group(i).group_name, name)
            except (RuntimeError, ValueError, AttributeError):  # a dim without a group on this rank
                continue

    device_mesh.DeviceMesh.__init__ = init
