"""The vocabulary everything else speaks: errors and input validation (`errors`, `sizes`), the one
record (`events.CommEvent`) and what members of a collective must agree on (`agreement`), the
results (`result.RunResult`, `trace_result.TraceResult`, the doctor's `findings.Diagnosis`) and what a
trace's holds (`trace_spec.TraceSpec` asked, `rank_end.RankEnd` per rank, `fake_world.FakeWorld`), the
steady steps (`steady`), the run directory (`rundir.RunDir`), the layout math (`mesh`: ranks <->
coordinates and every axis's groups; `mesh_fit` and `mesh_infer` back from a job's groups),
safe group creation (`groups`), the CLI override table and fault kinds. Pure Python except `groups`,
which creates the process groups."""
