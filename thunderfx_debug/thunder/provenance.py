"""Where the ops of a split, a fusion region and an op group came from in the model's code (lightning-thunder#255 asks
Thunder for this mapping; 0.2.6 has none), read at compile time and at flush from what Dynamo and Thunder keep:

- Dynamo: each FX node's user stack, `node.meta["stack_trace"]` (a formatted traceback, innermost frame last): a
  node's source is its innermost frame outside torch's own files.
- Thunder: tracing a split's GraphModule, Thunder's interpreter stamps every bound symbol it binds with the user
  location it is at (`BoundSymbol.source_filename` and `BoundSymbol.source_positions.lineno`, set through
  `TraceCtx.set_current_source_location` by `thunder.core.jit_ext.record_source_loc_in_symbol_header`). For a
  ThunderFX split that location is a line of the GraphModule's generated `forward`. Decompositions inherit it
  (bound while the location is current), executors' substitutions copy it (`TraceSubstitutionProcessor` passes
  `source_filename`/`source_positions` on to each bound symbol it puts in), and a fusion region's `subsymbols` are
  the bound symbols it fused. The split's GraphModule is `ThunderModule._model`.
- torch.fx: `GraphModule._lineno_map` maps a line of the generated code (less the first line of `forward`) to the
  index of its node, as Dynamo itself reads it (`OutputGraph._maybe_preserve_original_meta`).

So: bound symbol -> line of the split's generated code -> FX node -> the model's line. A location outside the
split's generated code (a Python function of Thunder's own that its interpreter traced into, such as 0.2.6's
DTensor-aware `transpose`) names no node and counts for nothing; a bound symbol without a location of its own takes
the first of its subsymbols'. Thunder 0.2.6's autodiff (`transforms/autodiff.py`, `AugmentedForwardProcessor`)
puts the backward bound symbols of its grad rules into the joint trace while it handles the return, so they carry
the return's location (none), not that of the forward bound symbol they differentiate: a backward region names the
lines of those of its ops that were recomputed from the forward, and one made of grad rules alone names none.

What a backward piece does name is where the values it reads were saved: the forward trace returns the values it saves
for the backward (`(outputs, (saved tensors, saved others))`, `python_return` in `AugmentedForwardProcessor`), and
the backward trace unpacks them under the same proxy names. So a saved value's name leads to the forward bound symbol
that produced it (inside a fusion region, to the fused bound symbol) and that one's line: a backward piece's
`reads_saved_from`, kept apart from its own `sources`. A piece reads a saved value directly or through views the
backward made of it (a reshape in one region, read by a matmul outside it). A value saved as it came in (a parameter,
an input of the split) was produced by no op and names nothing.

Sources are listed most ops first ("file:line function", `records.SourceLine`), ties in the order of the code; saved
values' lines most reads first.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from thunderfx_debug.records import Phase, SourceLine

_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<function>.+?)\s*$', re.MULTILINE)
#: Dynamo names the function that resumes a frame after a graph break "torch_dynamo_resume_in_<function>_at_<line>";
#: the model's code calls it by its own name.
_RESUMED = re.compile(r"^torch_dynamo_resume_in_(?P<function>.+)_at_\d+$")


#: torch's own files: a frame there (a Python wrapper Dynamo traced into, such as `F.pad`) is torch's code, and the
#: model's line is the one that called it.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def frame_source(stack_trace: str | None) -> SourceLine | None:
    """The innermost frame of a stack trace as Dynamo formats it that is not torch's own (else the innermost), None
    where it has none.

    Example:
        >>> frame_source('  File "/m/train.py", line 90, in forward\\n    x = block(x)\\n'
        ...              '  File "/m/train.py", line 63, in torch_dynamo_resume_in_forward_at_60\\n    h = h * 2\\n')
        SourceLine(file='/m/train.py', line=63, function='forward')
    """
    if not isinstance(stack_trace, str):
        return None
    frames = list(_FRAME.finditer(stack_trace))
    if not frames:
        return None
    last = next((f for f in reversed(frames) if not f["file"].startswith(_TORCH_DIR)), frames[-1])
    resumed = _RESUMED.match(last["function"])
    return SourceLine(last["file"], int(last["line"]), resumed["function"] if resumed else last["function"])


def node_source(node: torch.fx.Node) -> SourceLine | None:
    return frame_source(node.meta.get("stack_trace"))


def ranked(sources: Iterable[SourceLine | None]) -> tuple[str, ...]:
    """The distinct sources as records keep them, the most frequent first, ties by file and line; None left out.

    Example:
        >>> ranked([SourceLine("m.py", 9, "f"), None, SourceLine("m.py", 3, "f"), SourceLine("m.py", 9, "f")])
        ('m.py:9 f', 'm.py:3 f')
    """
    counts = Counter(s for s in sources if s is not None)
    return tuple(str(s) for s, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0].file, item[0].line)))


def module_sources(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The sources of an FX graph's ops (its call nodes), most ops first."""
    return ranked(node_source(n) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


class LineMap:
    """The lines of the generated code of a split's GraphModules (its own and nested ones, such as a checkpointed
    body), each to the source of its FX node."""

    def __init__(self, root: torch.nn.Module):
        # code file name -> (first line of forward, line -> node index, the nodes)
        self._modules: dict[str, tuple[int, dict[int, int | None], list[torch.fx.Node]]] = {}
        self._sources: dict[tuple[str, int], SourceLine | None] = {}
        for module in root.modules():
            lineno_map = getattr(module, "_lineno_map", None)
            if not isinstance(module, torch.fx.GraphModule) or not lineno_map:
                continue
            code = getattr(module.forward, "__code__", None)
            if code is not None:
                self._modules[code.co_filename] = (code.co_firstlineno, lineno_map, list(module.graph.nodes))

    def line_source(self, filename: str | None, lineno: int | None) -> SourceLine | None:
        if filename not in self._modules or lineno is None:
            return None
        key = (filename, lineno)
        if key not in self._sources:
            first, lineno_map, nodes = self._modules[filename]
            index = lineno_map.get(lineno - first)
            self._sources[key] = node_source(nodes[index]) if index is not None and index < len(nodes) else None
        return self._sources[key]

    def bsym_source(self, bsym: Any) -> SourceLine | None:
        """The source of a bound symbol: its own location's, else the first of its subsymbols'."""
        positions = bsym.source_positions
        found = self.line_source(bsym.source_filename, getattr(positions, "lineno", None))
        if found is not None:
            return found
        return next((s for s in map(self.bsym_source, bsym.subsymbols) if s is not None), None)


def split_line_map(thunder_module: Any) -> LineMap:
    """The line map of a thunder split's compiled module (a ThunderModule; its `_model` is the split's GraphModule)."""
    return LineMap(thunder_module._model)


def saved_sources(lines: LineMap, forward: Any) -> dict[str, SourceLine]:
    """Each value a final forward trace saves for the backward, by proxy name, to the source of the forward bound
    symbol that produced it (a fused one where a fusion region did); a value no op produced (an input of the split,
    saved as it came: an embedding's token ids) to the source of the first forward op that reads it, the line whose
    backward needs it."""
    # imports thunder: not on importing this module
    from thunder.core.prims import PrimIDs

    # Read: the forward trace's RETURN bound symbol, whose `args` are `(outputs, (saved tensors, saved others))`
    # (0.2.6's autodiff.py builds it so; `core/transforms.py`'s `_update_forward_with_new_saved_for_backward` keeps it
    # so when a pass changes what is saved), and each bound symbol's `flat_proxy_outs` (a fusion's: its
    # `subsymbols`').
    ret = next((b for b in reversed(forward.bound_symbols) if b.sym.id == PrimIDs.RETURN), None)
    if ret is None or len(ret.args) < 2:
        return {}
    saved = {getattr(p, "name", None) for group in ret.args[1] for p in group} - {None}
    found: dict[str, SourceLine] = {}
    for bsym in forward.bound_symbols:
        for producer in bsym.subsymbols if bsym.sym.is_fusion else (bsym,):
            for out in producer.flat_proxy_outs:
                if out.name in saved and out.name not in found:
                    source = lines.bsym_source(producer)
                    if source is not None:
                        found[out.name] = source
    unproduced = saved - set(found)
    for bsym in forward.bound_symbols if unproduced else ():
        for reader in bsym.subsymbols if bsym.sym.is_fusion else (bsym,):
            read = {getattr(a, "name", None) for a in reader.flat_args} & unproduced
            source = lines.bsym_source(reader) if read else None
            if source is not None:
                found.update((name, source) for name in read)
                unproduced -= read
    return found


def _views(backward: Any) -> dict[str, str]:
    """Each value of a backward trace that a view or a copy made (a reshape or transpose, in a fusion region or not),
    by name, to the name of the value it views: the same data, so a piece that reads it reads what that one holds
    (a weight's gradient matmul reads a saved activation through the region that reshaped it)."""
    # imports thunder: not on importing this module
    from thunderfx_debug.thunder.instrument import VIEW_NAMES

    # Read: each bound symbol's `sym.name`, `args[0]` (the viewed tensor of a reshape, transpose, broadcast, copy)
    # and `flat_proxy_outs`; a fusion's `subsymbols`.
    views: dict[str, str] = {}
    for bsym in backward.bound_symbols:
        for made in bsym.subsymbols if bsym.sym.is_fusion else (bsym,):
            viewed = getattr(made.args[0], "name", None) if made.args else None
            if viewed is not None and (made.sym.name in VIEW_NAMES or made.sym.name == "shallow_copy"):
                views.update((out.name, viewed) for out in made.flat_proxy_outs)
    return views


class SavedReads:
    """The sources of the saved values a backward bound symbol reads, directly or through views (`_views`)."""

    def __init__(self, lines: LineMap, forward: Any, backward: Any):
        self._saved = saved_sources(lines, forward)
        self._views = _views(backward)

    def _origin(self, name: str) -> SourceLine | None:
        seen = set()
        while name not in self._saved and name in self._views and name not in seen:
            seen.add(name)
            name = self._views[name]
        return self._saved.get(name)

    def of(self, bsym: Any) -> list[SourceLine | None]:
        """One source per argument that is a proxy (None for those that hold no saved value)."""
        names = (getattr(a, "name", None) for a in bsym.flat_args)
        return [self._origin(name) for name in names if name is not None]


@dataclasses.dataclass(frozen=True)
class TraceSources:
    """The sources of a thunder split's final traces: of each fusion region by its key ("nvFusion0_forward"), and of
    each op group outside the regions by (phase, symbol, executor), as `records.OpGroup` groups them; and, for the
    backward ones, the sources of the saved values they read (`saved_sources`), most reads first."""

    regions: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    op_groups: dict[tuple[str, str, str], tuple[str, ...]] = dataclasses.field(default_factory=dict)
    regions_reads_saved_from: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    op_groups_reads_saved_from: dict[tuple[str, str, str], tuple[str, ...]] = dataclasses.field(default_factory=dict)


def trace_sources(thunder_module: Any, regions: Iterable[Any], forward: Any, backward: Any) -> TraceSources:
    """The sources of a split's fusion regions (`thunder.traces.FusionRegion`s) and of the op groups of its final
    `forward` and `backward` traces (either may be None), and of the saved values its backward pieces read."""
    from thunderfx_debug.thunder.instrument import is_op, op_executor  # imports thunder: not on importing this module

    lines = split_line_map(thunder_module)
    regions = list(regions)
    by_region = {r.key: ranked(lines.bsym_source(sub) for sub in r.bsym.subsymbols) for r in regions}
    by_group: dict[tuple[str, str, str], list[SourceLine | None]] = {}
    for phase, trace in ((Phase.FORWARD.value, forward), (Phase.BACKWARD.value, backward)):
        for bsym in trace.bound_symbols if trace is not None else ():
            if is_op(bsym):
                by_group.setdefault((phase, bsym.sym.name, op_executor(bsym)), []).append(lines.bsym_source(bsym))
    if forward is None or backward is None:
        return TraceSources(by_region, {key: ranked(found) for key, found in by_group.items()})
    saved = SavedReads(lines, forward, backward)
    region_reads = {r.key: ranked(saved.of(r.bsym)) for r in regions if r.phase is Phase.BACKWARD}
    group_reads: dict[tuple[str, str, str], list[SourceLine | None]] = {}
    for bsym in backward.bound_symbols:
        if is_op(bsym):
            group_reads.setdefault((Phase.BACKWARD.value, bsym.sym.name, op_executor(bsym)), []).extend(saved.of(bsym))
    return TraceSources(by_region, {key: ranked(found) for key, found in by_group.items()},
                        {key: found for key, found in region_reads.items() if found},
                        {key: found for key, reads in group_reads.items() if (found := ranked(reads))})
