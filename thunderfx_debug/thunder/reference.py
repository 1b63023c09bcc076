"""The eager reference of a fusion region, for the correctness sentinel: the region's ops lowered to torch calls by
Thunder's torch executor (`scripts.region_torch_function`, the same lowering as the region's repro scripts), as a
Python function compiled once per region, with what the check needs to know about the region.

Checked against lightning-thunder 0.2.6. A region is looked up by its key ("nvFusion0_forward") in the final trace
of its phase that Thunder holds for the split (`thunder.last_traces` / `last_backward_traces`), which Thunder sets
before it runs the trace, so the lookup works while the region runs (from a region observer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from thunderfx_debug.records import Phase
from thunderfx_debug.thunder.scripts import region_random_ops, region_torch_function
from thunderfx_debug.thunder.traces import final_traces


@dataclasses.dataclass(frozen=True)
class RegionReference:
    """A region's torch reference `fn(*inputs) -> list of outputs`, the names of the random ops it does not draw as
    the run did (its values cannot be compared: the streams differ; an nvFusion region's dropout draws are drawn
    again as nvFuser drew them, `scripts.draws_as_nvfuser`), the positions of the inputs it writes into (`copy_`: Thunder's
    form of the graph's own in-place ops, which a fusion runs without bumping the tensor's version counter), and the
    trace names of its outputs."""

    key: str
    fn: Callable[..., Any]
    random_ops: tuple[str, ...]
    written_inputs: tuple[int, ...]
    output_names: tuple[str, ...]
    input_shapes: tuple[tuple[int | None, ...] | None, ...] | None = None  # None: not known; per input None: no tensor

    @property
    def mutates_inputs(self) -> bool:
        return bool(self.written_inputs)

    def fits(self, inputs) -> bool:
        """Whether `inputs` are what the region was traced for (count, tensor shapes): a split with several cache
        entries may run a region other than the one of the trace Thunder holds as its last."""
        if self.input_shapes is None:
            return True
        if len(inputs) != len(self.input_shapes):
            return False
        for value, shape in zip(inputs, self.input_shapes):
            if shape is None:
                continue
            actual = getattr(value, "shape", None)
            if actual is None or len(actual) != len(shape) or any(
                    s is not None and s != a for s, a in zip(shape, actual)):
                return False
        return True


def _walk(bsym):
    for sub in bsym.subsymbols:
        yield sub
        yield from _walk(sub)


def _written_inputs(bsym) -> tuple[int, ...]:
    """The positions of the region's inputs that its `copy_` (destination: its second argument) or in-place ops
    (their first) write into, through the aliases Thunder names for them (`(t3,) = prims.update_aliases((a,))`)."""
    from thunder.core.prims import OpTags, PrimIDs

    positions = {getattr(a, "name", None): i for i, a in enumerate(bsym.flat_args)}
    aliases: dict[str, str] = {}  # a name -> the name it is an alias of

    def root(proxy) -> int | None:
        name = getattr(proxy, "name", None)
        while name in aliases:
            name = aliases[name]
        return positions.get(name)

    written = set()
    for sub in _walk(bsym):
        if sub.sym.id == PrimIDs.UPDATE_ALIASES and sub.args:
            for out, of in zip(sub.flat_outs, sub.args[0]):
                if getattr(out, "name", None) and getattr(of, "name", None):
                    aliases[out.name] = of.name
        elif sub.sym.id == PrimIDs.COPY_ and len(sub.args) > 1:
            written.add(root(sub.args[1]))
        elif OpTags.IN_PLACE in (sub.sym.tags or ()) and sub.args:
            written.add(root(sub.args[0]))
    return tuple(sorted(written - {None}))


def region_bsym(compiled, key: str):
    """The fusion bound symbol named by `key` ("nvFusion0_forward") in the split's current final trace of that
    phase; raises LookupError where there is none."""
    name, _, phase = key.rpartition("_")
    forward, backward = final_traces(compiled)
    trace = forward if phase == Phase.FORWARD.value else backward
    for bsym in getattr(trace, "bound_symbols", ()):
        if bsym.sym.is_fusion and bsym.sym.name == name:
            return bsym
    raise LookupError(f"no fusion region {name} in the {phase} trace Thunder holds for this split")


class RegionReferences:
    """The references of one split's regions, built on first use and kept while the trace they came from is the
    one Thunder runs (a recompile builds new regions under the same names)."""

    def __init__(self, compiled):
        self._compiled = compiled
        self._built: dict[str, tuple[Any, RegionReference]] = {}

    def get(self, key: str) -> RegionReference:
        bsym = region_bsym(self._compiled, key)
        cached = self._built.get(key)
        if cached is not None and cached[0] is bsym:
            return cached[1]
        reference = build_reference(bsym, key)
        self._built[key] = (bsym, reference)  # the bsym kept alive, so that `is` cannot match a new object at its id
        return reference


def _shape(proxy) -> tuple[int | None, ...] | None:
    from thunder.core.proxies import TensorProxy

    if not isinstance(proxy, TensorProxy):
        return None
    return tuple(s if isinstance(s, int) else None for s in proxy.shape)  # symbolic sizes are not compared


def build_reference(bsym, key: str) -> RegionReference:
    """Lowers the region to torch calls and compiles that source into a function (once per region)."""
    name = bsym.sym.name
    source, ctx = region_torch_function(bsym, name)
    namespace = dict(ctx)
    exec(compile(source, f"<thunderfx_debug torch reference of {key}>", "exec"), namespace)  # noqa: S102 (Thunder's code)
    return RegionReference(
        key=key,
        fn=namespace[name],
        random_ops=region_random_ops(bsym, unreproduced=True),
        written_inputs=_written_inputs(bsym),
        output_names=tuple(getattr(o, "name", repr(o)) for o in bsym.flat_outs),
        input_shapes=tuple(_shape(a) for a in bsym.flat_args),
    )
