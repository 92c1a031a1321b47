"""Where the axes go on nodes. `advisor` ranks the distinct placements of the parallel
axes by a predicted step time (slowest stage), `node_crossing` counts the groups that leave a
node, `report` prints and plots the ranking; `traced` reads a trace directory's steady step as the
same traffic records (`place --from-trace` ranks by them), and `compare` holds the model against it
(`place --compare-trace`); `forecast_ranking` ranks the placements of a traced job by the forecast's step on a
cluster instead (`place --from-trace --cluster`)."""
