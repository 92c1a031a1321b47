"""What a rank really issued. `recorder.Capture` swaps the Python entry points of c10d and
functional collectives for thin recorders while it is active; `collective_calls` decodes each entry
point's arguments (group, sizes, splits, peer); `flightlog` writes every call, issued and completed,
to a per-rank log that the doctor reads after a hang. For users' own jobs, `dispatch` (a Python
kernel for every c10d op, and the decoders of their schemas) and `native` (the same kernel in C++)
see every call whoever issues it; `job_context` labels it with the job's step, phase and module."""
