"""Small trainable models, one folder or file per parallelism (tp_mlp, pipeline, moe)."""
