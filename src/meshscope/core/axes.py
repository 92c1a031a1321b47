"""Axis labels of a user's process groups, read from the names their creators give them.

A traced job's groups are created by the job (DeviceMesh, Megatron-core, plain ``new_group``), not
by meshscope, so their axis comes from ``ProcessGroup.group_desc``:

- torch's DeviceMesh names each dim's group ``mesh_<dim name>`` (``mesh_tp``; a flattened dim
  ``mesh_dp_cp``; an unnamed dim ``mesh_dim_<i>``): the axis is the dim name (torchtitan's
  ``dp_replicate``, ``dp_shard``, ``fsdp``, ``efsdp``, ``ep``, ``cp``, ``pp`` included);
- Megatron-core passes a description per kind of group (`MEGATRON`, every kind that megatron-core
  0.16.1's and 0.19.2's ``parallel_state.py`` create); composite groups become joined axes
  (``tp-pp``), the ``_GLOO`` and ``_AG`` twins their axis, hierarchical and partial sub-groups the
  axis they split;
- a group described by an axis name alone (``new_group(ranks, group_desc="tp")``) is that axis;
- the default group is ``world``; anything else is ``group`` (kept with its ranks), until
  `core.mesh_infer` recovers the mesh axes of the groups a job created without any name.

`is_mesh_axis` tells whether a label is a mesh axis whose groups must partition the world, which a
named non-mesh group (Megatron's embedding groups, a hierarchical level) need not.
"""

from __future__ import annotations

import re

MEGATRON = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp-cp",
    "DATA_PARALLEL_GROUP_WITH_CP_AG": "dp-cp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    # In 0.19.2 these three also span gtp (RankGenerator tokens 'tp-gtp_remat-pp', 'tp-gtp_remat-dp',
    # 'tp-gtp_remat-dp-cp'): the same groups as before while gtp is 1, its default.
    "MODEL_PARALLEL_GROUP": "tp-pp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp-dp",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp-dp-cp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp-cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp",
    "EXPERT_DATA_PARALLEL_GROUP": "edp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "etp-ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "etp-ep-pp",
    "EMBEDDING_GROUP": "embedding",
    "POSITION_EMBEDDING_GROUP": "position_embedding",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp-cp.intra",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "dp-cp.instance",
    "INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "edp.intra",
    "INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "edp.inter",
    # megatron-core 0.19.2, parallel_state.py (initialize_model_parallel, create_all_gather_groups):
    # Generalized tensor parallelism with weight rematerialisation (``gtp_remat_size``): each weight is
    # sharded along out_features over a gtp group and all-gathered on every forward and backward. gtp
    # is a RankGenerator axis of its own, next to tp ('tp-gtp_remat-cp-ep-dp-pp'); dp becomes the
    # replicate degree. The groups are built always, of one rank each while gtp is 1.
    "GTP_WEIGHT_REMAT_GROUP": "gtp",
    # The same for routed experts (``expert_gtp_remat_size``), an axis of the expert grid after ep
    # ('tp-cp-ep-gtp_remat-dp-pp'); built always, of one rank each while egtp is 1.
    "EXPERT_GTP_WEIGHT_REMAT_GROUP": "egtp",
    # Built only when gtp (egtp) is above 1, else these names alias the dp, dp-cp (edp) groups: the
    # data-distribution groups over every rank with distinct data ('gtp_remat-dp', 'gtp_remat-dp-cp',
    # the expert grid's 'gtp_remat-dp').
    "DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "gtp-dp",
    "DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT": "gtp-dp-cp",
    "EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "egtp-edp",
    # 'tp-ep-gtp_remat-pp' of the expert grid, the expert analog of MODEL_PARALLEL_GROUP; built always:
    # the etp-ep-pp groups' ranks while egtp is 1.
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP": "etp-ep-egtp-pp",
    # create_all_gather_groups(for_expert_parallelism=True): a second communicator over each expert
    # data-parallel group's ranks, so that parameter all-gathers overlap gradient reduce-scatters
    # (as DATA_PARALLEL_GROUP_WITH_CP_AG does for dp-cp).
    "EXPERT_DATA_PARALLEL_GROUP_AG": "edp",
}
"""Megatron-core group description -> axis label (``_GLOO`` twins are stripped before lookup)."""

LAYOUT_AXES = ("tp", "cp", "ep", "etp", "dp", "edp", "pp")
"""Axis names a plain ``new_group(..., group_desc=NAME)`` may carry (meshscope layout's axes)."""

GROUP = "group"
"""The label of a group whose description names no axis meshscope knows (`axis_of`)."""

NON_MESH = {"world", GROUP, "embedding", "position_embedding"}
"""Labels whose groups need not partition the world."""

_HIERARCHICAL = re.compile(r"^HIERARCHICAL_(?P<base>.+?)(?:_GLOO)?_L(?P<level>\d+)$")
_HYBRID = re.compile(r"^HYBRID_DP_CP_GROUP_(?P<size>\d+)$")


def axis_of(group_desc: str, is_default: bool = False) -> str:
    """The axis label of a group from its description (module docstring)."""
    if is_default or group_desc == "default_pg":
        return "world"
    if group_desc.startswith("mesh_"):
        return group_desc.removeprefix("mesh_")  # "mesh_dim_0" stays "dim_0": an unnamed dim
    desc = group_desc.removesuffix("_GLOO")
    if desc in MEGATRON:
        return MEGATRON[desc]
    if desc in LAYOUT_AXES:  # a group its creator named after its axis: new_group(ranks, group_desc="tp")
        return desc
    if m := _HIERARCHICAL.match(group_desc):
        return f"{axis_of(m['base'])}.l{m['level']}"
    if m := _HYBRID.match(group_desc):
        return f"dp-cp.hybrid{m['size']}"
    return GROUP


def is_mesh_axis(label: str) -> bool:
    """Whether a label names a mesh axis (its groups are disjoint and cover the world)."""
    return label not in NON_MESH and "." not in label
