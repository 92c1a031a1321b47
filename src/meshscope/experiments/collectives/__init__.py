"""``collectives``: every collective type in every group, captured and checked against an
independent plan: a self-test of the capture."""
