"""``ep_*``: expert-parallel MoE with all-to-all dispatch and combine (docs/chapter.md, Q19-Q25): `config`,
the seeded `model` and dense reference, the production `records` and the `experiment`."""
