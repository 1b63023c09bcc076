"""Everything that reads Lightning Thunder's internals (and the few Dynamo internals ThunderFX depends on, and torch's
private APIs).

A Thunder upgrade should touch this subpackage only. Its modules turn Thunder objects into plain values and
`records`, and never keep references to activations:

- `workarounds`: version-gated workarounds, each naming the upstream issue it works around (the workarounds
  themselves are in `script_support`, which repro scripts that run Thunder carry as source);
- `compile`: splitting and compiling a Dynamo graph as `thunder.dynamo.ThunderCompiler` does;
- `splits`: the splits of a compiled graph, their ops, inputs and split reasons;
- `dynamo`: what Dynamo attached to a graph (compile id, graph break, recompile reason);
- `traces`: final traces and their fusion regions;
- `provenance`: the lines of the model's code that the ops of splits, regions and op groups came from;
- `scripts`: what repro scripts need from Thunder (module and region code, nvFuser's definition, the torch
  executor's helpers as standalone code, a region's random ops and index inputs);
- `instrument`: the trace transform that brackets fusion regions with timing calls;
- `options`: Thunder options and executors, by name.
- `torch_private`: torch's private APIs the package calls (inductor's compile, the c10d bindings, the CUDA
  allocator's pools, autograd's engine), which change between torch releases as Thunder's internals do.

Importing this subpackage imports neither torch nor thunder; its modules do.
"""
