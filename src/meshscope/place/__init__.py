"""Layer 11: where the axes go on nodes. `advisor` ranks the distinct placements of the parallel
axes by a predicted step time (slowest stage), `node_crossing` counts the groups that leave a
node, `report` prints and plots the ranking."""
