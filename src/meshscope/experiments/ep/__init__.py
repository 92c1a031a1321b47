"""``ep_*``: expert-parallel MoE with all-to-all dispatch and combine (docs/chapter.md, "Expert
Parallel / MoE"): `config`, the seeded `model` and dense reference, the production `records` and the
`experiment`."""
