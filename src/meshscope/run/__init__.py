"""Layer 7: ranks on torch's elastic agent. `launch` starts ``torch.distributed.run`` (or detects a
torchrun the user already has), `runtime.RankContext` is one rank's process group, mesh and
timeouts, `worker.execute` runs a rank program with its flight log, and `rundir` guards the run
directory."""
