"""What the generated repro scripts run: loading saved inputs, checking a compiled piece against eager (or against
the outputs the run produced), and timing it. Kept here, not pasted into every script, so that all scripts check
and time the same way and a fix reaches every dump.

A script calls `main(...)` with the piece's callables:

    python graph0_thunder_0_repro_thunder.py                     # check: exit 1 when beyond the tolerance
    python graph0_thunder_0_repro_thunder.py --benchmark         # check, then time forward (and backward)
    python graph0_thunder_0_repro_thunder.py --benchmark --json out.json
        # writes {"script", "piece", "executor", "forward_ms", "backward_ms"} (medians in milliseconds)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import storage_span

#: (rtol, atol) by dtype: a compiled piece reorders floating-point work, so results differ by rounding, more with
#: fewer mantissa bits. Integer and bool outputs must match exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.complex64: (1e-4, 1e-4),
    torch.complex128: (1e-7, 1e-7),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
_FLOAT8_TOLERANCE = (0.25, 0.25)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing outputs of `dtype`; (0, 0) for exact types."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    if dtype.is_floating_point:
        return _FLOAT8_TOLERANCE
    return (0.0, 0.0)


# ---- inputs -------------------------------------------------------------------------------------------------------


def _rebuild(saved: Any) -> Any:
    if isinstance(saved, dict) and "flat" in saved:
        flat = saved["flat"].to(saved["device"])
        tensor = flat.as_strided(saved["shape"], saved["stride"]).detach()
        return tensor.requires_grad_(saved["requires_grad"])
    return saved


def load_inputs(path: str | Path, script: str | Path) -> tuple[list[Any], list[Any] | None]:
    """The inputs (and outputs, where saved) of a piece's first call in the run, from the file the dump holds next
    to the script; tensors on the devices and with the strides the run had. Never executes code from the file."""
    full = Path(script).resolve().parent / path
    saved = torch.load(full, weights_only=True)
    if not isinstance(saved, dict) or saved.get("format") != 1:
        raise ValueError(f"{full} is not an inputs file of this thunderfx_debug version")
    outputs = saved.get("outputs")
    return [_rebuild(x) for x in saved["inputs"]], (None if outputs is None else [_rebuild(x) for x in outputs])


def executors(names: Sequence[str]) -> list[Any]:
    """The run's Thunder executors, by name (Thunder resolves them in this process)."""
    from thunderfx_debug.thunder.options import executor_by_name

    return [executor_by_name(name) for name in names]


def thunder_compiler(**options: Any):
    """`thunder.dynamo.ThunderCompiler(**options)`, with the workaround it needs on torch >= 2.12
    (lightning-thunder#2825; see `thunder.compile.plain_thunder_compiler`)."""
    from thunderfx_debug.thunder.compile import plain_thunder_compiler

    return plain_thunder_compiler(**options)


def torch_executor_fn(name: str) -> Callable:
    """A helper of Thunder's torch executor that a fusion region's torch function calls (see `thunder.scripts`)."""
    from thunderfx_debug.thunder.scripts import torch_executor_fn as lookup

    return lookup(name)


def fresh(inputs: Sequence[Any]) -> list[Any]:
    """Copies of `inputs` as new leaf tensors with the same strides, so each run starts from the same values and a
    piece that mutates its inputs cannot disturb the next run."""
    copies = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            flat = x.detach().as_strided((storage_span(x.shape, x.stride()),), (1,), x.storage_offset()).clone()
            copies.append(flat.as_strided(x.shape, x.stride()).detach().requires_grad_(x.requires_grad))
        else:
            copies.append(x)
    return copies


# ---- running and comparing ------------------------------------------------------------------------------------------


def flat_tensors(value: Any) -> list[Any]:
    """The leaves of a piece's output (tensors, and what else it returns) in order."""
    return tree_leaves(value)


def _differentiable(outputs: Sequence[Any]) -> list[torch.Tensor]:
    return [o for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None and o.dtype.is_floating_point]


def _grad_outputs(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)  # the same cotangents for every run of the piece
    return [torch.randn(o.shape, generator=generator, dtype=torch.float32).to(o.device, o.dtype) for o in outputs]


def run(fn: Callable, inputs: Sequence[Any], backward: bool) -> tuple[list[Any], list[Any] | None]:
    """Forward outputs (flattened) and, with `backward`, the gradients of the inputs that require one."""
    args = fresh(inputs)
    outputs = flat_tensors(fn(*args))
    if not backward:
        return outputs, None
    wanted = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
    differentiable = _differentiable(outputs)
    if not wanted or not differentiable:
        return outputs, None
    grads = torch.autograd.grad(differentiable, wanted, _grad_outputs(differentiable), allow_unused=True)
    return outputs, list(grads)


def _difference(actual: Any, expected: Any) -> tuple[float, float]:
    """(largest absolute difference, largest magnitude of `expected`); NaN matches NaN and an infinity itself."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        same = actual == expected or (actual is None and expected is None)
        return (0.0 if same else math.inf), 0.0
    if actual.shape != expected.shape:
        return math.inf, 0.0
    wide = torch.complex128 if actual.is_complex() or expected.is_complex() else torch.float64
    a, b = actual.detach().to("cpu", wide), expected.detach().to("cpu", wide)
    if a.numel() == 0:
        return 0.0, 0.0
    matching = (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b))
    difference = torch.where(matching, torch.zeros_like(a.real), (a - b).abs()).nan_to_num(nan=math.inf)
    return float(difference.max()), float(b.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())


def _judge(actual, expected, eager_value, fp64_value) -> tuple[float, float]:
    """(largest error between `actual` and `expected`, that error as a fraction of what is allowed: above 1 fails).

    Allowed: the dtype's tolerance relative to the largest magnitude of the value (a compiled piece reorders sums, so
    an element that cancels large terms legitimately differs by more than its own size), plus the rounding noise of
    eager itself, measured against a float64 run of eager where there is one (as torch._dynamo's accuracy checks do:
    an op like sinc's backward is inaccurate in float32 eager, and a compiled version may round differently). With the
    float64 run, a compiled result is judged by its own distance to it.
    """
    error, scale = _difference(actual, expected)
    dtype = getattr(expected, "dtype", None)
    rtol, atol = tolerance(dtype) if isinstance(dtype, torch.dtype) else (0.0, 0.0)
    if rtol == 0 and atol == 0:
        return error, (math.inf if error > 0 else 0.0)
    allowed = atol + rtol * scale
    if fp64_value is None or eager_value is None:
        return error, error / allowed
    noise, _ = _difference(eager_value, fp64_value)
    if expected is eager_value:  # judged against float64, with three times eager's own error as slack
        own, _ = _difference(actual, fp64_value)
        return error, own / (allowed + 3 * noise)
    return error, error / (allowed + 4 * noise)  # against the run's outputs: both sides carry rounding noise


def compare(what: str, actual: Sequence[Any], expected: Sequence[Any], eager=None, fp64=None) -> bool:
    """Prints the largest error between two lists of values; True when every one is within what is allowed (see
    `_judge`). `eager` and `fp64` are eager's values for the same inputs in the piece's dtypes and in float64."""
    if len(actual) != len(expected):
        print(f"  {what}: {len(actual)} values, expected {len(expected)}: MISMATCH")
        return False
    worst_error, worst_ratio, index = 0.0, 0.0, None
    for i, (a, e) in enumerate(zip(actual, expected)):
        eager_value = eager[i] if eager is not None and i < len(eager) else None
        fp64_value = fp64[i] if fp64 is not None and i < len(fp64) else None
        error, ratio = _judge(a, e, eager_value, fp64_value)
        worst_error = max(worst_error, error)
        if index is None or ratio > worst_ratio:
            worst_ratio, index = ratio, i
    if index is None:
        print(f"  {what}: nothing to compare")
        return True
    dtype = getattr(expected[index], "dtype", type(expected[index]).__name__)
    rtol, atol = tolerance(dtype) if isinstance(dtype, torch.dtype) else (0.0, 0.0)
    verdict = "OK" if worst_ratio <= 1.0 else "MISMATCH"
    print(
        f"  {what}: largest error {worst_error:.3g}; worst value {index} ({str(dtype).replace('torch.', '')}) at "
        f"{worst_ratio:.2g} of what is allowed (atol={atol:g} + rtol={rtol:g} * its largest magnitude, "
        f"+ eager's own float32 rounding error): {verdict}"
    )
    return worst_ratio <= 1.0


def _in_float64(inputs: Sequence[Any]) -> list[Any]:
    return [
        x.detach().double().requires_grad_(x.requires_grad)
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point
        else x
        for x in inputs
    ]


def _run_float64(eager: Callable, inputs: Sequence[Any], backward: bool):
    """Eager in float64, the yardstick for rounding; (None, None) where the piece cannot run in float64."""
    try:
        return run(eager, _in_float64(inputs), backward)
    except Exception as e:  # e.g. an op without a float64 kernel: judge with the dtype's tolerance alone
        print(f"  (no float64 reference: {type(e).__name__}: {str(e)[:200]})")
        return None, None


def check(
    fn: Callable,
    eager: Callable[[], Callable],
    make_inputs: Callable[[], list[Any]],
    expected_outputs: list[Any] | None,
    is_eager: bool,
    backward: bool,
) -> bool:
    """Runs the piece once and compares it: forward outputs with the run's (real inputs) or with eager; gradients
    with eager. An eager script with no saved outputs has nothing to compare with and checks that it runs."""
    inputs = make_inputs()
    outputs, grads = run(fn, inputs, backward)
    if is_eager and expected_outputs is None:
        print(f"  ran eagerly: {len(outputs)} outputs" + (f", {len(grads)} gradients" if grads else ""))
        return True
    # What the piece returned, copied to the host at once: the comparisons judge these, and the values left on the
    # device are checked against them after eager has run, which catches memory written after the piece returned.
    returned_outputs, returned_grads = _host_copies(outputs), _host_copies(grads)
    reference = eager()
    eager_outputs, eager_grads = (outputs, grads) if is_eager else run(reference, inputs, backward)
    fp64_outputs, fp64_grads = _run_float64(reference, inputs, backward)
    ok = True
    if expected_outputs is not None:
        ok &= compare("forward outputs vs the run's", returned_outputs, expected_outputs, eager_outputs, fp64_outputs)
    else:
        ok &= compare("forward outputs vs eager", returned_outputs, eager_outputs, eager_outputs, fp64_outputs)
    if not is_eager and (grads is not None or eager_grads is not None):
        ok &= compare("gradients vs eager", returned_grads or [], eager_grads or [], eager_grads, fp64_grads)
    ok &= unchanged_since_returned("forward outputs", outputs, returned_outputs)
    ok &= unchanged_since_returned("gradients", grads or [], returned_grads or [])
    return ok


def _host_copies(values: Sequence[Any] | None) -> list[Any] | None:
    if values is None:
        return None
    return [v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for v in values]


def _unchanged(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exactly the same values, a NaN equal to itself (torch.equal calls NaNs different), same shape and dtype."""
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def unchanged_since_returned(what: str, now: Sequence[Any], returned: Sequence[Any]) -> bool:
    """False, with a line saying which, when values the piece returned hold other values after eager has run: some
    later work wrote into their memory (a buffer the piece freed or reused too early, or an out-of-bounds write),
    which no comparison of the returned values can show. Seen on the H200 with an nvFuser build that overwrites
    memory it does not own (benchmarks/RESULTS.md)."""
    changed = [i for i, (a, b) in enumerate(zip(now, returned))
               if isinstance(a, torch.Tensor) and not _unchanged(a.detach().cpu(), b)]
    if changed:
        print(f"  {what}: values {changed} changed after the piece returned them, while eager ran: later work wrote "
              "into their memory (freed or reused too early, or written out of bounds): MISMATCH")
    return not changed


# ---- timing -------------------------------------------------------------------------------------------------------


DEVICE_CALLS = 20  # calls per device-time measurement: queued behind one hold, well inside CUDA's launch queue
DEVICE_ROUNDS = 5  # measurements; the median is reported


def device_ms(call: Callable[[], Any], host_ms: float) -> float:
    """Median device milliseconds per `call()` on CUDA: the GPU's own time for the call's kernels.

    A wall-clock time of a small region standalone is mostly its host cost (a torch.compile'd function's guards
    and wrappers take ~0.1 ms a call, more than many regions' kernels), which the region does not pay inside a
    whole compiled graph. So the calls are queued behind a sleep kernel as long as their host time (1.5x
    `host_ms` per call), as the backend's fusion timing does (`timing.DeviceHold`), and CUDA events around them
    time the kernels back to back."""
    from thunderfx_debug.recording.timing import CudaClock, DeviceHold

    clock, hold = CudaClock(), DeviceHold.for_current_cuda_device()
    per_call = []
    for _ in range(DEVICE_ROUNDS):
        torch.cuda.synchronize()
        hold.sleep_ms(min(max(1.5 * host_ms * DEVICE_CALLS, 1.0), 1000.0))
        start = clock.mark()
        for _ in range(DEVICE_CALLS):
            call()
        per_call.append(clock.elapsed_ms(start, clock.mark(), wait=True) / DEVICE_CALLS)
    return statistics.median(per_call)


@dataclasses.dataclass(frozen=True)
class BenchmarkFigures:
    """Median milliseconds per call: wall clock (host and device, as torch.utils.benchmark measures) and, on CUDA,
    device time (`device_ms`). Backward is None where the piece has none."""

    forward_ms: float
    backward_ms: float | None = None
    forward_device_ms: float | None = None
    backward_device_ms: float | None = None


def benchmark(fn: Callable, inputs: Sequence[Any], backward: bool, min_run_time: float) -> BenchmarkFigures:
    """Times the forward, and the backward where the piece has one.

    The backward is timed as (forward + backward) - forward: compiled backward functions (Thunder's, AOTAutograd's)
    may free what they saved after one use, so the backward alone cannot be run repeatedly on one forward."""
    from torch.utils.benchmark import Timer

    args = fresh(inputs)
    wanted = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
    on_cuda = torch.cuda.is_available() and any(isinstance(x, torch.Tensor) and x.is_cuda for x in flat_tensors(args))

    def forward():
        return fn(*args)

    def forward_backward():
        outputs = _differentiable(flat_tensors(fn(*args)))
        torch.autograd.grad(outputs, wanted, _grad_outputs(outputs), allow_unused=True)

    forward_ms = Timer("forward()", globals={"forward": forward}).blocked_autorange(min_run_time=min_run_time).median
    forward_ms *= 1e3
    forward_device = device_ms(forward, forward_ms) if on_cuda else None
    if not backward or not wanted or not _differentiable(flat_tensors(fn(*args))):
        return BenchmarkFigures(forward_ms, None, forward_device)
    both = Timer("step()", globals={"step": forward_backward}).blocked_autorange(min_run_time=min_run_time).median
    both *= 1e3
    both_device = device_ms(forward_backward, both) if on_cuda else None
    return BenchmarkFigures(forward_ms, max(both - forward_ms, 0.0), forward_device,
                   None if both_device is None else max(both_device - forward_device, 0.0))


# ---- entry point --------------------------------------------------------------------------------------------------


def main(
    *,
    script: str,
    piece: str,
    executor: str,
    build: Callable[[], Callable],
    eager: Callable[[], Callable],
    make_inputs: Callable[[], list[Any]],
    expected_outputs: list[Any] | None = None,
    backward: bool = True,
    argv: Sequence[str] | None = None,
) -> int:
    """Checks the piece, and with `--benchmark` times it; returns the exit status (1: beyond the tolerance)."""
    parser = argparse.ArgumentParser(description=f"Repro of {piece} run with {executor} (written by thunderfx_debug)")
    parser.add_argument("--benchmark", action="store_true", help="also time forward (and backward) after the check")
    parser.add_argument("--json", metavar="PATH", help="with --benchmark: write the figures to PATH as JSON")
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds of timing per figure (default 0.5)")
    options = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"{piece} [{executor}]  ({Path(script).name})")
    # One build for the check and the timing: building is compiling (a split's Thunder jit, torch.compile), most
    # of a script's run; the timing's inputs have the same metadata, so they hit what the check compiled.
    fn = build()
    ok = check(fn, eager, make_inputs, expected_outputs, executor == "eager", backward)
    if options.benchmark:
        torch.manual_seed(0)
        timings = benchmark(fn, make_inputs(), backward, options.min_run_time)
        print(f"  benchmark: {_describe(timings)}")
        if options.json:
            figures = {"script": Path(script).name, "piece": piece, "executor": executor,
                       **dataclasses.asdict(timings)}
            Path(options.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if ok else 1


def _describe(timings: BenchmarkFigures) -> str:
    def pair(wall: float | None, device: float | None) -> str:
        if wall is None:
            return "n/a"
        return f"{wall:.3f} ms" + (f" (device {device:.3f} ms)" if device is not None else "")

    clocks = "wall clock, device time in parentheses" if timings.forward_device_ms is not None else "wall clock"
    return f"forward {pair(timings.forward_ms, timings.forward_device_ms)}, " \
           f"backward {pair(timings.backward_ms, timings.backward_device_ms)} (medians, {clocks})"
