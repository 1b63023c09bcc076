"""The part of every repro script that is the same in each: building or loading the piece's inputs, checking the
piece against eager PyTorch (or against what the run produced), timing it, and saying in one line what a failure is.

Every script thunderfx_debug writes carries this module's source, with the text of each module of the package's bottom
layer that it imports (`thunderfx_debug/scripts/`: the judging rule and the device timer, which the correctness
sentinel and the sampler import too) in place of the import (`writers.inlined_source`). So a script imports torch and
the standard library only (Thunder and nvFuser are the piece's business), runs where thunderfx_debug cannot be
imported, and can be attached as it is to a bug report for Thunder or nvFuser. The package and the tests import this
module as it is.

Exit status of a script (`main`), each with one line that says which it is:
    0  OK              the piece matches eager (or the run's outputs) within the tolerance
    1  MISMATCH        the piece's result differs beyond the tolerance, or values it returned changed afterwards:
                       a finding about the backend (Thunder, nvFuser, inductor), worth reporting upstream
    3  REFUSED         the backend or eager refused the inputs the script built (they do not match what the piece
                       received in the run): a bug of thunderfx_debug's input rebuild, not of the backend
    4  CRASH           the piece raised on inputs that eager accepts (or the backend failed to compile it)
    5  NOT COMPARABLE  the piece draws random numbers that the backend and eager draw differently (reseeded
                       identically before each run), or its values follow which of tied values an index op
                       (topk, sort, argmax) picked, and the backend picked otherwise: nothing is claimed
    6  NOT REBUILT     the script could not rebuild the piece as the run built it (tracing its code, or the
                       definition the backend printed, failed; an executor the run used is not registered here):
                       the backend never ran it, no claim about the backend
    7  REPRODUCED      the piece failed in the run, and raised here what it raised there (`run_failure`): the run's
                       failure, reproduced by the script alone
    8  NOT REPRODUCED  the piece failed in the run and does not fail so here; the line says why (it needed what only
                       the run had), and makes no claim that the piece works
A native abort (e.g. an inductor kernel's bounds assertion) ends the process with a signal and no line: a crash.
"""

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import operator
import statistics
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.scripts.device_timer import held_device_ms
from thunderfx_debug.scripts.philox_draws import (  # noqa: F401  (the run's draws, compared as nvFuser compares them)
    DrawnAsRun, compared_in_float32, define_nvfuser_uniform_op, nvfuser_uniform, nvfuser_uniform_opaque,
    thunder_seed_and_offset)
from thunderfx_debug.scripts.result_line import Outcome, Verdict
from thunderfx_debug.scripts.run_failure import described, same_failure
from thunderfx_debug.scripts.judging_rule import (NOISE_SLACK, Float64Mode, Picks, rounding_floor, to_float64,
                                                  tolerance, verdict)

#: Every run of the piece (compiled, eager, float64) starts from this seed, and so do the inputs.
SEED = 0


#: What a NOT COMPARABLE verdict means where the values that differ follow a pick among tied values (`Picks`).
TIED_MEANING = ("its values depend on which of tied values {backend} and eager picked, and they picked otherwise: "
                "those values not compared, nothing is claimed")
#: What a NOT REBUILT verdict means where an executor the run used is not registered where the script runs.
MISSING_EXECUTOR_MEANING = ("this script cannot build the piece as the run built it, so {backend} never ran it: no "
                            "claim about {backend}")
#: The same for an eager script judged against the values the run returned.
TIED_WITH_THE_RUN_MEANING = ("its values depend on which of tied values the run and eager picked, and they picked "
                             "otherwise: those values not compared, nothing is claimed")


class Refused(Exception):
    """The inputs were refused before the piece ran (they cannot be valid inputs of the piece)."""


class NotRebuilt(Exception):
    """The script's own rebuild of the piece failed, before the backend saw it (see `as_the_run_built`)."""


def as_the_run_built(rebuild, what):
    """`rebuild()`, the script's own step of making the piece as the run had it (`what` says which: tracing its
    code, nvFuser's printed definition); a failure there is NotRebuilt, never a crash of the backend."""
    try:
        return rebuild()
    except Exception as error:
        raise NotRebuilt(f"{what} raised {type(error).__name__}: {str(error)[:300]}") from error


class _DynamoProxy(torch.fx.Proxy):
    """A torch.fx Proxy that records an item assignment and the augmented assignments (`x[i] = v`, `x += y`) as
    the `operator.setitem` / `operator.iadd` calls Dynamo's graph has, where a plain Proxy refuses the first
    ("'Proxy' object does not support item assignment") and turns the others into new values (`x = x + y`), so
    that an input the graph writes into is no longer written."""

    def __setitem__(self, key, value):
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


def _augmented(name):
    target = getattr(operator, name)

    def method(self, other):
        return self.tracer.create_proxy("call_function", target, (self, other), {})

    return method


for _name in ("iadd", "iand", "ifloordiv", "ilshift", "imod", "imul", "imatmul", "ior", "ipow", "irshift", "isub",
              "itruediv", "ixor"):
    setattr(_DynamoProxy, f"__{_name}__", _augmented(_name))


class _DynamoTracer(torch.fx.Tracer):
    def proxy(self, node):
        return _DynamoProxy(node, self)


def dynamo_graph_module(module):
    """The FX GraphModule of `module`, a Dynamo graph written as code (`DynamoModule`), with Dynamo's nodes:
    traced by torch.fx with item and augmented assignments kept as the in-place calls they are in Dynamo's graph
    (`_DynamoProxy`). What ThunderFX hands `torch._inductor.compile` for an inductor split."""
    tracer = _DynamoTracer()
    graph = tracer.trace(module)
    return torch.fx.GraphModule(tracer.root, graph, type(module).__name__)


def for_inductor(graph_module):
    """`graph_module`, where `torch._inductor.compile` can take it: ValueError where it returns a whole `x.size()`
    (a torch.Size), which inductor's AOT autograd refuses as an output ("output spec mismatch"; torch.fx's
    `split_module` splits such sizes into their dims for that reason). A split of ThunderFX can return one where
    shapes are dynamic; ThunderFX gives such a split to Thunder, never to inductor."""
    output = next(node for node in graph_module.graph.nodes if node.op == "output")
    for node in output.all_input_nodes:
        if node.op == "call_method" and node.target == "size" and len(node.args) == 1 and not node.kwargs:
            raise ValueError(f"the piece returns {node.name} = {node.args[0]}.size(), a torch.Size, which inductor's "
                             "compile refuses as an output")
    return graph_module


def differentiable_outputs_as_thunderfx(module, inputs):
    """The `is_differentiable_outputs` ThunderFX's splitter hands `thunder.jit` with a split (lightning-thunder 0.2.6,
    thunder/dynamo/splitter.py): one entry per node of the split's FX output node's `all_input_nodes` (a node returned
    twice counts once, a value that is not a node not at all), True where that node's value has a grad_fn. The
    splitter reads Dynamo's example values; here the module runs once on copies of `inputs`."""
    graph_module = dynamo_graph_module(module)
    values = {}

    class Recording(torch.fx.Interpreter):
        def run_node(self, node):
            values[node] = super().run_node(node)
            return values[node]

    with torch.enable_grad():
        Recording(graph_module).run(*as_non_leaves(fresh(inputs)))
    output = next(node for node in graph_module.graph.nodes if node.op == "output")
    return [getattr(values.get(node), "grad_fn", None) is not None for node in output.all_input_nodes]


# ---- inputs ---------------------------------------------------------------------------------------------------------


def storage_span(shape, stride) -> int:
    """Elements of storage a strided tensor reaches from its storage offset (0 for an empty one)."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride))


def contiguous_strides(shape):
    strides, running = [], 1
    for size in reversed(list(shape)):
        strides.append(running)
        running *= max(size, 1)
    return list(reversed(strides))


def _random_values(count, dtype, device, low, high, sentinel, fraction_true, value):
    """`count` values of `dtype` on `device` from the current torch RNG (see `tensor`)."""
    if value is not None:
        return torch.full((count,), value, dtype=dtype, device=device)
    if dtype is torch.bool:
        p = 0.5 if fraction_true is None else fraction_true
        if p <= 0 or p >= 1:
            return torch.full((count,), p >= 1, dtype=dtype, device=device)
        return torch.rand(count, device=device) < p
    if dtype.is_complex:
        return torch.randn(count, dtype=dtype, device=device)
    if dtype.is_floating_point:
        low = -1.0 if low is None or not math.isfinite(low) else low
        high = 1.0 if high is None or not math.isfinite(high) else high
        if low == high:
            return torch.full((count,), low, dtype=dtype, device=device)
        wide = torch.float64 if dtype is torch.float64 else torch.float32
        return (torch.rand(count, dtype=wide, device=device) * (high - low) + low).to(dtype)
    info = torch.iinfo(dtype)
    if fraction_true is not None and low in (None, 0) and high in (None, 1):  # a 0/1 mask: keep its density
        return (torch.rand(count, device=device) < fraction_true).to(dtype)
    low = 0 if low is None else max(int(low), info.min)
    high = 9 if high is None else min(int(high), info.max - 1)
    if low >= high:
        values = torch.full((count,), low, dtype=dtype, device=device)
    else:
        values = torch.randint(low, high + 1, (count,), dtype=dtype, device=device)
    if sentinel is not None:  # e.g. ignore_index=-100 in labels, at the frequency the run had
        sentinel_value, fraction = sentinel
        values = torch.where(torch.rand(count, device=device) < fraction, torch.full_like(values, sentinel_value),
                             values)
    return values


def tensor(shape, dtype, *, stride=None, offset=0, storage=None, device="cpu", requires_grad=False, low=None,
           high=None, sentinel=None, fraction_true=None, value=None):
    """A tensor laid out as the run's input was, with random values like the run's.

    The view has the run's shape, strides (stride 0 where the input was expanded) and storage offset, over a storage
    of the run's size. Values: `value` everywhere (scalar tensors and inputs that held one value); floats uniform in
    [low, high] (default [-1, 1]); integers uniform in [low, high] (default [0, 9]), with `sentinel` = (value,
    fraction) mixed in at that fraction; bools (and 0/1 integer masks) True with probability `fraction_true`.
    """
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    shape = list(shape)
    stride = contiguous_strides(shape) if stride is None else list(stride)
    span = storage_span(shape, stride)
    size = max(storage or 0, offset + span)
    flat = torch.zeros(size, dtype=dtype, device=device)
    if span:
        flat[offset:offset + span] = _random_values(span, dtype, device, low, high, sentinel, fraction_true, value)
    view = flat.as_strided(shape, stride, offset)
    return view.requires_grad_() if requires_grad else view


def _rebuild(saved):
    """A value of an inputs file (see `load_inputs`) as the run had it."""
    if isinstance(saved, dict) and "flat" in saved:
        flat, offset = saved["flat"], saved.get("storage_offset", 0)
        storage = max(saved.get("storage_size") or 0, offset + flat.numel())
        base = torch.empty(storage, dtype=flat.dtype, device=saved["device"])
        base[offset:offset + flat.numel()].copy_(flat)
        tensor_ = base.as_strided(saved["shape"], saved["stride"], offset)
        return tensor_.requires_grad_(saved["requires_grad"]) if tensor_.is_floating_point() else tensor_
    if isinstance(saved, dict) and set(saved) == {"dtype"}:
        return getattr(torch, saved["dtype"])
    if isinstance(saved, dict) and set(saved) == {"device"}:
        return torch.device(saved["device"])
    if isinstance(saved, dict) and set(saved) == {"size"}:
        return torch.Size(saved["size"])
    if isinstance(saved, dict) and set(saved) == {"tuple"}:
        return tuple(saved["tuple"])
    return saved


@functools.lru_cache(maxsize=None)  # one load per script; each run of the piece works on `fresh` copies
def load_inputs(path, script):
    """The inputs of the piece's first call in the run and what that call returned (None where not saved), from the
    file next to the script: tensors on the run's devices with its strides and storage offsets. `torch.load` with
    weights_only=True never executes code from the file."""
    full = Path(script).resolve().parent / path
    saved = torch.load(full, weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") not in (1, 2):
        raise ValueError(f"{full} is not an inputs file this script can read")
    outputs = saved.get("outputs")
    return [_rebuild(x) for x in saved["inputs"]], (None if outputs is None else [_rebuild(x) for x in outputs])


def fresh(inputs):
    """Copies of `inputs` as new leaf tensors with the same layout (strides, storage offset and size), so each run
    starts from the same values and a piece that mutates its inputs cannot disturb the next run."""
    copies = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            span, offset = storage_span(x.shape, x.stride()), x.storage_offset()
            size = max(x.untyped_storage().nbytes() // max(x.element_size(), 1), offset + span)
            base = torch.empty(size, dtype=x.dtype, device=x.device)
            if span:
                base[offset:offset + span].copy_(x.detach().as_strided((span,), (1,), offset))
            copy = base.as_strided(x.shape, x.stride(), offset)
            copies.append(copy.requires_grad_(x.requires_grad))
        else:
            copies.append(x)
    return copies


# ---- nvFuser's input binding ------------------------------------------------------------------------------------------

_NVFUSER_DTYPES = {
    "Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
    "Int": torch.int64, "Int32": torch.int32, "Bool": torch.bool, "ComplexFloat": torch.complex64,
    "ComplexDouble": torch.complex128,
}
_NVFUSER_SCALARS = {"Int": int, "Int32": int, "Double": float, "Float": float, "Bool": bool, "ComplexDouble": complex,
                    "ComplexFloat": complex}


def nvfuser_allocation_order(rank, stride_order):
    """The dims of a `define_tensor` in allocation order, outermost first: stride_order[i] is dim i's place counted
    from the innermost (0), empty means the dims' own order. Contiguity is listed in this order."""
    order = list(stride_order) or list(range(rank - 1, -1, -1))
    return sorted(range(rank), key=order.__getitem__, reverse=True)


def nvfuser_strides(shape, contiguity, stride_order):
    """Strides nvFuser binds to a `define_tensor` of this shape: stride 0 for the dims it declares expanded
    (contiguity None, size above 1), the others laid out innermost first in allocation order, with a gap where
    contiguity is False.

    Example (rotary cos expanded over the batch; a transposed view; [4, 12, 512, 64] as attention lays it out):
        >>> nvfuser_strides([4, 16, 8], [None, True, True], [2, 1, 0]), nvfuser_strides([2, 3], [True, True], [0, 1])
        ([0, 8, 1], [1, 2])
        >>> nvfuser_strides([4, 12, 512, 64], [True, True, True, True], [3, 1, 2, 0])
        [393216, 64, 768, 1]
    """
    rank = len(shape)
    strides, running = [0] * rank, 1
    allocation = nvfuser_allocation_order(rank, stride_order)
    for position in reversed(range(rank)):
        dim, flag = allocation[position], contiguity[position]
        if flag is None and shape[dim] != 1:
            continue  # expanded: stride 0
        if flag is False:
            running *= 2  # not contiguous with the next inner dim: any larger stride is accepted
        strides[dim] = running
        running *= max(shape[dim], 1)
    return strides


def nvfuser_layout_mismatch(shape, strides, declared):
    """Why nvFuser would refuse to bind a tensor of this shape and these strides to `declared` (a `define_tensor`:
    its contiguity and stride order), as its binding checks it: None where it fits. From the innermost dim out, in
    allocation order: an expanded dim needs stride 0, a contiguous one the stride the dims inside it make."""
    contiguity, stride_order = declared["contiguity"], declared.get("stride_order") or []
    allocation = nvfuser_allocation_order(len(shape), stride_order)
    expected = 1
    for position in reversed(range(len(shape))):
        dim, flag = allocation[position], contiguity[position]
        if flag is None:
            if shape[dim] != 1 and strides[dim] != 0:
                return (f"dim {dim} is expanded in nvFuser's definition (stride 0), the tensor has size {shape[dim]} "
                        f"and stride {strides[dim]} there")
            continue
        if shape[dim] == 1:
            continue
        if flag and strides[dim] != expected:
            wanted = tuple(nvfuser_strides(list(shape), contiguity, stride_order))
            return (f"strides {tuple(strides)} where nvFuser's definition (contiguity {contiguity}, stride order "
                    f"{stride_order or 'the dims own'}) binds strides like {wanted}: dim {dim} has stride "
                    f"{strides[dim]}, it must be {expected}")
        expected = strides[dim] * shape[dim]
    return None


def nvfuser_refusal(inputs, definition):
    """Why nvFuser's definition cannot take `inputs` (None where it can, as far as this reads it): the number of
    inputs, tensors against scalars, rank, dtype, device, and the layout nvFuser checks when binding (expanded dims,
    contiguity in stride order). `definition` lists the definition's inputs as `fd.define_tensor`/`fd.define_scalar`
    declare them."""
    if len(inputs) != len(definition):
        return f"{len(inputs)} inputs, nvFuser's definition has {len(definition)}"
    for i, (value, declared) in enumerate(zip(inputs, definition)):
        dtype = declared.get("dtype")
        if declared["kind"] == "scalar":
            expected = _NVFUSER_SCALARS.get(dtype)
            if isinstance(value, torch.Tensor) or value is None or (expected and not isinstance(value, (bool, int, float, complex))):
                return f"input {i} is {type(value).__name__}, nvFuser's definition has a {dtype} scalar"
            continue
        if not isinstance(value, torch.Tensor):
            return f"input {i} is {type(value).__name__}, nvFuser's definition has a tensor"
        shape = declared["shape"]
        if value.dim() != len(shape):
            return f"input {i} has {value.dim()} dims, nvFuser's definition {len(shape)}"
        if dtype in _NVFUSER_DTYPES and value.dtype != _NVFUSER_DTYPES[dtype]:
            return f"input {i} is {value.dtype}, nvFuser's definition {dtype}"
        if declared.get("is_cpu", False) != (value.device.type == "cpu"):
            return f"input {i} is on {value.device}, nvFuser's definition has is_cpu={declared.get('is_cpu', False)}"
        mismatch = nvfuser_layout_mismatch(list(value.shape), value.stride(), declared)
        if mismatch:
            return f"input {i} {list(value.shape)}: {mismatch}"
    return None


def nvfuser_layouts(inputs, definition):
    """`inputs` with each tensor whose layout nvFuser's definition would refuse copied into the layout it declares
    (the same values), where the definition expands none of its dims; the others as they are (`nvfuser_refusal`
    then says why). For saved inputs of a call laid out otherwise than the call the definition was compiled for."""
    if len(inputs) != len(definition):
        return inputs
    laid_out = []
    for i, (value, declared) in enumerate(zip(inputs, definition)):
        if (isinstance(value, torch.Tensor) and declared["kind"] == "tensor" and value.dim() == len(declared["shape"])
                and None not in declared["contiguity"]
                and nvfuser_layout_mismatch(list(value.shape), value.stride(), declared)):
            strides = nvfuser_strides(list(value.shape), declared["contiguity"], declared.get("stride_order"))
            print(f"  input {i}: copied from strides {tuple(value.stride())} into {tuple(strides)}, the layout of "
                  "nvFuser's definition")
            copy = torch.empty_strided(value.shape, strides, dtype=value.dtype, device=value.device)
            value = copy.copy_(value.detach()).requires_grad_(value.requires_grad)
        laid_out.append(value)
    return laid_out


#: Messages with which backends refuse inputs when binding them (rather than failing to compute).
_BINDING_ERRORS = ("has expanded extent", "stride mismatch with contiguity", "Cannot convert provided py::handle",
                   "PolymorphicValue", "Expected input", "expected size")


# ---- running and comparing ------------------------------------------------------------------------------------------


def differentiated(outputs):
    """The positions of the outputs gradients flow back from: those that require one, an input returned as it is
    included (eager's dropout with p=0 returns its input, where a compiled piece returns a tensor of its own). Taken
    from eager's run and used for every side: a backend may mark more of its outputs as requiring a gradient (Thunder
    marks every floating output of a piece that has one: a float made from integer ids, the cosine of a buffer), and
    a gradient of those would be one eager's run cannot give."""
    return [i for i, o in enumerate(outputs)
            if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point]


def cotangent(position, output, dtype=None):
    """The cotangent of the output at `position`, the same for every side and every run of the piece: drawn in
    float32 from a generator seeded for that position, rounded to `dtype` (eager's, for the float64 run, which then
    differentiates the very same numbers) and then to the output's dtype."""
    generator = torch.Generator().manual_seed(SEED + 1 + position)
    drawn = torch.randn(output.shape, generator=generator, dtype=torch.float32)
    return drawn.to(output.device, dtype or output.dtype).to(output.dtype)


def backward_pairs(outputs, positions, dtypes=None):
    """(outputs, cotangents) at `positions` (eager's `differentiated`), each with its position's `cotangent`; an
    output that is missing or does not require a gradient on this side gets none (its gradients then differ from
    eager's, which the comparison says)."""
    dtypes = dtypes or {}
    pairs = [(outputs[i], cotangent(i, outputs[i], dtypes.get(i))) for i in positions
             if i < len(outputs) and isinstance(outputs[i], torch.Tensor) and outputs[i].requires_grad]
    return [o for o, _ in pairs], [g for _, g in pairs]


def eager_positions(eager, inputs, backward):
    """The outputs eager differentiates (`differentiated`), from a forward run of eager's; None without a
    backward."""
    if not backward:
        return None
    args = fresh(inputs)
    torch.manual_seed(SEED)
    return differentiated(tree_leaves(eager()(*as_non_leaves(args))))


def as_non_leaves(args):
    """`args` with each tensor that requires grad fed as a clone (its gradient still reaches the leaf): in the run a
    piece that writes into such an input in place (`masked_fill_`) was given a non-leaf, an earlier piece's output,
    as autograd refuses the write on a leaf that requires grad; the metadata does not say which, a clone serves both."""
    return [x.clone() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in args]


#: The phase the latest `run` was in ("forward", "backward"): where a piece that raised raised.
RUNNING = {"phase": "forward"}


def run(fn, inputs, backward, float64=False, cotangent_dtypes=None, positions=None):
    """Forward outputs (flattened) and, with `backward`, the gradients of the inputs that require one, for the
    cotangents of the outputs at `positions` (eager's `differentiated`; this run's own where None, as for eager
    itself). Every run starts from the same seed, so random ops draw the same numbers where the backend draws them
    as eager does. With `float64`, the piece runs under `Float64Mode` (the inputs should be `to_float64` copies) and
    `cotangent_dtypes` (position -> eager's dtype) rounds its cotangents as eager's."""
    args = fresh(inputs)
    torch.manual_seed(SEED)
    RUNNING["phase"] = "forward"
    with (Float64Mode() if float64 else contextlib.nullcontext()):
        outputs = tree_leaves(fn(*as_non_leaves(args) if backward else args))
    if not backward:
        return outputs, None
    wanted = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
    differentiable, cotangents = backward_pairs(outputs, differentiated(outputs) if positions is None else positions,
                                                cotangent_dtypes)
    if not wanted or not differentiable:
        return outputs, None
    RUNNING["phase"] = "backward"
    with (Float64Mode() if float64 else contextlib.nullcontext()):
        grads = torch.autograd.grad(differentiable, wanted, cotangents, allow_unused=True)
    return outputs, list(grads)


def _wide(actual, expected):
    wide = torch.complex128 if actual.is_complex() or expected.is_complex() else torch.float64
    return actual.detach().to("cpu", wide), expected.detach().to("cpu", wide)


def _difference(actual, expected):
    """(largest absolute difference, largest magnitude of `expected`); NaN matches NaN and an infinity itself."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        same = actual == expected or (actual is None and expected is None)
        return (0.0 if same else math.inf), 0.0
    if actual.shape != expected.shape:
        return math.inf, 0.0
    a, b = _wide(actual, expected)
    if a.numel() == 0:
        return 0.0, 0.0
    matching = (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b))
    difference = torch.where(matching, torch.zeros_like(a.real), (a - b).abs()).nan_to_num(nan=math.inf)
    return float(difference.max()), float(b.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())


def judge(actual, expected, eager_value=None, fp64_value=None, floor=0.0):
    """(largest error between `actual` and `expected`, that error as a fraction of what is allowed: above 1 fails),
    by the correctness sentinel's rule (`verdict`, the same code as the sentinel's): within rtol * M + atol *
    min(1, M) of its reference, M the reference's largest magnitude; where not, and a float64 run of eager is known
    (`fp64_value`, run under `Float64Mode`), by its own distance to that run against what is allowed plus three
    times eager's own distance to it, plus `floor` (`rounding_floor` of the values judged with it). Against the run's
    outputs (`expected` is not `eager_value`: both sides compiled), by its distance to them with the same
    allowance."""
    error, scale = _difference(actual, expected)
    rtol, atol = tolerance(getattr(expected, "dtype", None))
    own = noise = None
    if isinstance(fp64_value, torch.Tensor) and isinstance(eager_value, torch.Tensor) \
            and isinstance(actual, torch.Tensor) and actual.shape == expected.shape == fp64_value.shape:
        noise, _ = _difference(eager_value, fp64_value)
        own = _difference(actual, fp64_value)[0] if expected is eager_value else error
    ratio, _, _ = verdict(error, scale, rtol, atol, own, noise, floor)
    return error, ratio


def _judged(actual, expected, eager=None, fp64=None):
    """(error, ratio) of each value of `actual` against `expected` (`judge`), each with the rounding floor of the
    largest magnitude among the values of its dtype in `expected`."""
    piece_scale = {}  # the largest magnitude among the values of each dtype, for `rounding_floor`
    for e in expected:
        if isinstance(e, torch.Tensor) and e.is_floating_point():
            piece_scale[e.dtype] = max(piece_scale.get(e.dtype, 0.0), _difference(e, e)[1])
    judged = []
    for i, (a, e) in enumerate(zip(actual, expected)):
        eager_value = eager[i] if eager is not None and i < len(eager) else None
        fp64_value = fp64[i] if fp64 is not None and i < len(fp64) else None
        floor = rounding_floor(getattr(e, "dtype", None), piece_scale.get(getattr(e, "dtype", None), 0.0))
        judged.append(judge(a, e, eager_value, fp64_value, floor))
    return judged


def compare(what, actual, expected, eager=None, fp64=None, picks=None, gradients=False, run_outputs=False):
    """Prints the largest error between two lists of values; True when every one is within what is allowed (see
    `judge`). `eager` and `fp64` are eager's values for the same inputs in the piece's dtypes and in float64.
    `picks`: eager's run (`eager`) under `Picks`; a value beyond what is allowed that `Picks.excuse` (or, for
    `gradients`, `Picks.excuse_gradient`) excuses is said and not held against the piece. With `run_outputs`,
    `expected` are the values the run returned, which picked among ties as the run's backend did: a value is
    excused where it and the run's are each eager's or excused against eager's."""
    if len(actual) != len(expected):
        print(f"  {what}: {len(actual)} values, expected {len(expected)}: MISMATCH")
        return False
    judged = _judged(actual, expected, eager, fp64)
    beyond = [i for i, (_, ratio) in enumerate(judged) if ratio > 1.0]
    excuses = {}
    if picks is not None and (beyond or run_outputs):
        if gradients:
            excuses = {i: picks.excuse_gradient() for i in beyond}
        elif run_outputs:
            excuses = _excused_against_the_run(picks, actual, expected, eager, fp64, beyond)
        else:
            excuses = picks.excuses(actual, expected, beyond)
    worst_error, worst_ratio, index = 0.0, 0.0, None
    for i, (error, ratio) in enumerate(judged):
        if excuses.get(i):
            print(f"  {what}: value {i} is {error:.3g} off: {excuses[i]}")
            continue
        worst_error = max(worst_error, error)
        if index is None or ratio > worst_ratio:
            worst_ratio, index = ratio, i
    if index is None:
        print(f"  {what}: nothing to compare")
        return True
    dtype = getattr(expected[index], "dtype", type(expected[index]).__name__)
    rtol, atol = tolerance(dtype)
    slack = f", + {NOISE_SLACK:g} x eager's own error against float64" if fp64 is not None else ""
    verdict_word = "OK" if worst_ratio <= 1.0 else "MISMATCH"
    print(f"  {what}: largest error {worst_error:.3g}; worst value {index} ({str(dtype).replace('torch.', '')}) at "
          f"{worst_ratio:.2g} of what is allowed (rtol={rtol:g} * M + atol={atol:g} * min(1, M), M its largest "
          f"magnitude{slack}): {verdict_word}")
    return worst_ratio <= 1.0


def _excused_against_the_run(picks, actual, returned, eager, fp64, beyond):
    """Position -> why `actual[i]`, beyond what is allowed against the run's `returned[i]`, is no mismatch: each of
    the two is within what is allowed of eager's value or excused against it by `picks` (the run's backend and this
    one picked otherwise among tied values, or from values such a pick fed). Every value of `actual` is judged
    against eager's, so that `picks` learns where this piece picked otherwise than eager even where it picked as
    the run did (its gradients then follow other picks than eager's)."""
    def off_eager(values):
        return [i for i, (_, ratio) in enumerate(_judged(values, eager, eager, fp64)) if ratio > 1.0]

    found = {}
    ours, theirs = off_eager(actual), off_eager(returned)
    ours_excused, theirs_excused = picks.excuses(actual, eager, ours), picks.excuses(returned, eager, theirs)
    for i in beyond:
        if (i in ours and i not in ours_excused) or (i in theirs and i not in theirs_excused):
            continue
        reason = ours_excused.get(i) or theirs_excused.get(i)
        if reason:
            found[i] = reason if i in ours_excused else f"the run's value: {reason}"
    return found


def _run_float64(eager, inputs, backward, like=None):
    """Eager under `Float64Mode`, the yardstick for rounding, with the cotangents of eager's run (`like`: its
    outputs); (None, None) where the piece cannot run in float64."""
    positions = differentiated(like) if like is not None else None
    dtypes = {i: like[i].dtype for i in positions} if positions is not None else None
    try:
        return run(eager, to_float64(inputs, requires_grad=True), backward, float64=True, cotangent_dtypes=dtypes,
                   positions=positions)
    except Exception as e:  # e.g. an op without a float64 kernel: judge with the dtype's tolerance alone
        print(f"  (no float64 reference: {type(e).__name__}: {str(e)[:200]})")
        return None, None


def _host_copies(values):
    if values is None:
        return None
    return [v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for v in values]


def _unchanged(a, b):
    """Exactly the same values, a NaN equal to itself, same shape and dtype."""
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def unchanged_since_returned(what, now, returned):
    """False, with a line saying which, when values the piece returned hold other values after eager has run: some
    later work wrote into their memory (a buffer the piece freed or reused too early, or an out-of-bounds write),
    which no comparison of the returned values can show."""
    changed = [i for i, (a, b) in enumerate(zip(now, returned))
               if isinstance(a, torch.Tensor) and not _unchanged(a.detach().cpu(), b)]
    if changed:
        print(f"  {what}: values {changed} changed after the piece returned them, while eager ran: later work wrote "
              "into their memory (freed or reused too early, or written out of bounds): MISMATCH")
    return not changed


def _is_binding_error(error):
    return any(text in str(error) for text in _BINDING_ERRORS)


def check(fn, eager, inputs, expected_outputs, is_eager, backward, random_ops=(), run_failure=None):
    """Runs the piece once and compares it: forward outputs with the run's (where saved) or with eager's, gradients
    with eager's; then checks that what it returned is unchanged after eager ran. Eager and a float64 eager run once
    each. Returns the verdict; exceptions of the piece itself become CRASH or REFUSED, or REPRODUCED where they are
    the run's failure (`run_failure`, see `main`)."""
    # An eager piece judged against the run's values records its own picks (`Picks`): the run may have picked
    # otherwise among ties.
    picks = Picks() if is_eager and expected_outputs is not None else None
    positions = None
    if not is_eager:
        try:  # the outputs every side differentiates, each with its own cotangent: eager's (see `differentiated`)
            positions = eager_positions(eager, inputs, backward)
        except Exception:  # eager refuses these inputs: said below, where eager runs again
            positions = None
    try:
        with (picks if picks is not None else contextlib.nullcontext()):
            outputs, grads = run(fn, inputs, backward, positions=positions)
    except Exception as error:
        if is_eager:
            traceback.print_exc()
            return Verdict(Outcome.REFUSED, f"eager raised {type(error).__name__}: {str(error)[:300]}")
        return _reproduced(error, RUNNING["phase"], run_failure) or _classify_failure(error, eager, inputs, backward)
    if is_eager and expected_outputs is None:
        print(f"  ran eagerly: {len(outputs)} outputs" + (f", {len(grads)} gradients" if grads else ""))
        return Verdict(Outcome.OK, "ran eagerly (an eager script has nothing to compare with)")
    # What the piece returned, copied to the host at once: the comparisons judge these, and the values left on the
    # device are checked against them after eager has run, which catches memory written after the piece returned.
    returned_outputs, returned_grads = _host_copies(outputs), _host_copies(grads)
    reference = eager()
    if is_eager:
        eager_outputs, eager_grads = outputs, grads
    else:
        picks = Picks()
        try:
            with picks:
                eager_outputs, eager_grads = run(reference, inputs, backward, positions=positions)
        except Exception as error:
            traceback.print_exc()
            return Verdict(Outcome.REFUSED, f"eager raised {type(error).__name__} on these inputs: {str(error)[:300]}")
    # Random numbers drawn in float64 are other numbers: with random ops, the float64 run measures nothing.
    fp64_outputs, fp64_grads = (None, None) if random_ops else _run_float64(reference, inputs, backward,
                                                                          like=eager_outputs)
    ok = True
    if expected_outputs is not None:
        ok &= compare("forward outputs vs the run's", returned_outputs, expected_outputs, eager_outputs, fp64_outputs,
                      picks, run_outputs=True)
    else:
        ok &= compare("forward outputs vs eager", returned_outputs, eager_outputs, eager_outputs, fp64_outputs, picks)
    if not is_eager and (grads is not None or eager_grads is not None):
        ok &= compare("gradients vs eager", returned_grads or [], eager_grads or [], eager_grads, fp64_grads, picks,
                      gradients=True)
    unchanged = unchanged_since_returned("forward outputs", outputs, returned_outputs)
    unchanged &= unchanged_since_returned("gradients", grads or [], returned_grads or [])
    if not unchanged:
        return Verdict(Outcome.MISMATCH, "values the piece returned changed after it returned them")
    if ok and picks is not None and picks.differed:
        not_compared = sorted({e for e in picks.differed if e.startswith("not compared")})
        if not_compared:
            return Verdict(Outcome.NOT_COMPARABLE, "; ".join(not_compared),
                           meaning=TIED_WITH_THE_RUN_MEANING if is_eager else TIED_MEANING)
        return Verdict(Outcome.OK, "; ".join(sorted(set(picks.differed))))
    if ok:
        return Verdict(Outcome.OK, "same random numbers as eager (reseeded), values compared" if random_ops else "")
    if random_ops:
        return Verdict(Outcome.NOT_COMPARABLE, "values differ")
    return Verdict(Outcome.MISMATCH, "results differ beyond the tolerance")


def _classify_failure(error, eager, inputs, backward):
    """The piece raised: REFUSED where eager refuses the same inputs too or the backend refused to bind them, CRASH
    where eager computes them."""
    traceback.print_exc()
    summary = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"
    if _is_binding_error(error):
        return Verdict(Outcome.REFUSED, f"the backend refused to bind the inputs ({summary})")
    try:
        run(eager(), inputs, backward)
    except Exception as eager_error:
        return Verdict(Outcome.REFUSED, f"eager refuses these inputs too ({type(eager_error).__name__}: "
                                        f"{str(eager_error)[:200]})")
    return Verdict(Outcome.CRASH, summary)


# ---- the run's failure: a piece that raised in the run ---------------------------------------------------------------


def the_run_raised(run_failure):
    """"AssertionError at thunder/executors/torch_autograd.py:75 forward, in the forward of call 1"."""
    message = run_failure.get("message", "").strip().splitlines()
    exception = run_failure["type"] + (f": {message[0][:200]}" if message else "")
    where = f" at {run_failure['raised_at']}" if run_failure.get("raised_at") else ""
    phase = run_failure.get("failed_in", "forward")
    when = ("while ThunderFX compiled the graph" if phase == "compile"
            else f"in the {phase} of call {run_failure.get('call', 1)}")
    return f"{exception}{where}, {when}"


def _reproduced(error, phase, run_failure):
    """REPRODUCED where `error`, raised in `phase`, is the run's failure (`scripts/run_failure.same_failure`; a
    failure of the run's compile, or of a fusion region, counts in either phase), else None."""
    if run_failure is None or not same_failure(run_failure, described(error)):
        return None
    if run_failure.get("failed_in", "compile") not in ("compile", phase) and not run_failure.get("region"):
        return None  # a region's script runs its ops alone, in neither phase
    traceback.print_exc()
    return Verdict(Outcome.REPRODUCED, f"raised what the run raised: {the_run_raised(run_failure)}")


def _why_not_reproduced(run_failure):
    """What the run had that this script has not, which the failure may have needed."""
    reasons = []
    if run_failure.get("call", 1) > 1:
        reasons.append(f"the {run_failure['call'] - 1} calls of the piece before the failing one (Thunder's caches, "
                       "the executors' state)")
    if run_failure.get("failed_in") == "backward":
        reasons.append("the incoming gradients of its backward (drawn here)")
    if run_failure.get("inputs") != "real":
        reasons.append("the values of its inputs (drawn here, laid out as the run's; THUNDERFX_DEBUG_INPUTS=real "
                       "keeps them)")
    reasons.append("the rest of the training process (other compiled pieces, memory, the device's state)")
    return "; ".join(reasons)


def against_the_run(verdict, run_failure):
    """`verdict` of a piece that failed in the run (`run_failure`) and ran here without raising: NOT REPRODUCED
    where it found nothing wrong (never OK), a MISMATCH that says the failure did not reproduce; other verdicts (of
    a piece that raised something else, or could not be judged) with what the run raised."""
    if verdict.outcome in (Outcome.OK, Outcome.NOT_COMPARABLE):
        found = "and matched eager" if verdict.outcome is Outcome.OK else "(its values not comparable)"
        return Verdict(Outcome.NOT_REPRODUCED, f"the run raised {the_run_raised(run_failure)}; here the piece ran "
                                               f"{found}: the failure may need what only the run had: "
                                               f"{_why_not_reproduced(run_failure)}")
    if verdict.outcome in (Outcome.REPRODUCED, Outcome.REFUSED):
        return verdict
    return Verdict(verdict.outcome, f"{verdict.detail}; not the run's failure, which was "
                                    f"{the_run_raised(run_failure)}", verdict.meaning)


# ---- mismatch scripts: a piece the correctness sentinel found mismatching during training ---------------------------


def load_gradients(path, script):
    """The gradients of a gradient mismatch, from the inputs file next to the script: those that came into the piece
    (one per output, None where none came) and those it passed to its inputs that require one (None where the
    sentinel did not compare them)."""
    saved = torch.load(Path(script).resolve().parent / path, weights_only=True)
    incoming, passed_on = saved.get("grad_outputs"), saved.get("grads")
    return (None if incoming is None else [_rebuild(x) for x in incoming],
            None if passed_on is None else [_rebuild(x) for x in passed_on])


def _gradients(fn, inputs, incoming, float64=False):
    """The gradients of the inputs of `fn` that require one, for the given incoming gradients of its outputs (with
    `float64`, under `Float64Mode`)."""
    args = fresh(inputs)
    torch.manual_seed(SEED)
    with (Float64Mode() if float64 else contextlib.nullcontext()):
        outputs = tree_leaves(fn(*as_non_leaves(args)))
    wanted = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
    pairs = [(o, g) for o, g in zip(outputs, list(incoming) + [None] * len(outputs))
             if isinstance(o, torch.Tensor) and o.requires_grad and isinstance(g, torch.Tensor)]
    if not pairs or not wanted:
        return [None] * len(wanted)
    with (Float64Mode() if float64 else contextlib.nullcontext()):
        grads = torch.autograd.grad([o for o, _ in pairs], wanted, [g.to(o.device, o.dtype) for o, g in pairs],
                                    allow_unused=True)
    return [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, wanted)]


def _picked(values, indices):
    """The values at `indices` (all of them without), leaving out those the run did not record (None)."""
    indices = range(len(values)) if not indices else indices
    return [values[i] for i in indices if i < len(values) and values[i] is not None]


#: Why a mismatch script with redrawn dropouts (`drawn_as_run`) does not judge the run's own values: they were drawn
#: from the run's generator state, the script's from its seed.
RUN_DRAWS_UNKNOWN = "not judged here (the run drew its dropouts from a generator state this script does not have)"


def check_mismatch(build, eager, inputs, expected_outputs, mismatch, script, drawn=False):
    """What the run produced on the piece's first mismatching call (saved with its inputs) against eager on those
    inputs, then the piece run again here against eager: the values the sentinel compared (`mismatch["values"]`:
    output positions, or for gradients positions among the inputs that require one). With `drawn` (the piece's
    dropouts are drawn again, `drawn_as_run`), the run's values are not judged (`RUN_DRAWS_UNKNOWN`); the rerun
    draws both sides from one seed. Returns (in the run, outside the run) as words for the RESULT line."""
    print(f"  in the run, call {mismatch.get('call')} ({mismatch.get('phase')}), the correctness sentinel found:")
    for line in mismatch.get("findings", []):
        print(f"    {line}")
    picked = mismatch.get("values") or []
    reference = eager()
    if mismatch.get("compares") == "gradients":
        if not mismatch.get("inputs_file"):
            return "not saved", "not rerun (the incoming gradients were not saved)"
        incoming, passed_on = load_gradients(mismatch["inputs_file"], script)
        if incoming is None:
            return "not saved", "not rerun (the incoming gradients were not saved)"
        expected = _gradients(reference, inputs, incoming)
        wide = _gradients(reference, to_float64(inputs, requires_grad=True), to_float64(incoming), float64=True)
        in_run = RUN_DRAWS_UNKNOWN if drawn else "not saved"
        if passed_on is not None and not drawn:
            ok = compare("the run's gradients vs eager", _picked(passed_on, picked), _picked(expected, picked),
                         _picked(expected, picked), _picked(wide, picked))
            in_run = "within the tolerance here" if ok else "beyond the tolerance"
        try:
            again = _gradients(build(), inputs, incoming)
        except Exception as error:
            traceback.print_exc()
            return in_run, f"not rerun ({type(error).__name__}: {str(error)[:300]})"
        ok = compare("gradients rerun here vs eager", _picked(again, picked), _picked(expected, picked),
                     _picked(expected, picked), _picked(wide, picked))
        return in_run, "does not reproduce" if ok else "reproduces"
    eager_outputs, _ = run(reference, inputs, backward=False)
    fp64_outputs, _ = _run_float64(reference, inputs, backward=False)
    fp64_outputs = fp64_outputs or []
    in_run = RUN_DRAWS_UNKNOWN if drawn else "not saved"
    if expected_outputs is not None and not drawn:
        ok = compare("the run's outputs vs eager", _picked(expected_outputs, picked), _picked(eager_outputs, picked),
                     _picked(eager_outputs, picked), _picked(fp64_outputs, picked) or None)
        in_run = "within the tolerance here" if ok else "beyond the tolerance"
    try:
        outputs, _ = run(build(), inputs, backward=False)
    except Exception as error:
        traceback.print_exc()
        return in_run, f"not rerun ({type(error).__name__}: {str(error)[:300]})"
    returned = _host_copies(outputs)
    ok = compare("outputs rerun here vs eager", _picked(returned, picked), _picked(eager_outputs, picked),
                 _picked(eager_outputs, picked), _picked(fp64_outputs, picked) or None)
    ok &= unchanged_since_returned("outputs rerun here", outputs, returned)
    return in_run, "does not reproduce" if ok else "reproduces"


def _mismatch_main(piece, executor, backend, build, eager, make_inputs, expected_outputs, mismatch, script,
                   drawn=False):
    """A mismatch script's `main`: always MISMATCH (exit 1), the mismatch happened in the run; the line says whether
    the saved outputs differ from eager here too, and whether running the piece again reproduces it."""
    print(f"{piece} [{executor}]  ({Path(script).name}): a mismatch found during training")
    torch.manual_seed(SEED)
    try:
        inputs = make_inputs()
        if callable(expected_outputs):
            expected_outputs = expected_outputs()
        in_run, outside = check_mismatch(build, eager, inputs, expected_outputs, mismatch, script, drawn)
    except Exception as error:
        traceback.print_exc()
        in_run, outside = "not compared", f"not rerun ({type(error).__name__}: {str(error)[:300]})"
    detail = f"in the run: {in_run}; outside the run, with {executor}: {outside}"
    if outside == "reproduces":
        print(Verdict(Outcome.MISMATCH, detail).line(backend))
    else:  # seen in the run only: what differed there (memory layout, other work in flight) is part of the finding
        print(Verdict(Outcome.MISMATCH, detail, meaning="seen in the run only, so report it with the run's dump, not "
                                                       "this script alone").line(backend))
    sys.stdout.flush()
    return int(Outcome.MISMATCH)


# ---- timing ---------------------------------------------------------------------------------------------------------

DEVICE_CALLS = 20  # calls per device-time measurement: queued behind one hold, well inside CUDA's launch queue
DEVICE_ROUNDS = 5  # measurements; the median is reported


def device_ms(call, host_ms):
    """Median device milliseconds per `call()` on CUDA: the GPU's own time for the call's kernels.

    A standalone call of a small region is mostly host overhead, which the region does not pay inside a compiled
    graph. So the calls are queued behind a hold (`held_device_ms`: a spin kernel longer than their host time), and
    CUDA events around them time the kernels back to back, as the backend's fusion-level timing does."""
    return statistics.median(held_device_ms(call, DEVICE_CALLS, host_ms) for _ in range(DEVICE_ROUNDS))


@dataclasses.dataclass(frozen=True)
class BenchmarkFigures:
    """Median milliseconds per call: wall clock (host and device, as torch.utils.benchmark measures) and, on CUDA,
    device time (`device_ms`). Backward is None where the piece has none."""

    forward_ms: float
    backward_ms: float = None
    forward_device_ms: float = None
    backward_device_ms: float = None


def benchmark(fn, inputs, backward, min_run_time, positions=None):
    """Times the forward, and the backward where the piece has one, as (forward + backward) - forward: compiled
    backward functions may free what they saved after one use, so a backward alone cannot be run repeatedly. The
    backward is that of the outputs at `positions` (eager's `differentiated`, so that every backend's script times
    the same gradients), each with its `cotangent`."""
    from torch.utils.benchmark import Timer

    args = fresh(inputs)
    wanted = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
    on_cuda = torch.cuda.is_available() and any(isinstance(x, torch.Tensor) and x.is_cuda for x in tree_leaves(args))

    def forward():
        return fn(*args)

    def pairs():
        outputs = tree_leaves(fn(*args))
        return backward_pairs(outputs, differentiated(outputs) if positions is None else positions)

    def forward_backward():
        outputs, cotangents = pairs()
        torch.autograd.grad(outputs, wanted, cotangents, allow_unused=True)

    forward_ms = Timer("forward()", globals={"forward": forward}).blocked_autorange(min_run_time=min_run_time).median
    forward_ms *= 1e3
    forward_device = device_ms(forward, forward_ms) if on_cuda else None
    if not backward or not wanted or not pairs()[0]:
        return BenchmarkFigures(forward_ms, None, forward_device)
    both = Timer("step()", globals={"step": forward_backward}).blocked_autorange(min_run_time=min_run_time).median
    both *= 1e3
    both_device = device_ms(forward_backward, both) if on_cuda else None
    return BenchmarkFigures(forward_ms, max(both - forward_ms, 0.0), forward_device,
                            None if both_device is None else max(both_device - forward_device, 0.0))


def _describe(timings):
    def pair(wall, device):
        if wall is None:
            return "n/a"
        return f"{wall:.3f} ms" + (f" (device {device:.3f} ms)" if device is not None else "")

    clocks = "wall clock, device time in parentheses" if timings.forward_device_ms is not None else "wall clock"
    return (f"forward {pair(timings.forward_ms, timings.forward_device_ms)}, "
            f"backward {pair(timings.backward_ms, timings.backward_device_ms)} (medians, {clocks})")


# ---- entry point ----------------------------------------------------------------------------------------------------


def drawn_as_run(eager, how):
    """`eager` (what makes the eager reference) with the reference's dropouts drawn as the run's backend drew them
    (`DrawnAsRun`, `how` one of its `DRAWS`), from the generator's state when the reference is called: every run
    reseeds first (`run`), so both sides start from the same state. The dtype of each draw (and the mask of each
    "eager" dropout) is the one the first run saw, so that the float64 run draws the same numbers."""
    dtypes, masks = [], []

    def make():
        reference = eager()

        def drawn(*args):
            seed, offset = thunder_seed_and_offset(torch.cuda.get_rng_state()) if how == "nvfuser" else (0, 0)
            with DrawnAsRun(how, seed, offset, dtypes, masks):
                return reference(*args)

        return drawn

    return make


def main(*, piece, executor, backend, build, eager, make_inputs, expected_outputs=None, backward=True,
         random_ops=(), refusal=None, argv=None, script=None, mismatch=None, run_failure=None, draws=None):
    """Checks the piece, with `--benchmark` also times it, and returns the exit status (see `Outcome`).

    build: makes the piece's callable (compiling is done by its first call); eager: makes the eager reference;
    make_inputs: the inputs; expected_outputs: what the run's call returned (or a function that loads it), where
    saved; random_ops: the names of
    the random ops in the piece (reseeded runs; a difference is NOT COMPARABLE); refusal: inputs -> why the backend
    cannot take them, or None; mismatch: for the script of a piece the correctness sentinel found mismatching in
    the run (its call, phase, findings, the values it compared, the inputs file), `check_mismatch` instead of the
    check, and exit 1 whatever it finds. run_failure: for the script of the piece that raised in the run, what it
    raised (`scripts/run_failure.described`, with where: `failed_in`, `call`, `raised_at`; `inputs`: "real" where
    the script has the run's values): REPRODUCED where it raises the same, NOT REPRODUCED where it runs. draws: how
    the backend drew the piece's dropouts where the reference can draw them so (`drawn_as_run`): its random values
    are then compared, a difference is a MISMATCH."""
    script = script or sys.argv[0]
    if draws is not None:
        eager = drawn_as_run(eager, draws)
    parser = argparse.ArgumentParser(description=f"Repro of {piece} run with {executor} (written by thunderfx_debug)")
    parser.add_argument("--benchmark", action="store_true", help="also time forward (and backward) after the check")
    parser.add_argument("--json", metavar="PATH", help="write the verdict (and with --benchmark the figures) as JSON")
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds of timing per figure (default 0.5)")
    options = parser.parse_args(argv)
    if mismatch is not None:
        return _mismatch_main(piece, executor, backend, build, eager, make_inputs, expected_outputs, mismatch, script,
                              drawn=draws is not None)
    print(f"{piece} [{executor}]  ({Path(script).name})")
    if run_failure is not None:
        print(f"  in the run it raised {the_run_raised(run_failure)}; this script expects the same")
    if random_ops:
        # Inductor draws random numbers with its own generator unless told to call eager's random ops.
        from torch._inductor import config as inductor_config

        inductor_config.fallback_random = True
    verdict, fn, inputs = _checked(build, eager, make_inputs, expected_outputs, executor == "eager", backward,
                                   random_ops, refusal, run_failure)
    figures = {"script": Path(script).name, "piece": piece, "executor": executor, "outcome": verdict.outcome.name}
    if options.benchmark and fn is not None and verdict.outcome in (Outcome.OK, Outcome.MISMATCH,
                                                                     Outcome.NOT_COMPARABLE):
        torch.manual_seed(SEED)
        try:
            positions = None if executor == "eager" else eager_positions(eager, inputs, backward)
            timings = benchmark(fn, inputs, backward, options.min_run_time, positions)
        except Exception as error:  # the verdict stands; the figures are missing, and the JSON says why
            traceback.print_exc()
            figures["benchmark_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        else:
            print(f"  benchmark: {_describe(timings)}")
            figures.update(dataclasses.asdict(timings))
    print(verdict.line(backend, random_ops))
    if options.json:
        Path(options.json).write_text(json.dumps(figures, indent=1) + "\n")
    sys.stdout.flush()
    return int(verdict.outcome)


def _checked(build, eager, make_inputs, expected_outputs, is_eager, backward, random_ops, refusal, run_failure=None):
    torch.manual_seed(SEED)
    try:
        inputs = make_inputs()
        if callable(expected_outputs):  # saved with the inputs: loaded here, where a failure is a REFUSED
            expected_outputs = expected_outputs()
        reason = refusal(inputs) if refusal is not None else None
        if reason:
            raise Refused(reason)
    except Exception as error:
        traceback.print_exc()
        return Verdict(Outcome.REFUSED, f"{type(error).__name__}: {str(error)[:300]}"), None, None
    try:
        fn = build()
    except NotRebuilt as error:
        traceback.print_exc()
        return Verdict(Outcome.NOT_REBUILT, str(error)), None, None
    except Exception as error:
        if type(error).__name__ == "MissingExecutor":  # Thunder support's: the run's executor is not registered here
            return Verdict(Outcome.NOT_REBUILT, str(error), meaning=MISSING_EXECUTOR_MEANING), None, None
        reproduced = _reproduced(error, "forward", run_failure)
        if reproduced is not None:
            return reproduced, None, None
        traceback.print_exc()
        verdict = Verdict(Outcome.CRASH, f"building the piece raised {type(error).__name__}: {str(error)[:300]}")
        return (verdict if run_failure is None else against_the_run(verdict, run_failure)), None, None
    verdict = check(fn, eager, inputs, expected_outputs, is_eager, backward, random_ops, run_failure)
    return (verdict if run_failure is None else against_the_run(verdict, run_failure)), fn, inputs
