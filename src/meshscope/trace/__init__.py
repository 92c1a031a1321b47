"""Users' own jobs, traced unmodified (`meshscope trace`): `rank` is what runs in every
worker before the script's first line, `launch` starts the job through torch's elastic agent,
`assemble` turns a trace directory into one `core.trace_result.TraceResult` with its checks."""
