"""What a rank must issue, from shapes alone (docs/chapter.md, Q27). `placement` holds the
layout-transition rules (Partial->Replicate all-reduce, Partial->Shard reduce-scatter, Shard->Replicate
all-gather) and their autograd duals, `edges` the one predictor mechanism every mode walks (placement changes,
token-order all-to-alls, stage P2P), `ledger` the predicted events with their per-group sequence numbers;
`model_spec`, `volume` (with `weights`, the tensors each rank holds, and `grad_sync`, their data-parallel
sync as per-tensor all-reduces, DDP buckets or FSDP2 units) and `alpha_beta` are the analytic transformer
model and the pure alpha-beta cost model that `place` ranks with."""
