"""Layer 2: what a rank really issued. `recorder.Capture` swaps the Python entry points of c10d and
functional collectives for thin recorders while it is active; `collective_calls` decodes each entry
point's arguments (group, sizes, splits, peer); `flightlog` writes every call, issued and completed,
to a per-rank log that the doctor reads after a hang."""
