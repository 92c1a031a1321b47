"""The vocabulary everything else speaks: errors and input validation (`errors`, `sizes`), the one
record (`events.CommEvent`) and what members of a collective must agree on (`agreement`), the
results (`result.RunResult`, `trace_result.TraceResult`, the doctor's `findings.Diagnosis`), the run
directory (`rundir.RunDir`), the layout math (`mesh`: ranks <-> coordinates and every axis's groups),
safe group creation (`groups`), the CLI override table and fault kinds. Pure Python except `groups`,
which creates the process groups."""
