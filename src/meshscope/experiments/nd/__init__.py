"""``nd_mlp``: TP x PP x DP, with an optional MoE stage, on one world (docs/chapter.md,
"Rank coordinates and process groups"): `config`, `model`, `predict` and the `experiment`."""
