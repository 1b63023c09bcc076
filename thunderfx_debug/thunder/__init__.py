"""Everything that reads Lightning Thunder's internals (and the few Dynamo internals ThunderFX depends on).

A Thunder upgrade should touch this subpackage only. Its modules turn Thunder objects into plain values and
`records`, and never keep references to activations:

- `workarounds`: version-gated workarounds, each naming the upstream issue it works around;
- `compile`: splitting and compiling a Dynamo graph as `thunder.dynamo.ThunderCompiler` does;
- `splits`: the splits of a compiled graph, their ops, inputs and split reasons;
- `dynamo`: what Dynamo attached to a graph (compile id, graph break, recompile reason);
- `traces`: final traces, fusion regions, and the code of a region or split for repro scripts;
- `instrument`: the trace transform that brackets fusion regions with timing calls;
- `options`: Thunder options and executors, by name.

Importing this subpackage imports neither torch nor thunder; its modules do.
"""
