"""Layer 1, the vocabulary everything else speaks: errors and input validation (`errors`, `sizes`),
the one record (`events.CommEvent`) and the one result (`result.RunResult`), the layout math
(`mesh`: ranks <-> coordinates and every axis's groups), safe group creation (`groups`), the CLI
override table and fault kinds. Pure Python except `groups`, which creates the process groups."""
