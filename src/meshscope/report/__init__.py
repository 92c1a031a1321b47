"""What the user reads. `terminal` prints layouts, predictions and run results; `suite`
renders a suite directory's tables, report.md, records and figures (`meshscope report DIR`)."""
