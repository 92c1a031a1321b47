"""The DeviceMesh dim names of a job's process groups, read from the meshes it builds.

A group's description names its dim (``mesh_tp``, `core.axes`), except where torch hands a dim a
group it already has: a dim over the whole world without a backend of its own is the default group,
whose description stays ``default_pg`` (torch 2.13, ``device_mesh.py``,
``DeviceMesh._init_one_process_group``), so only the mesh knows that it is ``tp``. A mesh is read
once its groups exist:

- after ``DeviceMesh.__init__``: ``init_device_mesh``, and a flattened dim (``_flatten`` builds one);
- after ``DeviceMesh._create_unflatten_mesh`` (torch 2.13's ``_unflatten``), which makes the dims'
  groups after the new mesh's ``__init__`` (``_init_backend=False``): torchtitan 0.2.2 builds a 1-D
  ``("world",)`` mesh and unflattens it into its dims (``distributed/parallel_dims.py``,
  ``build_mesh``), so at TP 2 on 2 ranks its ``tp`` is the default group.

One group can serve several dims: torchtitan unflattens the world three times (its dataloading,
dense and sparse meshes), so with FSDP over the whole world ``batch``, ``loss_mesh`` and ``fsdp`` are
all the default group, labelled ``batch/fsdp/loss_mesh``. A dim named ``world`` (torchtitan's root
mesh) adds nothing to the default group's own label.
"""

from __future__ import annotations

from ..core.events import WORLD

NAMES: dict[str, set[str]] = {}
"""Process-group name -> the names of the DeviceMesh dims it serves."""


def label(group_name: str) -> str | None:
    """The axis of a group that serves DeviceMesh dims, None for any other group."""
    names = NAMES.get(group_name)
    if not names:
        return None
    return "/".join(sorted(names - {WORLD})) or WORLD


def _read(mesh) -> None:
    for i, name in enumerate(getattr(mesh, "mesh_dim_names", None) or ()):
        try:
            NAMES.setdefault(mesh.get_group(i).group_name, set()).add(name)
        except (RuntimeError, ValueError, AttributeError):  # a dim without a group on this rank
            continue


def label_device_meshes() -> None:
    """Remember the dim names of every group of every DeviceMesh the job builds."""
    from torch.distributed import device_mesh

    mesh_class = device_mesh.DeviceMesh
    init = mesh_class.__init__

    def labelled_init(mesh, *args, **kwargs):
        init(mesh, *args, **kwargs)
        _read(mesh)

    mesh_class.__init__ = labelled_init
    unflatten = getattr(mesh_class, "_create_unflatten_mesh", None)  # torch without _unflatten: __init__ only
    if unflatten is None:
        return

    def labelled_unflatten(mesh, *args, **kwargs):
        unflattened = unflatten(mesh, *args, **kwargs)
        _read(unflattened)
        return unflattened

    mesh_class._create_unflatten_mesh = labelled_unflatten
