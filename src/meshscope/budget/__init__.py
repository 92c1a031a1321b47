"""Communication budgets checked in CI (`meshscope budget`, `meshscope check`): a job's steady-step
ledger per rank class as formulas in the variables it was traced over (`make`), held against a
re-trace (`check`). `ledger` reads a trace as entries, `formula` parses and fits, `fit` makes a
budget, `record` is its TOML, `template` its command with ``{NAME}`` placeholders, `points` traces."""
