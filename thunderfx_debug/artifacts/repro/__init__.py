"""Repro and benchmark scripts: `builder` decides which scripts a graph gets and gathers what each reproduces,
`writers` has a strategy per way of running a piece and renders the script, `inputs` writes the code that makes a
script's inputs (and the file of real ones), `fx_facts` reads what an FX graph says about its inputs and random ops,
and `script_template` is the part every script carries (inputs, the check, timing, verdicts). The scripts are run
where thunderfx_debug cannot be imported by `children.standalone`."""
