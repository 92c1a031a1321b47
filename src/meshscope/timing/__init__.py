"""Honest time. `statistics` (percentiles, the critical rank, CV and PERF_UNSTABLE),
`sampler` (barrier-aligned samples, no recording while sampling), `cuda_graph` (one replay per
sample), `kernels` / `graph_kernels` / `profiling` (the NCCL kernels a step really launched) and the
collective `sweep` that fits the alpha-beta model."""
