"""``tp_*``: the tensor/sequence-parallel MLP (docs/chapter.md, "Tensor and sequence parallelism"):
`predict`, the unsharded `reference` and the `experiment` that runs and checks it."""
