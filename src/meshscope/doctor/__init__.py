"""`meshscope doctor RUN_DIR`: turn flight logs into named root causes.

The chapter's production-diagnosis and common-mistakes tables are the checklist (docs/chapter.md,
"Faults the doctor names"). Every diagnosis names the mesh axis and ranks of the group, the first
divergent entry, and the cause in plain words, so that a hang is placed on its dimension rather than
on a global rank.

Evidence (`evidence`): ``flight/rank<R>.jsonl`` (group creations and every collective, issued and
completed), ``errors/rank<R>.json``, ``spec.json`` (to rebuild the layout) and, if the run got that
far, ``result.json`` (the predicted and captured ledgers of one step). A traced job adds
``groups/rank<R>.jsonl`` (every ``new_group`` call, member or not, and whether it returned) and
``ranks/rank<R>.json`` (how each rank ended, with its error). PyTorch Flight Recorder dumps
(`fr_files`, `fr_records`, `fr_job`, `fr_findings`): a directory or prefix of them alone, or a trace
directory's ``fr/`` beside its flight logs; each finding says which it rests on (``evidence``: flight
log, flight recorder, or both).

Diagnoses:
  script-error    a rank's script raised (or exited non-zero) outside any collective    (`ends`)
  meshscope-error meshscope's own code failed in the rank (its frame named): a bug to report (`blame`)
  fake-world-gap  a fake world's rank failed on CUDA-only work it has no mapping for (a CPU build's
                  "Torch not compiled with CUDA enabled", a missing ``torch._C._cuda_*``), or after a
                  receive of integers it made up, its sender not traced before it (`blame`)
  group-order     ranks created process groups in different orders                  (`collective`)
  group-members   ranks created a group with different members (or sizes)             (`collective`)
  missing         some ranks never issued collective #k of a group the others wait in (`collective`)
  ddp-unused      a backward in which some ranks issued fewer gradient all-reduces: DDP's unused parameters
  mismatch        ranks issued collective #k of a group with different op, dtype, size or splits
  p2p             a send without its recv, a size mismatch, or both ends sending/receiving first (`p2p`)
  pp-no-grad      a pipeline stage received activations but never sent their gradients back (`p2p`)
  dp-wrong-group  a gradient averaged over ranks that hold different shards          (`prediction`)
  pruned-a2a      fewer all_to_all than predicted because the tokens needed no gradient (`prediction`)

One fault cascades: ranks blocked by it leave their peers waiting in other groups. Findings are
ordered by when their first divergent entry was issued -- a wait for ranks that were blocked in
another call is dated by that call, since it follows from it -- and the earliest is reported as the
likely root cause, the others as what followed from it; when no rank was blocked in a collective, a
rank's own failure (one of the first three kinds) comes first (`ends` defines "blocked"). `diagnose`
(in `diagnose.py`) runs it all and returns the typed `core.findings.Diagnosis`; `render` words it.
"""

from .diagnose import diagnose, progress, render

__all__ = ["diagnose", "progress", "render"]
