"""``pp_*``: the 2-stage (or P-stage) pipeline under GPipe or 1F1B (docs/chapter.md, "Pipeline
parallelism"): `config`, `predict`, the unsharded `reference` and the `experiment`."""
