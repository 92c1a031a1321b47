"""Ranks on torch's elastic agent. `launch` starts it (`agent`: torchrun's own, its ranks forked
from a process that imported torch once; or detects a torchrun the user already has),
`runtime.RankContext` is one rank's process group, mesh and timeouts, and `worker.execute` runs a
rank program with its flight log (the run directory itself is `core.rundir`)."""
