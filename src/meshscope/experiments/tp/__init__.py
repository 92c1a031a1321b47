"""``tp_*``: the tensor/sequence-parallel MLP (docs/chapter.md, "Tensor Parallel"): `config`,
`predict`, the unsharded `reference` and the `experiment` that runs and checks it."""
