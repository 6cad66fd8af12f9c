"""``make bench-outcomes``: a time-stepped GPU fleet where each arm's placements meet heat, power,
faults and sharing (docs/outcomes.md holds the model and its sources)."""
