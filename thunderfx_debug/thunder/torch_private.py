"""torch's private APIs the package calls, in one place: they change between torch releases as Thunder's internals
do, so a torch upgrade that breaks one is fixed here (tests/test_structure.py keeps them here). Checked against torch
2.11-2.13. Importing this module imports neither torch nor thunder; each function imports what it calls.

- `inductor_compile`: `torch._inductor.compile`, as ThunderFX compiles its inductor splits (the fallback of a graph
  that failed under Thunder, the flush-time triage's counterparts);
- `warm_inductor_compile_workers`: inductor's pool of compile workers started ahead of the first compile;
- `c10d_function`: a function of the c10d bindings (`torch._C._distributed_c10d`), the flight recorder's dumps;
- `allocating_to`: every allocation of the current stream routed to a memory pool, from any thread;
- `queue_at_end_of_backward`: a callback autograd's engine runs when the current backward ends;
- `fresh_compile_state`: one intra-op thread, Dynamo's caches dropped and inductor compiling in its own thread (a
  forked child);
- `custom_op_module`: the Python module that defined a custom op (`torch.library.custom_op`), which a script must
  import for `torch.ops.<namespace>.<name>` to exist;
- `operator_key`, `operator_from_key`: an operator of `torch.ops` (an overload, a packet, a higher-order operator)
  by its names, for an FX graph sent to a child process (`triage.graph_codec`): overloads do not pickle;
- `saved_tensors_hooks_in_use`: the pack and unpack hooks of saved tensors in force now (a user's `save_on_cpu`),
  which the memory meter's own hooks pass every tensor on to (`recording.memory`);
- `allocator_counts`, `allocator_history_recording`, `record_allocator_history`, `allocator_history`: the CUDA
  caching allocator's cumulative counts of allocations and frees, and its history of them
  (`torch.cuda.memory._record_memory_history`, `_snapshot`), from which the memory meter reads a piece's peak
  without resetting the peak that `torch.cuda.max_memory_allocated` reports (`recording.memory`);
- `gradient_accumulator_type`: the class of a leaf's node in the autograd graph, whose `variable` is the leaf
  (`recording.backward_window.backward_nodes`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def inductor_compile(gm: Any, args: Sequence[Any]) -> Callable:
    """`torch._inductor.compile(gm, args)`: the FX module compiled by inductor for inputs like `args` (autograd
    included; its backward compiles at its first call)."""
    import torch._inductor

    return torch._inductor.compile(gm, list(args))


def warm_inductor_compile_workers() -> None:
    """Starts inductor's pool of compile workers (its kernels then build in parallel, and the pool's start-up
    overlaps the first graph's lowering)."""
    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.warm_pool()


def c10d_function(name: str) -> Callable | None:
    """The function `name` of torch's c10d bindings (`_dump_nccl_trace_json`, `_dump_fr_trace_json`), or None where
    this torch has none of that name."""
    from torch._C import _distributed_c10d as c10d

    return getattr(c10d, name, None)


@contextlib.contextmanager
def allocating_to(pool: Any, device: int) -> Iterator[None]:
    """Every allocation on the current stream, from any thread, goes to `pool` (a `torch.cuda.MemPool`), as CUDA
    graph capture routes a stream's allocations; where this torch lacks that, `torch.cuda.use_mem_pool` routes the
    entering thread's allocations only."""
    import torch

    route = getattr(torch._C, "_cuda_beginAllocateCurrentStreamToPool", None)
    if route is None:
        with torch.cuda.use_mem_pool(pool, device):
            yield
        return
    route(device, pool.id)
    try:
        yield
    finally:  # as torch.cuda.use_mem_pool ends its routing
        torch._C._cuda_endAllocateToPool(device, pool.id)
        torch._C._cuda_releasePool(device, pool.id)


def queue_at_end_of_backward(callback: Callable[[], None]) -> None:
    """`callback` runs when the backward that is running now ends (called from inside a backward hook)."""
    import torch

    torch.autograd.Variable._execution_engine.queue_callback(callback)


def fresh_compile_state() -> None:
    """In a fork of a process that compiled: one intra-op thread, Dynamo's caches dropped and inductor compiling in
    the calling thread (the parent's pool of compile workers is the parent's). One thread, because the parent's
    OpenMP team does not exist in the fork, and GNU OpenMP (torch's CPU builds) hangs at the child's first parallel
    region of more than one thread (a matmul, a large elementwise op). Does nothing where torch is not loaded, and
    leaves out what this torch lacks (the child then compiles as it would anyway); any other failure is raised, so
    that the child ends saying why (`children.forks`) rather than hanging on a state it could not reset."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    torch.set_num_threads(1)
    torch._dynamo.reset()
    try:
        from torch._inductor import config as inductor_config
    except ImportError:  # a torch without inductor
        return
    if hasattr(inductor_config, "compile_threads"):
        inductor_config.compile_threads = 1


def operator_key(obj: Any) -> tuple[str, str, str | None] | None:
    """(namespace, name, overload) of an operator of `torch.ops` ("higher_order" for a higher-order operator, overload
    None for a packet), None for anything else.

    Example:
        >>> import torch
        >>> operator_key(torch.ops.aten.add.Tensor), operator_key(torch.ops.aten.add), operator_key(len)
        (('aten', 'add', 'Tensor'), ('aten', 'add', None), None)
    """
    import torch._ops

    if isinstance(obj, torch._ops.OpOverload):
        return obj.namespace, obj.overloadpacket.__name__, obj._overloadname
    if isinstance(obj, torch._ops.OpOverloadPacket):
        namespace, _, name = obj._qualified_op_name.partition("::")
        return namespace, name, None
    if isinstance(obj, torch._ops.HigherOrderOperator):
        return "higher_order", obj.name(), None
    return None


def operator_from_key(namespace: str, name: str, overload: str | None) -> Any:
    """The operator `operator_key` named."""
    import torch

    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def custom_op_module(target: Any) -> tuple[str, str] | None:
    """(the op's name, the module of the function it was made from) for an FX node's target that is a custom op
    made with `torch.library.custom_op` (torch.ops.transformers.grouped_mm_fallback -> ("transformers::
    grouped_mm_fallback", "transformers.integrations.moe")), from torch's registry of such ops
    (`torch._library.custom_ops.OPDEFS`); None for any other target."""
    import torch
    from torch._library import custom_ops

    if isinstance(target, torch._ops.OpOverloadPacket):
        qualname = target._qualified_op_name
    elif isinstance(target, torch._ops.OpOverload):
        qualname = target.name().split(".")[0]
    else:
        return None
    definition = getattr(custom_ops, "OPDEFS", {}).get(qualname)
    module = getattr(getattr(definition, "_init_fn", None), "__module__", None)
    return (qualname, module) if isinstance(module, str) and module != "__main__" else None


def saved_tensors_hooks_in_use() -> tuple[Callable[[Any], Any], Callable[[Any], Any]] | None:
    """The (pack, unpack) hooks of saved tensors in force in this thread (the innermost
    `torch.autograd.graph.saved_tensors_hooks`), None where there are none."""
    import torch

    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    return tuple(hooks) if hooks else None


def gradient_accumulator_type() -> type:
    """The class of autograd's node that accumulates a leaf's gradient (`torch._C._functions.AccumulateGrad`); its
    `variable` is the leaf, so a walk of the graph knows a leaf's node without `get_gradient_edge`, which makes a view
    of the leaf to find it."""
    import torch

    return torch._C._functions.AccumulateGrad


def allocator_counts(device: int) -> tuple[int, int, int]:
    """(allocations so far, frees so far, bytes allocated now) of the CUDA caching allocator on `device`: host-side
    counters, read without waiting for the device. The counts only grow (`reset_peak_memory_stats` leaves them);
    the bytes are allocator blocks, as `torch.cuda.memory_allocated` counts them."""
    import torch

    stats = torch._C._cuda_memoryStats(device)
    allocation = stats["allocation"]["all"]
    return allocation["allocated"], allocation["freed"], stats["allocated_bytes"]["all"]["current"]


def allocator_history_recording() -> bool:
    """Whether the CUDA allocator records its history now (`torch.cuda.memory._record_memory_history` is on)."""
    import torch

    return bool(torch._C._cuda_isHistoryEnabled())


def record_allocator_history(on: bool, max_entries: int) -> None:
    """Starts (cleared, without stack traces, at most `max_entries` events kept) or stops the CUDA allocator's
    history of allocations and frees."""
    import torch

    if on:
        torch.cuda.memory._record_memory_history("all", context=None, stacks="python", max_entries=max_entries,
                                                 clear_history=True)
    else:
        torch.cuda.memory._record_memory_history(None)


def allocator_history(device: int) -> list[int]:
    """The CUDA allocator's recorded allocations and frees on `device`, oldest first, as signed byte counts (an
    allocation's requested bytes, a free's as negative), from `torch.cuda.memory._snapshot`; frees are counted when
    they are requested, as the allocator's own counters count them."""
    import torch

    traces = torch.cuda.memory._snapshot()["device_traces"]
    if device >= len(traces):
        return []
    signed = {"alloc": 1, "free_requested": -1}
    return [signed[e["action"]] * e["size"] for e in traces[device] if e["action"] in signed]
