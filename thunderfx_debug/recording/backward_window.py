"""The backward of one call of a piece (a graph or a split), seen through hooks on the piece's own autograd nodes: a
callback just before the first of them runs, and one once every node that passes gradients to the piece's inputs
has run. The sampler's marks (`sampler.BackwardMarks`), the memory meter's backward windows
(`memory.BackwardPeakWindow`) and the gradient check (`split_check.BackwardCheck`) are each a `BackwardWindow` with
callbacks of their own.

Which nodes (`backward_nodes`): those of the piece's outputs, which run first, and those with an edge into the
gradient node of an input, which run last. Hooks on the input tensors would end too late: an input's gradient is
complete only when every consumer of it ran its backward (a tied embedding weight waits for the other graph's).

A window's life: open (hooks in place), started, ended, closed (every hook removed). It closes once: right after
its end, or with `on_backward_end` after the whole backward that reached it; or earlier by `close()`, which a client
calls where the backward never came (at the piece's next call). A window nobody closes lives as long as the call's
autograd graph, whose hooks are all that hold it, and dies with it.

Autograd runs each device's nodes on a thread of its own, so the start and the count of ends left are taken under
a lock. The hooks do no work on the device and return None: the gradients pass unchanged. The callbacks are the
clients' and guard their own work (a reporting failure is logged, raised only where strict); whatever a callback
raises, the window still closes where it would have.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunderfx_debug.thunder import torch_private

Callback = Callable[[], None]


class BackwardWindow:
    """Hooks on one call's piece of the autograd graph: `first` are the nodes of its outputs, `last` the nodes that
    feed its inputs (see `backward_nodes`; `around` finds both).

    Callbacks, each run at most once except `on_last_node`:
        on_start(): just before the first of `first` runs (its pre-hook).
        on_last_node(index, grad_inputs): after each node of `last` ran, with its position in `last` and the
            gradients it passes on.
        on_end(): once every node of `last` ran.
        on_backward_end(): at the end of the backward that started the window (autograd's final callback), for a
            client whose own hooks (`remove_on_close`) must see that backward past the piece's end; the window then
            stays open until it, and is closed right after.
        on_close(): when the window closes, however it does (after its end, or by `close()` before it).

    The window holds no node (a node holding a hook that holds it would never be freed); the lists are read here
    and dropped."""

    def __init__(self, first: Sequence[Any], last: Sequence[Any], *, on_start: Callback | None = None,
                 on_last_node: Callable[[int, tuple], None] | None = None, on_end: Callback | None = None,
                 on_backward_end: Callback | None = None, on_close: Callback | None = None):
        self._on_start, self._on_last_node, self._on_end = on_start, on_last_node, on_end
        self._on_backward_end, self._on_close = on_backward_end, on_close
        self.started = self.ended = self.closed = False
        self.ends_left = len(last)
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        try:
            for node in first:
                self._handles.append(node.register_prehook(self._start))
            for index, node in enumerate(last):
                self._handles.append(node.register_hook(functools.partial(self._node_done, index)))
        except BaseException:
            self._remove_hooks()  # no half-registered hooks left on the user's autograd graph
            raise

    @classmethod
    def around(cls, inputs: Sequence[Any], outputs: Sequence[torch.Tensor],
               **callbacks: Any) -> BackwardWindow | None:
        """The window of the call that took `inputs` and returned `outputs`; None where it has no backward to watch
        (no input takes a gradient, no output has a node of the piece's own, or the walk found no end)."""
        first, last = backward_nodes(inputs, outputs)
        if not first or not last:
            return None
        return cls(first, last, **callbacks)

    def remove_on_close(self, handle: Any) -> None:
        """A client's own hook on this backward (the handle `register_hook` or `register_prehook` returned), removed
        with the window's; at once where the window is closed already."""
        if self.closed:
            handle.remove()
        else:
            self._handles.append(handle)

    def close(self) -> None:
        """Removes every hook and runs `on_close`; later calls do nothing."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._remove_hooks()
        on_close = self._on_close
        # The callbacks hold the client, which may hold this window: dropped so that no cycle outlives the window.
        self._on_start = self._on_last_node = self._on_end = self._on_backward_end = self._on_close = None
        if on_close is not None:
            on_close()

    # ---- hooks, in the backward ---------------------------------------------------------------------------------
    def _start(self, grad_outputs):
        with self._lock:
            if self.started or self.closed:
                return None
            self.started = True
        if self._on_backward_end is not None:
            torch_private.queue_at_end_of_backward(self._backward_ended)  # from inside a backward, where it is taken
        if self._on_start is not None:
            self._on_start()
        return None

    def _node_done(self, index: int, grad_inputs, grad_outputs):
        if self._on_last_node is not None:
            self._on_last_node(index, grad_inputs)
        with self._lock:
            if self.ended or self.closed:
                return None
            self.ends_left -= 1
            self.ended = self.ends_left == 0
            if not self.ended:
                return None
        try:
            if self._on_end is not None:
                self._on_end()
        finally:
            if self._on_backward_end is None:
                self.close()
        return None

    def _backward_ended(self) -> None:
        try:
            if self._on_backward_end is not None:
                self._on_backward_end()
        finally:
            self.close()

    def _remove_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


def backward_nodes(inputs: Sequence[Any], outputs: Sequence[torch.Tensor], limit: int = 10_000) -> tuple[list, list]:
    """The autograd nodes of a piece's backward: those of its outputs (run first), and those with an edge into the
    gradient node of an input (run last), found by walking from the outputs until the inputs. A walk that does not
    end within `limit` nodes (the inputs are not a cut of the graph) gives no nodes: no window for this call.

    An input that is a leaf (a parameter) is known in the walk by its gradient accumulator's `variable`, rather than
    by asking `get_gradient_edge` for its node, which makes a view of the leaf to find it: 6.8 µs a leaf against
    0.14 on the H200 (benchmarks/cuda_call_costs.py), and a graph or an MoE's split takes dozens of parameters."""
    input_nodes, leaves = {}, set()
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            if t.grad_fn is None:
                leaves.add(id(t))  # the inputs live through the call, so their ids stay theirs
            else:
                input_nodes[id(t.grad_fn)] = t.grad_fn  # kept alive, so the node's id stays its own
    first = {}
    for t in outputs:
        if t.grad_fn is not None and id(t.grad_fn) not in input_nodes:
            first.setdefault(id(t.grad_fn), t.grad_fn)  # an output that is an input passed through is not ours
    if not (input_nodes or leaves) or not first:
        return [], []
    accumulator = torch_private.gradient_accumulator_type()
    seen, last, stack = {}, [], list(first.values())
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        if len(seen) >= limit:
            return [], []
        seen[id(node)] = node
        feeds_an_input = False
        for next_node, _ in node.next_functions:
            if next_node is None:
                continue
            if id(next_node) in input_nodes or (type(next_node) is accumulator and id(next_node.variable) in leaves):
                feeds_an_input = True
            else:
                stack.append(next_node)
        if feeds_an_input:
            last.append(node)
    return list(first.values()), last
