"""Repro and benchmark scripts: `pieces` decides which scripts a graph gets and gathers what each reproduces,
`writers` has a strategy per way of running a piece, `templates` the scripts' text, `inputs` the code that makes a
script's inputs, and `runtime` what the scripts run (checking and timing)."""
