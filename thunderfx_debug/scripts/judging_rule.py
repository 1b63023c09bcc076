"""The judging rule: whether a value a piece computed matches its eager reference, the rule of the correctness
sentinel (`recording/compare.py`) and of every repro script, with its float64 yardstick.

A floating-point value passes when its largest error is within rtol * M + atol * min(1, M), M the largest magnitude
of its reference, with its dtype's (rtol, atol); where it does not, it is judged by its own distance to a float64 run
of the same code (`Float64Mode`), which may be that plus three times eager's own largest error against the float64
run, plus one unit of the dtype's precision at the largest magnitude among the values judged with it
(`rounding_floor`): rounding that eager does too (bf16 matmuls, an explicit cast to bf16 inside the piece) is not a
mismatch, nor is the noise of a value that is zero but for rounding. The floor shrinks with the values below 1,
because a fixed one lets any error pass in a tensor of small values (a bf16 model's gradients are ~1e-3, bf16's atol
5e-2). That is the accuracy minifier's idea (`torch._dynamo.utils.same` with `fp64_ref`), with maxima instead of its
RMSE, because a fault that corrupts a few hundred elements of a large tensor (the H200's nvFuser writing out of
bounds) hardly moves an RMSE. Integer and bool values must be equal. An index output of an op that picks among tied
values (topk, sort, argmax) is judged by the values its indices pick (`Picks`).

The sentinel imports this module and the repro writer inlines its text into each script (see the package's
docstring), so a MISMATCH of the sentinel and its script's "in the run" line are the same judgement.
"""

import math
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

#: (rtol, atol) by dtype: a compiled piece reorders floating-point work, so results differ by rounding, more with
#: fewer mantissa bits. Integer and bool values must match exactly.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.complex64: (1e-4, 1e-4),
    torch.complex128: (1e-7, 1e-7),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
_FLOAT8_TOLERANCE = (0.25, 0.25)
#: Eager's own largest error against float64, times this, is added to what a value may differ by.
NOISE_SLACK = 3.0
#: A value whose eager result is this far from float64, relative to its magnitude, is rounding noise (a value zero
#: but for cancellation): no digit of it beyond the first is eager's own. Where a value that is zero but for
#: rounding lands relative to float64 is chance: BERT's forward region on one CPU gave eager a third of the value's
#: magnitude, on another over half. A value eager computes well is off by a few units of its dtype's precision.
NOISE_DOMINATED = 0.1


def tolerance(dtype):
    """(rtol, atol) for values of `dtype`; (0, 0) for exact types."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return _FLOAT8_TOLERANCE
    return (0.0, 0.0)


def allowed_error(rtol, atol, scale):
    """What a value whose reference's largest magnitude is `scale` may differ by, before eager's own noise.

    Example (bfloat16: 5 % of the values' size, atol at full height only for values of 1 and above):
        >>> allowed_error(0.05, 0.05, 10.0), allowed_error(0.05, 0.05, 1e-3)
        (0.55, 0.0001)
    """
    return rtol * scale + atol * min(1.0, scale)


def rounding_floor(dtype, piece_scale):
    """One unit of `dtype`'s precision at the largest magnitude among the values of that dtype judged together
    (`piece_scale`: a piece's outputs, or its gradients): the absolute rounding noise a value computed from such
    values can carry, however small the value itself is. `verdict` allows it only to a value that is mostly noise
    (eager's own error against float64 at least NOISE_DOMINATED of its magnitude): a gradient that is zero but for
    rounding (a bias before a normalisation: ~1e-13 in float32 beside values ~0.4) is noise to either side, which
    no multiple of eager's own error bounds, while a small value eager computes well keeps its own tolerance."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return 0.0
    return torch.finfo(dtype).eps * piece_scale


def verdict(error, scale, rtol, atol, own=None, noise=None, floor=0.0):
    """(ratio, allowed, against float64): a value's largest `error` against its reference (largest magnitude
    `scale`) as a fraction of what is allowed; above 1 is a mismatch. Where that is above 1 and a float64 run is
    known (`own`: the value's largest error against it, `noise`: the reference's), the value is judged by `own`
    against what is allowed plus NOISE_SLACK times `noise`, plus `floor` (`rounding_floor`) where the reference is
    mostly noise (`noise` at least NOISE_DOMINATED of `scale`). Exact types (rtol = atol = 0) allow nothing."""
    if rtol == 0 and atol == 0:
        return (math.inf if error > 0 else 0.0), 0.0, False
    allowed = allowed_error(rtol, atol, scale)
    ratio = error / allowed if allowed > 0 else (math.inf if error > 0 else 0.0)
    if not ratio > 1.0 or own is None or noise is None:
        return ratio, allowed, False
    allowed = allowed + NOISE_SLACK * noise + (floor if noise >= NOISE_DOMINATED * scale else 0.0)
    return (own / allowed if allowed > 0 else (math.inf if own > 0 else 0.0)), allowed, True


_LOWER_PRECISION_METHODS = frozenset({torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16})
_LOWER_PRECISION_TYPE_NAMES = frozenset({"FloatTensor", "HalfTensor", "BFloat16Tensor"})
_FACTORIES = frozenset({torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.zeros, torch.ones, torch.empty,
                        torch.full, torch.arange, torch.linspace, torch.logspace, torch.eye})
_ENTER_AUTOCAST = getattr(torch.amp.autocast_mode, "_enter_autocast", None)


def _widened(value):
    """A dtype (or legacy tensor type name) an op is asked for, as its float64 (complex128) counterpart."""
    if isinstance(value, torch.dtype):
        if value.is_complex:
            return torch.complex128
        if value.is_floating_point:
            return torch.float64
    if isinstance(value, str) and value.startswith("torch.") and value.rpartition(".")[2] in _LOWER_PRECISION_TYPE_NAMES:
        return value.rpartition(".")[0] + ".DoubleTensor"
    return value


def _wide_result(value):
    if isinstance(value, torch.Tensor):
        if value.is_complex() and value.dtype is not torch.complex128:
            return value.to(torch.complex128)
        if value.is_floating_point() and value.dtype is not torch.float64:
            return value.to(torch.float64)
    return value


class Float64Mode(TorchFunctionMode):
    """Runs torch code in float64, the yardstick for rounding: every conversion to a floating dtype becomes one to
    float64 whatever the source (`x.float()` of an int64 tensor, `x.to(torch.bfloat16)`, `x.type(torch.half)`,
    `dtype=` keywords), factories without a dtype make float64, autocast is off (also where the code enters it),
    and any floating result of lower precision left over is widened. With its inputs in float64 (`to_float64`), an
    FX module or a fusion region's torch function computes in float64 throughout, so that the roundings the code
    asks for (a bf16 cast inside a piece) count as eager's own noise, not as the yardstick's.

    Why not `torch._dynamo.debug_utils.cast_to_fp64`: it rewrites the dtype arguments of aten-level FX graphs
    (`prims.convert_element_type` and `dtype=` keywords) but not the `Tensor.to` / `.float()` method calls of the
    Dynamo graphs ThunderFX splits, and a fusion region's reference is a Python function, not an FX graph.

    Example:
        >>> with Float64Mode():
        ...     torch.ones(2, dtype=torch.bfloat16).dtype, torch.arange(3).float().dtype, torch.zeros(2).dtype
        (torch.float64, torch.float64, torch.float64)
    """

    def __enter__(self):
        self._autocast_off = [torch.autocast(device, enabled=False) for device in ("cpu", "cuda")
                              if torch.is_autocast_enabled(device)]
        for context in self._autocast_off:
            context.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for context in reversed(self._autocast_off):
                context.__exit__(None, None, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _LOWER_PRECISION_METHODS:
            return args[0].to(torch.float64) if not args[0].is_complex() else func(*args, **kwargs)
        if func is _ENTER_AUTOCAST:  # torch.autocast(device, dtype, enabled, cache) inside a Dynamo graph
            return func(args[0], args[1], False, *args[3:])
        args, kwargs = tree_map(_widened, (tuple(args), kwargs))
        result = func(*args, **kwargs)
        if func in _FACTORIES and kwargs.get("dtype") is None and isinstance(result, torch.Tensor) \
                and result.is_floating_point() and result.dtype is not torch.float64:
            return func(*args, **{**kwargs, "dtype": torch.float64})  # made as float64, not rounded first
        return tree_map(_wide_result, result)


def to_float64(values, requires_grad=False):
    """Floating-point tensors as float64 copies (complex as complex128; leaves that require grad where
    `requires_grad` and the original did); other values as they are."""
    result = []
    for x in values:
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
            wide = x.detach().to(torch.complex128 if x.is_complex() else torch.float64)
            result.append(wide.requires_grad_(bool(requires_grad and x.requires_grad)))
        else:
            result.append(x)
    return result


#: Ops whose index outputs pick one of several equal values in an order of their own (torch promises none for topk,
#: sort and argsort unless stable, argmax, argmin, max and min along a dim): a backend may pick another of them.
PICKING_OPS = frozenset({"topk", "sort", "argsort", "argmax", "argmin", "max", "min"})
#: Ops that write their result into their first argument: a value written from a pick depends on it.
_WRITES_FIRST_ARGUMENT = frozenset({"__setitem__", "index_put_", "scatter_", "scatter_add_", "index_copy_",
                                    "index_add_", "masked_scatter_", "copy_"})


class Picks(TorchFunctionMode):
    """Eager run under it, what the ops of `PICKING_OPS` picked: each index tensor they returned with the values it
    picks from, whether they had a choice (values within a tolerance of each other where the order decides: the
    k-th and the next for top-k, neighbours for a sort, the extreme for argmax), and which tensors depend on a pick
    (computed from an index tensor, or written from one). The tolerance of floating-point values picked from is
    that of the coarsest floating dtype the run had seen when it picked: a router's float32 probabilities of
    bfloat16 logits carry bfloat16's error, and two backends that round the logits apart pick apart where the
    probabilities are that close. A value beyond its tolerance is then judged by `excuse`: an index output by the
    values its indices pick, a value that depends on a pick among tied values not compared (`tied`), and so an
    index output whose values picked from depend on such a pick; its gradients neither once the forward was seen
    to pick otherwise (`differed`).

    Example (a tie: eager picks index 0 of two equal values, another backend index 1):
        >>> with Picks() as picks:
        ...     values, indices = torch.topk(torch.tensor([[1.0, 1.0, 0.0]]), 1)
        >>> picks.excuse(torch.tensor([[1]]), indices)
        'its indices pick other of tied values (topk) at 1 of 1 positions; the values they pick match'
    """

    def __init__(self):
        super().__init__()
        # (index tensor, values it picks from, dim, whether the dim was reduced away, op, the dtype whose tolerance
        # holds for the values, whether they depend on an earlier pick)
        self.index_outputs = []
        self.choices = []  # (op, values, dim, k or None: top-k, 0: an extreme, -1: a sort, stable, the dtype)
        self._coarsest = None  # the floating dtype of the largest epsilon among the tensors seen so far
        self.differed = []  # what `excuse` excused: the forward picked otherwise than eager
        self._dependent = weakref.WeakValueDictionary()  # id -> tensor computed from a pick

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        for x in tensors:  # finfo only for a dtype not seen last (an op's tensors mostly share one)
            if x.dtype is not self._coarsest and x.is_floating_point() and (
                    self._coarsest is None or torch.finfo(x.dtype).eps > torch.finfo(self._coarsest).eps):
                self._coarsest = x.dtype
        if any(self.depends(x) for x in tensors):
            written = tree_leaves(args[0]) if name in _WRITES_FIRST_ARGUMENT or name.startswith("__i") else []
            for out in [*tree_leaves(result), *written]:
                if isinstance(out, torch.Tensor):
                    self._dependent[id(out)] = out
        if name in PICKING_OPS and tensors and isinstance(args[0], torch.Tensor):
            self._note(name, args, kwargs, result)
        return result

    def depends(self, value) -> bool:
        return isinstance(value, torch.Tensor) and self._dependent.get(id(value)) is value

    def _note(self, name, args, kwargs, result):
        source = args[0].detach()
        bound = dict(zip(("k", "dim") if name == "topk" else ("dim",), args[1:]), **kwargs)
        dim = bound.get("dim", -1 if name in ("topk", "sort", "argsort") else None)
        if name in ("max", "min") and not isinstance(dim, int):
            return  # the overall extreme, or the elementwise one of two tensors: values, no index
        if dim is None:  # argmax/argmin over all elements: an index into the flattened tensor
            source, dim = source.reshape(-1), 0
        if not isinstance(dim, int) or (name == "topk" and not isinstance(bound.get("k"), int)):
            return
        dim = dim % max(source.dim(), 1)
        indices = result[1] if isinstance(result, tuple) else result
        if not isinstance(indices, torch.Tensor):
            return
        reduced = name in ("argmax", "argmin", "max", "min") and not bound.get("keepdim", False)
        precision = source.dtype
        if source.is_floating_point() and torch.finfo(self._coarsest or precision).eps > torch.finfo(precision).eps:
            precision = self._coarsest
        self.index_outputs.append((indices, source, dim, reduced and indices.dim() < source.dim(), name, precision,
                                   self.depends(args[0])))
        self._dependent[id(indices)] = indices
        order = bound.get("k") if name == "topk" else (-1 if name in ("sort", "argsort") else 0)
        self.choices.append((name, source, dim, int(order), bool(bound.get("stable", False)), precision))

    def tied(self) -> list[str]:
        """The ops that had a choice among values within their tolerance of each other (see the class)."""
        found = []
        for name, source, dim, order, stable, precision in self.choices:
            if stable or source.numel() == 0 or source.size(dim) < 2:
                continue
            values = source.double() if not source.is_complex() else source.abs().double()
            rtol, atol = tolerance(precision)
            scale = float(values.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
            close = allowed_error(rtol, atol, scale)
            if order == 0:  # an extreme: tied where another element is as extreme
                largest = name in ("argmax", "max")
                extreme = values.amax(dim, keepdim=True) if largest else values.amin(dim, keepdim=True)
                tied = bool(((values - extreme).abs() <= close).sum(dim).gt(1).any())
            else:
                ordered = values.sort(dim, descending=True).values
                if order > 0:
                    ordered = ordered.narrow(dim, 0, min(order + 1, ordered.size(dim)))
                gaps = ordered.narrow(dim, 1, ordered.size(dim) - 1) - ordered.narrow(dim, 0, ordered.size(dim) - 1)
                tied = bool((gaps.abs() <= close).any())
            if tied:
                found.append(name)
        return list(dict.fromkeys(found))

    def _picked(self, indices, source, dim, reduced):
        indices = indices.to(source.device).long()
        if reduced:
            indices = indices.unsqueeze(dim)
        return source.gather(dim, indices)

    def excuses(self, actual, expected, beyond):
        """Position -> why `actual[i]`, beyond its tolerance against eager's `expected[i]` (values of eager's run
        under this mode) for each i in `beyond`, is no mismatch; positions absent are mismatches. An index output
        whose indices pick values that match those eager's pick is none; a value computed from a pick is not
        compared where some pick had tied values, unless an index output picked other values (then the picks
        differ beyond the ties, and what they feed mismatches with them)."""
        found, wrong = {}, False
        for i in sorted(beyond, key=lambda i: self._index_output(expected[i]) is None):  # index outputs first
            if self._index_output(expected[i]) is not None:
                excuse = self.excuse(actual[i], expected[i])
                wrong |= excuse is None
            else:
                excuse = None if wrong else self.excuse(actual[i], expected[i])
            if excuse:
                found[i] = excuse
        return found

    def _index_output(self, expected):
        if not isinstance(expected, torch.Tensor):
            return None
        for entry in self.index_outputs:
            indices = entry[0]
            if expected is indices or (expected.numel() == indices.numel() and expected.is_contiguous()
                                       and indices.is_contiguous() and expected.data_ptr() == indices.data_ptr()):
                return entry
        return None

    def excuse(self, actual, expected):
        """Why `actual`, beyond its tolerance against eager's `expected` (a value of eager's run under this mode),
        is no mismatch, or None where it is one: an index output whose indices pick values that match those eager's
        pick; a value computed from a pick, where some pick had tied values (see `excuses` for both at once)."""
        if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
            return None
        found = self._index_output(expected)
        if found is not None:
            indices, source, dim, reduced, name, precision, source_depends = found
            if actual.numel() != indices.numel() or actual.is_floating_point() or actual.is_complex():
                return None
            theirs = actual.reshape(indices.shape)
            if bool(((theirs < 0) | (theirs >= source.size(dim))).any()):
                return None
            ours, picked = self._picked(indices, source, dim, reduced), self._picked(theirs, source, dim, reduced)
            rtol, atol = tolerance(precision)
            difference = float((picked.double() - ours.double()).abs().max()) if ours.numel() else 0.0
            scale = float(ours.double().abs().max()) if ours.numel() else 0.0
            if difference > allowed_error(rtol, atol, scale):
                # The values it picks from came out of an earlier pick among ties: another backend picked others
                # there, so it sorts (or ranks) other values, and its indices say nothing of this op.
                tied = self.tied() if source_depends else []
                if not tied:
                    return None
                excuse = ("not compared: it picks from values that depend on which of tied values "
                          f"{', '.join(tied)} picked")
                self.differed.append(excuse)
                return excuse
            moved = int((theirs.to(indices.device) != indices).sum())
            excuse = (f"its indices pick other of tied values ({name}) at {moved} of {indices.numel()} positions; "
                      "the values they pick match")
            self.differed.append(excuse)
            return excuse
        tied = self.tied() if self.depends(expected) else []
        if tied:
            excuse = f"not compared: it depends on which of tied values {', '.join(tied)} picked"
            self.differed.append(excuse)
            return excuse
        return None

    def excuse_gradient(self):
        """Why a gradient beyond its tolerance is not compared (None where it is a mismatch): the forward was seen
        to pick among tied values otherwise than eager, and a gradient follows the picks."""
        if not self.differed:
            return None
        return "not compared: the forward picked otherwise than eager among tied values, and gradients follow the picks"
