"""Fault injection: plant the seed's common mistakes on purpose, so the doctor can be shown to name them.

`meshscope run EXPERIMENT --inject KIND`. A run-level fault (group creation order) is planted by the
runtime on rank `FAULT_RANK`; every other fault is a switch in the experiment's own config, which the
experiment maps from the kind in its `faults` table (e.g. ``dp-wrong-group`` -> ``dp_group_fault``).
Each planted run must end within its ``--timeout`` and the doctor must name the planted cause.
"""

FAULT_RANK = 1
"""The rank that misbehaves in run-level faults."""

KINDS = {
    "group-order": "one rank creates its process groups in a different order",
    "missing-collective": "one rank skips a collective its peers wait in",
    "p2p-order": "both ends of a pipeline boundary send first",
    "p2p-shape": "the receiver of a pipeline boundary expects a different shape than is sent",
    "pp-no-grad": "a pipeline stage never sends the activation gradient back",
    "split-mismatch": "an expert rank expects other split sizes than its peers send",
    "dp-wrong-group": "gradients are averaged over ranks holding different shards",
    "no-input-grad": "MoE tokens need no gradient although the prediction assumes they do",
}

RUN_LEVEL = ("group-order",)
"""Faults the runtime plants for any experiment."""
