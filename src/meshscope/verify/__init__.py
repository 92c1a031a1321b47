"""The verdict of a run. `result.build_result` turns every rank's output into one
`core.result.RunResult`: the captured ledger against the predicted one, event by event, the
numerics against the unsharded reference and the replicas against each other."""
