"""Fault injection: plant the chapter's common mistakes on purpose (docs/chapter.md, "Faults the doctor
names"), so the doctor can be shown to name them.

`meshscope run EXPERIMENT --inject KIND`. A run-level fault (group creation order) is planted by the
runtime on rank `FAULT_RANK`; every other fault is a switch in the experiment's own config, which the
experiment maps from the kind in its `faults` table (e.g. ``dp-wrong-group`` -> ``dp_group_fault``).
Each planted run must end within its ``--timeout`` and the doctor must name the planted cause.

Where each kind is planted (`Experiment.faults`) and what the doctor names first:
  group-order         any experiment            group-order
  missing-collective  collectives               mismatch (the rank that skipped)
  dp-wrong-group      tp_*                      dp-wrong-group
  p2p-shape           pp_*                      p2p (send without recv; the receiver's shape error)
  p2p-order           pp_* under 1F1B, M >= 2   p2p (both ends send first)
  pp-no-grad          pp_*                      pp-no-grad
  split-mismatch      ep_*                      mismatch (input_splits vs the peer's output_splits)
  no-input-grad       ep_* with --input-grad    pruned-a2a (3 all_to_all instead of 4)
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
