"""The split-level check: a Thunder split's outputs, and on its sampled backward its input gradients, against its
eager reference, the split's FX graph run by PyTorch on the same real inputs (see `check` for what keeps the
training untouched, `compare` for the rule).

Forward: after the split ran, the FX graph runs under `no_grad` on the detached inputs (on copies taken before the
split ran of the inputs the graph writes into), and each output is judged against eager's. Backward: the checked
call's outputs get hooks on the split's own autograd nodes (`sampler.backward_nodes`): before the split's backward
they note the incoming gradients, after it the gradients the split passes to each of its inputs (read off the
edges of its autograd nodes, so a tied weight gets this split's part only); then the FX graph runs forward and
backward on leaf copies of the inputs with the same incoming gradients, under the autocast settings of the forward,
and each input's gradient is judged against eager's. Other calls get no hook and pay one comparison.

Outputs and gradients that depend on random ops are not compared (`piece_facts`): the reason is recorded instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_leaves

from thunderfx_debug.recording.check import (AutocastState, CheckSchedule, CheckTally, EvidenceKeeper,
                                             kept_random_state, version)
from thunderfx_debug.recording.compare import Float64Mode, judge, to_float64
from thunderfx_debug.recording.piece_facts import SplitFacts, split_facts
from thunderfx_debug.recording.sampler import backward_nodes
from thunderfx_debug.safety import ReportingFailures


@dataclasses.dataclass
class _Call:
    """One checked call between `before` and `after`: copies of the inputs the split writes into, and the version
    counters of all inputs, from before the split ran."""

    call: int
    copies: dict[int, torch.Tensor]
    versions: list[int | None]


def _copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


class SplitCheck:
    """Checks one Thunder split on the calls `schedule` picks; results go to `tally`. `regions` (a
    `region_check.RegionCheck`, at `fusion` level) is armed for the forward and backward of the checked calls."""

    def __init__(self, label: str, module: torch.fx.GraphModule, input_names: list[str], schedule: CheckSchedule,
                 tally: CheckTally, failures: ReportingFailures, evidence: EvidenceKeeper, regions=None):
        self.label, self.module, self.input_names = label, module, input_names
        self.schedule, self.tally, self.failures, self.evidence = schedule, tally, failures, evidence
        self.regions = regions
        self.facts: SplitFacts = split_facts(module)
        self._backward: weakref.ref | None = None  # the pending backward check of the last checked call

    # ---- called by the split's runner -----------------------------------------------------------------------------
    def before(self, call: int, args: tuple) -> _Call | None:
        """Before the split runs on checked call `call`."""
        with self.failures.guard(f"preparing the check of {self.label}"):
            self._cancel_backward(call)
            copies = {i: _copy(args[i]) for i in self.facts.mutated_inputs
                      if i < len(args) and isinstance(args[i], torch.Tensor)}
            pending = _Call(call, copies, [version(a) for a in args])
            if self.regions is not None:
                self.regions.watch_inputs([(self._input(i), a) for i, a in enumerate(args)],
                                          set(self.facts.mutated_inputs))
                self.regions.forward_call = call
            return pending
        return None

    def after(self, pending: _Call, args: tuple, out: Any) -> None:
        """After the split returned `out`: the forward check, and the hooks of the backward check."""
        if self.regions is not None:
            self.regions.forward_call = 0
        with self.failures.guard(f"checking the forward of {self.label}"):
            inputs = self._reference_inputs(pending, args)
            if inputs is not None:
                self._check_forward(pending.call, inputs, out, args)
                self._arm_backward(pending.call, args, inputs, out)

    def abandon(self, pending: _Call) -> None:
        """The split raised: nothing to check."""
        if self.regions is not None:
            self.regions.forward_call = 0

    # ---- forward --------------------------------------------------------------------------------------------------
    def _reference_inputs(self, pending: _Call, args: tuple) -> list[Any] | None:
        """The inputs as the split received them: detached, copies where the split wrote into them; None (and the
        reason recorded) where the split wrote into an input that was not foreseen."""
        changed = [i for i, (a, v) in enumerate(zip(args, pending.versions))
                   if i not in pending.copies and v is not None and version(a) != v]
        if changed:
            names = ", ".join(self._input(i) for i in changed)
            self.tally.skip(pending.call, f"the split wrote into inputs its graph shows no write to ({names}): "
                                          "their values before the call are gone, nothing compared")
            return None
        return [pending.copies[i] if i in pending.copies else (a.detach() if isinstance(a, torch.Tensor) else a)
                for i, a in enumerate(args)]

    def _input(self, i: int) -> str:
        return f"input {i} ({self.input_names[i]})" if i < len(self.input_names) else f"input {i}"

    def _check_forward(self, call: int, inputs: list[Any], out: Any, args: tuple) -> None:
        outputs = tree_leaves(out)
        with kept_random_state(inputs), torch.no_grad():
            eager = tree_leaves(self.module(*inputs))
        if len(eager) != len(outputs):
            self.tally.add(call, judge([f"forward outputs: {len(outputs)} values where eager has {len(eager)}"],
                                       [len(outputs)], [len(eager)]))
            return
        random = set(self.facts.random_outputs)
        chosen = [i for i in range(len(outputs)) if i not in random]
        if random:
            self.tally.skip(call, f"forward outputs {sorted(random)} depend on random ops "
                                  f"({', '.join(self.facts.random_ops)}), which Thunder and eager draw differently")
        if not chosen:
            return

        def float64():
            with kept_random_state(inputs), torch.no_grad(), Float64Mode():
                wide = tree_leaves(self.module(*to_float64(inputs)))
            return [wide[i] for i in chosen]

        judged = judge([f"forward output {i}" for i in chosen], [outputs[i] for i in chosen],
                       [eager[i] for i in chosen], float64)
        mismatches = self.tally.add(call, judged)
        if mismatches:
            self.evidence.keep(self.tally, self.label, call, "forward", _as_received(inputs, args), outputs,
                               mismatches, values=chosen)

    # ---- backward -------------------------------------------------------------------------------------------------
    def _arm_backward(self, call: int, args: tuple, inputs: list[Any], out: Any) -> None:
        outputs = [t if isinstance(t, torch.Tensor) and t.grad_fn is not None else None for t in tree_leaves(out)]
        if not torch.is_grad_enabled() or not any(o is not None for o in outputs):
            return
        wanted = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        first, last = backward_nodes(args, [o for o in outputs if o is not None])
        if not first or not last or not wanted:
            return
        check = _BackwardCheck(self, call, args, inputs, outputs, wanted, first, last)
        self._backward = weakref.ref(check)  # the hooks hold it, as long as the autograd graph lives

    def _cancel_backward(self, call: int) -> None:
        pending = self._backward() if self._backward is not None else None
        self._backward = None
        if pending is not None and not pending.done:
            pending.cancel()
            self.tally.skip(pending.call, f"the backward of a checked call did not run before the next checked call "
                                          f"(call {pending.call}, then {call}): its gradients were not compared")


def _as_received(inputs: list[Any], args: tuple) -> list[Any]:
    """The reference inputs with the `requires_grad` of the split's own (a script reruns the backward from them)."""
    return [x.detach().requires_grad_(bool(a.requires_grad)) if isinstance(x, torch.Tensor) and
            isinstance(a, torch.Tensor) and (x.is_floating_point() or x.is_complex()) else x
            for x, a in zip(inputs, args)]


class _BackwardCheck:
    """The gradient check of one checked call, run by hooks on the split's autograd nodes (see the module
    docstring); the hooks are removed once it ran, or by `cancel()`."""

    def __init__(self, owner: SplitCheck, call: int, args: tuple, inputs: list[Any], outputs: list, wanted: list[int],
                 first: list, last: list):
        self.owner, self.call, self.inputs, self.wanted = owner, call, inputs, wanted
        self.done = False
        self.autocast = AutocastState.capture(inputs)
        self.versions = [version(a) for a in args]
        self.args = args
        # The hooks hold no autograd node (a node holding a hook that holds it would never be freed, should the
        # backward never run): the incoming gradients come from hooks on the output tensors, and each post-hook gets
        # the routes from its node's edges to the inputs (edge index -> input position), read off here.
        first_ids = {id(node) for node in first}
        # outputs the split computed (not an input passed through): their gradients flow through its backward
        self.own = [o is not None and id(o.grad_fn) in first_ids for o in outputs]
        self.incoming: list[torch.Tensor | None] = [None] * len(outputs)
        edges = {}
        for i in wanted:
            edge = get_gradient_edge(args[i])
            edges[(id(edge.node), edge.output_nr)] = i
        self.thunder_grads: dict[int, torch.Tensor] = {}
        self._last_left = len(last)
        self.handles = []
        try:
            for i, output in enumerate(outputs):
                if self.own[i]:
                    self.handles.append(output.register_hook(self._incoming(i)))
            for node in last:
                routes = [(j, edges[(id(next_node), nr)]) for j, (next_node, nr) in enumerate(node.next_functions)
                          if (id(next_node), nr) in edges]
                self.handles.append(node.register_hook(self._passed_on(routes)))
        except BaseException:
            self.cancel()
            raise

    def _incoming(self, i: int):
        def hook(grad):
            owner = self.owner
            with owner.failures.guard(f"noting the incoming gradients of {owner.label}"):
                if owner.regions is not None:
                    owner.regions.backward_call = self.call  # before the split's backward trace runs
                self.incoming[i] = grad
            return None  # the gradient passes unchanged

        return hook

    def _passed_on(self, routes: list[tuple[int, int]]):
        def hook(grad_inputs, grad_outputs):
            owner = self.owner
            with owner.failures.guard(f"checking the backward of {owner.label}"):
                for j, position in routes:
                    if j >= len(grad_inputs) or grad_inputs[j] is None:
                        continue
                    before = self.thunder_grads.get(position)
                    self.thunder_grads[position] = grad_inputs[j] if before is None else before + grad_inputs[j]
                self._last_left -= 1
                if self._last_left == 0:
                    try:
                        self._check()
                    finally:
                        self.cancel()
            return None

        return hook

    def cancel(self) -> None:
        self.done = True
        for handle in self.handles:
            handle.remove()
        self.handles = []
        regions = self.owner.regions
        if regions is not None and regions.backward_call == self.call:
            regions.backward_call = 0

    def _check(self) -> None:
        owner, call = self.owner, self.call
        changed = [i for i, (a, v) in enumerate(zip(self.args, self.versions)) if v is not None and version(a) != v]
        if changed:
            names = ", ".join(owner._input(i) for i in changed)
            owner.tally.skip(call, f"inputs changed in place between the forward and the backward ({names}): "
                                   "gradients not compared")
            return
        random = set(owner.facts.random_gradients)
        chosen = [i for i in self.wanted if i not in random]
        if random & set(self.wanted):
            owner.tally.skip(call, f"the gradients of {len(random & set(self.wanted))} inputs depend on random ops "
                                   f"({', '.join(owner.facts.random_ops)}), which Thunder and eager draw differently")
        if not chosen:
            return
        eager = self._eager_gradients(self.inputs, self.incoming, chosen, wide=False)
        thunder = [self.thunder_grads.get(i) for i in chosen]
        thunder = [t if t is not None or e is None else torch.zeros_like(e) for t, e in zip(thunder, eager)]
        eager = [e if e is not None or t is None else torch.zeros_like(t) for t, e in zip(thunder, eager)]

        def float64():
            wide = self._eager_gradients(to_float64(self.inputs, requires_grad=True), self.incoming, chosen, wide=True)
            return [w if w is not None else (torch.zeros_like(e, dtype=torch.float64) if isinstance(e, torch.Tensor)
                                             else None) for w, e in zip(wide, eager)]

        judged = judge([f"gradient of {owner._input(i)}" for i in chosen], thunder, eager, float64)
        mismatches = owner.tally.add(call, judged)
        if mismatches:
            passed_on = [thunder[chosen.index(i)] if i in chosen else None for i in self.wanted]
            owner.evidence.keep(owner.tally, owner.label, call, "backward", _as_received(self.inputs, self.args),
                                passed_on, mismatches, values=[self.wanted.index(i) for i in chosen],
                                grad_outputs=self.incoming)

    def _eager_gradients(self, inputs: list[Any], incoming: list, chosen: list[int], wide: bool) -> list:
        wanted = set(self.wanted)
        leaves = [x.detach().requires_grad_(i in wanted) if isinstance(x, torch.Tensor) else x
                  for i, x in enumerate(inputs)]
        mode = Float64Mode() if wide else contextlib.nullcontext()
        with kept_random_state(inputs), torch.enable_grad(), self.autocast.restored(), mode:
            outputs = tree_leaves(self.owner.module(*leaves))
            own = self.own + [False] * len(outputs)
            pairs = [(o, g) for o, g, mine in zip(outputs, incoming + [None] * len(outputs), own)
                     if mine and isinstance(o, torch.Tensor) and o.requires_grad]
            if not pairs:
                return [None] * len(chosen)
            grads = [g if g is not None else torch.zeros_like(o) for o, g in pairs]
            if wide:
                grads = [g.detach().to(torch.float64) if g.is_floating_point() else g for g in grads]
            found = torch.autograd.grad([o for o, _ in pairs], [leaves[i] for i in chosen], grads, allow_unused=True)
        return list(found)

