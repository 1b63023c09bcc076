"""The split-level check: a Thunder split's outputs, and on the backward of a checked call its input gradients, against
its eager reference, the split's FX graph run by PyTorch on the same real inputs (see `check` for the tallies,
`isolation` for what keeps the training untouched, `compare` for the rule).

Forward: after the split ran, the FX graph runs under `no_grad` on the detached inputs (on copies taken before the
split ran of the inputs the graph writes into), and each output is judged against eager's.

Backward: every checked call whose outputs need a gradient gets a `BackwardCheck`, which lives with that call's
autograd graph (its hooks hold it) until its backward ran, so that a graph called several times per step (a per-layer
graph, FSDP blocks) has the backward of each checked call checked. Hooks on the split's own autograd nodes
(`backward_window`) note, before the split's backward, the gradients coming into its outputs, and after it
the gradients it passes to each of its inputs (read off the edges of its nodes, so that a tied weight gets this
split's part only); then the FX graph runs forward and backward on copies of the inputs with the same incoming
gradients, under the autocast settings of the forward, and each input's gradient is judged against eager's. An input
that was not a leaf in the run is fed as one that is not (a clone of the leaf whose gradient is judged), since the
graph may write into it in place, which autograd refuses on a leaf that requires grad.

A capture is proved before a gradient is called a mismatch: a pre-hook on each input's gradient node receives the
total gradient autograd delivers to that input in this backward. Where that total is what this split passed on (the
input is used by this split only), the capture is verified; where it is not, the input is used elsewhere too (a tied
weight, a residual stream), and this split's part of it cannot be told from the total. Only verified gradients can
be MISMATCH; an unverified one that matches eager counts as compared, one that does not is reported as not
compared, with the reason. The verdicts are settled once every input's gradient node ran, or at the end of the
backward (`queue_callback`) for inputs whose node never ran.

Where the split's backward never runs (an evaluation step under grad), the check dies with the autograd graph and
the record says that the backward of that call never ran.

Outputs and gradients that depend on random ops are compared where the reference draws them as the run did: the
split's dropouts, drawn as its trace says Thunder drew them (`thunder.draws.split_draws`: nvFuser's draws from the
generator's seed and offset before the call, the torch executor's or an executor's own from the generator's state
then), by `scripts.philox_draws.DrawnAsRun`. Elsewhere they are not compared, and the reason is recorded instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_leaves

from thunderfx_debug.recording.check import (AutocastState, CheckSchedule, CheckTally, EvidenceKeeper, guarded,
                                             version)
from thunderfx_debug.recording.compare import NOT_COMPARED_TIE, judge, max_abs_difference, not_compared_for_ties
from thunderfx_debug.recording.isolation import CheckIsolation, on_device, to_host
from thunderfx_debug.recording.turns import Turn
from thunderfx_debug.recording.piece_facts import SplitFacts, split_facts
from thunderfx_debug.recording.backward_window import BackwardWindow, backward_nodes
from thunderfx_debug.scripts.judging_rule import Float64Mode, Picks, to_float64
from thunderfx_debug.scripts.philox_draws import DrawnAsRun, thunder_seed_and_offset
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder.draws import split_draws
from thunderfx_debug.thunder.traces import final_traces


@dataclasses.dataclass
class _Call:
    """One checked call between `before` and `after`: host copies of the inputs the split writes into, and the
    version counters of all inputs, from before the split ran."""

    call: int
    copies: dict[int, torch.Tensor]
    versions: list[int | None]
    generators: GeneratorStates | None = None


@dataclasses.dataclass
class GeneratorStates:
    """The random generators' states before a checked call of a split that draws (host copies: no device work), so
    that its reference draws what the call drew (`Draws`)."""

    cpu: torch.Tensor | None
    cuda: dict[int, torch.Tensor]

    @classmethod
    def before(cls, args: tuple) -> GeneratorStates:
        devices = {a.device.index if a.device.index is not None else torch.cuda.current_device()
                   for a in args if isinstance(a, torch.Tensor) and a.is_cuda}
        on_cpu = any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
        return cls(torch.get_rng_state() if on_cpu or not devices else None,
                   {d: torch.cuda.get_rng_state(d) for d in sorted(devices)})

    def restore(self) -> None:
        if self.cpu is not None:
            torch.set_rng_state(self.cpu)
        for device, state in self.cuda.items():
            torch.cuda.set_rng_state(state, device)



@dataclasses.dataclass
class Draws:
    """How the reference of one checked call draws its dropouts as the call did: `how` (`philox_draws.DRAWS`), the
    generator states before the call, and the dtype of each draw and the mask of each "eager" dropout as the first
    reference run saw them."""

    how: str
    generators: GeneratorStates
    dtypes: list = dataclasses.field(default_factory=list)
    masks: list = dataclasses.field(default_factory=list)

    @contextlib.contextmanager
    def drawn(self):
        """Runs eager code with the call's draws (inside the check's isolation, which restores the training's random
        states afterwards)."""
        self.generators.restore()
        # the first CUDA device's generator, which Thunder's get_and_update_rng_state reads
        seed, offset = (thunder_seed_and_offset(next(iter(self.generators.cuda.values()))) if self.how == "nvfuser"
                        else (0, 0))
        with DrawnAsRun(self.how, seed, offset, self.dtypes, self.masks):
            yield


class SplitCheck:
    """Checks one Thunder split on the calls `schedule` picks; results go to `tally`. `regions` (a
    `region_check.RegionCheck`, at `fusion` level) is armed for the forward and backward of the checked calls.
    `isolation` is where the check's work runs (its own memory pool and stream on CUDA); `turn` says which of the
    scheduled calls the split checks (`turns.Turns`; None: all of them) and takes what its work costs; `compiled`
    is the split's Thunder function, whose trace says how it drew its random numbers."""

    def __init__(self, label: str, module: torch.fx.GraphModule, input_names: list[str], schedule: CheckSchedule,
                 tally: CheckTally, failures: ReportingFailures, evidence: EvidenceKeeper, regions=None,
                 isolation: CheckIsolation | None = None, turn: Turn | None = None, compiled=None):
        self.label, self.module, self.input_names = label, module, input_names
        self.schedule, self.tally, self.failures, self.evidence = schedule, tally, failures, evidence
        self.regions = regions
        self.isolation = isolation if isolation is not None else CheckIsolation()
        self.turn = turn
        self.facts: SplitFacts = split_facts(module)
        self.compiled = compiled
        self._draws_of: tuple[Any, tuple[str | None, str]] | None = None  # (forward trace, `split_draws` of it)
        # checked calls whose forward picked among tied values otherwise than eager (their gradients follow the picks)
        self.picked_otherwise: set[int] = set()

    def guarded(self, call: int, what: str):
        return guarded(self.failures, self.tally, call, what, self.label)

    # ---- called by the split's runner -----------------------------------------------------------------------------
    def before(self, call: int, args: tuple) -> _Call | None:
        """Before the split runs on checked call `call`; None where the split passes this call over (its turn has
        not come) or preparing failed."""
        if self.turn is not None and not self.turn.take(call):
            return None
        with self.guarded(call, "preparing the check"):
            with self.isolation.entered(args, self.turn):
                copies = {i: to_host(args[i]) for i in self.facts.mutated_inputs
                          if i < len(args) and isinstance(args[i], torch.Tensor)}
            pending = _Call(call, copies, [version(a) for a in args],
                            GeneratorStates.before(args) if self.facts.draws_in_dropouts_only else None)
            if self.regions is not None:
                self.regions.watch_inputs([(self.describe_input(i), a) for i, a in enumerate(args)],
                                          set(self.facts.mutated_inputs))
                self.regions.forward_call = call
            return pending
        return None

    def after(self, pending: _Call, args: tuple, out: Any) -> None:
        """After the split returned `out`: the forward check, and the hooks of the backward check."""
        if self.regions is not None:
            self.regions.forward_call = 0
        with self.guarded(pending.call, "checking the forward"):
            with self.isolation.entered([*args, *tree_leaves(out)], self.turn):
                inputs = self._reference_inputs(pending, args)
                if inputs is not None:
                    draws = self._draws(pending)
                    self._check_forward(pending.call, inputs, out, args, draws)
                    self._arm_backward(pending.call, args, inputs, out, draws)

    def abandon(self, pending: _Call) -> None:
        """The split raised: nothing to check."""
        if self.regions is not None:
            self.regions.forward_call = 0

    # ---- random numbers -------------------------------------------------------------------------------------------
    def _draws(self, pending: _Call) -> Draws | str | None:
        """How this call's reference draws its random numbers (`Draws`), why it cannot (str), or None where the split
        draws none."""
        if not self.facts.random_ops:
            return None
        if pending.generators is None:
            return f"it draws with {', '.join(self.facts.random_ops)}, which no reference here draws again"
        forward, _ = final_traces(self.compiled) if self.compiled is not None else (None, None)
        if self._draws_of is None or self._draws_of[0] is not forward:
            self._draws_of = (forward, split_draws(forward, self.facts.dropouts))
        how, why = self._draws_of[1]
        if how == "nvfuser" and not pending.generators.cuda:
            return "nvFuser drew them from a CUDA generator, and no input of the call lives on a CUDA device"
        return Draws(how, pending.generators) if how is not None else why

    @staticmethod
    def drawn(draws: Draws | str | None):
        return draws.drawn() if isinstance(draws, Draws) else contextlib.nullcontext()

    # ---- forward --------------------------------------------------------------------------------------------------
    def _reference_inputs(self, pending: _Call, args: tuple) -> list[Any] | None:
        """The inputs as the split received them: detached, copies where the split wrote into them; None (and the
        reason recorded) where the split wrote into an input that was not foreseen."""
        changed = [i for i, (a, v) in enumerate(zip(args, pending.versions))
                   if i not in pending.copies and v is not None and version(a) != v]
        if changed:
            names = ", ".join(self.describe_input(i) for i in changed)
            self.tally.skip(pending.call, f"the split wrote into inputs its graph shows no write to ({names}): "
                                          "their values before the call are gone, nothing compared")
            return None
        return [on_device(pending.copies[i], a.device) if i in pending.copies else
                (a.detach() if isinstance(a, torch.Tensor) else a) for i, a in enumerate(args)]

    def describe_input(self, i: int) -> str:
        """Input `i` as the records name it: "input 2 (l_x_)", its name in the split's graph where it has one."""
        return f"input {i} ({self.input_names[i]})" if i < len(self.input_names) else f"input {i}"

    def _check_forward(self, call: int, inputs: list[Any], out: Any, args: tuple, draws: Draws | str | None) -> None:
        outputs = tree_leaves(out)
        picks = Picks()  # what eager's topk, sort, argmax picked, for indices that pick among ties
        with torch.no_grad(), picks, self.drawn(draws):
            eager = tree_leaves(self.module(*inputs))
        if len(eager) != len(outputs):
            self.tally.add(call, judge([f"forward outputs: {len(outputs)} values where eager has {len(eager)}"],
                                       [len(outputs)], [len(eager)]))
            return
        random = set(self.facts.random_outputs) if not isinstance(draws, Draws) else set()
        chosen = [i for i in range(len(outputs)) if i not in random]
        if random:
            self.tally.skip(call, f"forward outputs {sorted(random)} depend on random ops "
                                  f"({', '.join(self.facts.random_ops)}) that the reference cannot draw as the run "
                                  f"did: {draws}")
        if not chosen:
            return

        def float64():
            with torch.no_grad(), Float64Mode(), self.drawn(draws):
                wide = tree_leaves(self.module(*to_float64(inputs)))
            return [wide[i] for i in chosen]

        judged = judge([f"forward output {i}" for i in chosen], [outputs[i] for i in chosen],
                       [eager[i] for i in chosen], float64, picks)
        if picks.differed:
            self.picked_otherwise.add(call)
        judged, not_compared = not_compared_for_ties(judged)
        if not_compared:
            self.tally.skip(call, not_compared)
        mismatches = self.tally.add(call, judged)
        if mismatches:
            self.evidence.keep(self.tally, self.label, call, "forward", _as_received(inputs, _requires_grad(args)),
                               outputs, mismatches, values=chosen)

    # ---- backward -------------------------------------------------------------------------------------------------
    def _arm_backward(self, call: int, args: tuple, inputs: list[Any], out: Any, draws: Draws | str | None) -> None:
        outputs = [t if isinstance(t, torch.Tensor) and t.grad_fn is not None else None for t in tree_leaves(out)]
        if not torch.is_grad_enabled() or not any(o is not None for o in outputs):
            return
        wanted = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        first, last = backward_nodes(args, [o for o in outputs if o is not None])
        if not first or not last or not wanted:
            return
        check = BackwardCheck(self, call, args, inputs, outputs, wanted, first, last)
        check.draws = draws
        # Held by its hooks only, so it lives as long as the call's autograd graph; should that die before its
        # backward ran, the record says so.
        finalizer = weakref.finalize(check, _never_ran, self.tally, call, check.state)
        finalizer.atexit = False


def _never_ran(tally: CheckTally, call: int, state: dict) -> None:
    if not state["started"]:
        tally.skip(call, f"the backward of checked call {call} never ran (an evaluation step under grad, or a "
                         "backward that did not reach this split): its gradients were not compared")


def _requires_grad(args) -> list[bool]:
    return [isinstance(a, torch.Tensor) and bool(a.requires_grad) for a in args]


def _as_received(inputs: list[Any], requires_grad: list[bool]) -> list[Any]:
    """The reference inputs with the `requires_grad` the split's own had (a script reruns the backward from them)."""
    return [x.detach().requires_grad_(wanted) if isinstance(x, torch.Tensor) and (x.is_floating_point() or
                                                                                  x.is_complex()) else x
            for x, wanted in zip(inputs, requires_grad)]


def _kept(x: Any, arg: Any) -> Any:
    """What the backward check keeps of a reference input until the split's backward: a parameter as it is (the
    model keeps it alive anyway; copied once the split's backward ran), any other tensor as a host copy, so that the
    run's own tensors are freed when the run frees them and the check holds no device memory meanwhile."""
    if not isinstance(x, torch.Tensor) or isinstance(arg, torch.nn.Parameter):
        return x
    return to_host(x)


def _total(grads: list[torch.Tensor], before: torch.Tensor | None) -> torch.Tensor:
    """The sum of the gradients passed to one input along its edges (after `before`, a host copy of an earlier part),
    summed where they are and kept as a host copy."""
    total = on_device(before, grads[0].device) if before is not None else grads[0].detach().clone()
    for g in grads if before is not None else grads[1:]:
        total += g
    return to_host(total)


def _agreement(delivered: torch.Tensor | None, captured: torch.Tensor | None) -> bool:
    """Whether autograd's total for an input is exactly what the split passed on to it (`captured`, a host copy)."""
    if delivered is None or captured is None:
        return delivered is None and captured is None
    if delivered.shape != captured.shape or delivered.dtype != captured.dtype:
        return False
    return float(max_abs_difference(delivered, on_device(captured, delivered.device))) == 0.0


class BackwardCheck:
    """The gradient check of one checked call (see the module docstring). Its hooks copy what they see (in the
    check's isolation, so that the run's tensors are freed when the run frees them); the comparison runs in a
    callback at the end of the backward, when every node has run: an eager backward started from inside a node's
    hook would be reentrant, and the thread waiting for it would run other nodes of the training's backward inside
    the check's memory pool and stream. Once settled, the hooks are removed and the copies dropped.

    Nodes are matched by the identity of their Python objects while all of them are held: before torch 2.12 a C++
    node's Python wrapper lives only as long as something references it (pytorch/pytorch#181390 made the node own
    it), so the `id()` of a wrapper that was dropped can be that of another node's wrapper made later: keyed by such
    ids, gradients went missing or to the wrong input."""

    draws: Draws | str | None = None  # how the reference draws the call's random numbers (`SplitCheck._draws`)

    def __init__(self, owner: SplitCheck, call: int, args: tuple, inputs: list[Any], outputs: list, wanted: list[int],
                 first: list, last: list):
        self.owner, self.call, self.wanted = owner, call, wanted
        self.inputs = [_kept(x, a) for x, a in zip(inputs, args)]
        # where each input and each output's incoming gradient lived in the run (their copies here are on the host)
        self.devices = [a.device if isinstance(a, torch.Tensor) else None for a in args]
        self.output_devices = [o.device if o is not None else None for o in outputs]
        self.parameters = [i for i, (x, a) in enumerate(zip(inputs, args))
                           if isinstance(x, torch.Tensor) and isinstance(a, torch.nn.Parameter)]
        self.requires_grad = _requires_grad(args)
        # inputs that were not leaves in the run (an earlier split's output): the graph may write into them in
        # place (`masked_fill_`), which autograd refuses on a leaf that requires grad
        self.non_leaf = [isinstance(a, torch.Tensor) and a.grad_fn is not None for a in args]
        self.state = {"started": False}  # read by the finalizer of a check whose backward never ran
        self.autocast = AutocastState.capture(inputs)
        self.versions = [version(a) for a in args]
        self.args = [weakref.ref(a) if isinstance(a, torch.Tensor) else None for a in args]
        self.changed: list[int] = []  # inputs written in place between the forward and the split's backward
        first_ids = {id(node) for node in first}  # `first` holds these nodes, so their ids are theirs meanwhile
        # outputs the split computed (not an input passed through): their gradients flow through its backward
        self.own = [o is not None and id(o.grad_fn) in first_ids for o in outputs]
        self.incoming: list[torch.Tensor | None] = [None] * len(outputs)
        self.passed_on: dict[int, torch.Tensor] = {}  # input position -> what the split passed to it (a host copy)
        self.delivered: dict[int, bool] = {}  # input position -> whether autograd's total is exactly that
        self.split_done = False  # every node of the split that feeds an input ran in this backward
        self.broken = False  # a hook did not finish its part (see `_part`)
        edges = [get_gradient_edge(args[i]) for i in wanted]  # held while the routes are read (see the class doc)
        position_of = {(id(edge.node), edge.output_nr): i for edge, i in zip(edges, wanted)}
        # for each node of `last`: (the edge's index, the input's position) of its edges into a wanted input
        self.routes = [[(j, position_of[(id(next_node), nr)]) for j, (next_node, nr) in enumerate(node.next_functions)
                        if (id(next_node), nr) in position_of] for node in last]
        input_nodes: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        for edge, i in zip(edges, wanted):
            input_nodes.setdefault(id(edge.node), (edge.node, []))[1].append((i, edge.output_nr))
        # Open until the end of the whole backward: the inputs' gradient nodes run after the split's own.
        window = BackwardWindow(first, last, on_start=self._started, on_last_node=self._passed_on,
                                on_end=self._split_backward_done, on_backward_end=self._at_end_of_backward,
                                on_close=self._disarm_regions)
        try:
            for i, output in enumerate(outputs):
                if self.own[i]:
                    window.remove_on_close(output.register_hook(self._incoming(i)))
            # The hooks hold no node: a node holding a hook that holds it would never be freed.
            for node, positions in input_nodes.values():
                window.remove_on_close(node.register_prehook(self._delivered_to(positions)))
        except BaseException:
            window.close()
            raise

    # ---- hooks, in the backward -----------------------------------------------------------------------------------
    def _started(self) -> None:
        """The backward reached this split (the window's start): the comparison runs at the end of the backward."""
        owner = self.owner
        with self._part("noting the incoming gradients"):
            self.state["started"] = True
            if owner.regions is not None:
                owner.regions.backward_call = self.call  # before the split's backward trace runs

    def _incoming(self, i: int):
        def hook(grad):
            owner = self.owner
            with self._part("noting the incoming gradients"):
                if grad is not None:  # torch < 2.12 also calls a tensor's hook for a gradient that is not there
                    with owner.isolation.entered([grad], owner.turn):
                        self.incoming[i] = to_host(grad)
            return None  # the gradient passes unchanged

        return hook

    def _passed_on(self, node: int, grad_inputs: tuple) -> None:
        """Node `node` of the split's last ones ran: the gradients it passed to the inputs (summed per input)."""
        owner = self.owner
        with self._part("noting the gradients passed on"):
            routed: dict[int, list[torch.Tensor]] = {}
            for j, position in self.routes[node]:
                if j < len(grad_inputs) and grad_inputs[j] is not None:
                    routed.setdefault(position, []).append(grad_inputs[j])
            with owner.isolation.entered([*grad_inputs, *self.inputs], owner.turn):
                for position, grads in routed.items():
                    before = self.passed_on.get(position)
                    self.passed_on[position] = _total(grads, before)

    def _delivered_to(self, positions: list[tuple[int, int]]):
        def hook(grad_outputs):
            owner = self.owner
            with self._part("verifying the captured gradients"):
                with owner.isolation.entered(list(grad_outputs), owner.turn):
                    for i, output_nr in positions:
                        grad = grad_outputs[output_nr] if output_nr < len(grad_outputs) else None
                        self.delivered[i] = _agreement(grad, self.captured(i))
            return None

        return hook

    @contextlib.contextmanager
    def _part(self, what: str):
        """A hook's work, guarded (`check.guarded`: its failure, or the device's want of memory, is noted on the
        tally once); a hook that did not finish leaves the capture incomplete, and nothing of it is compared."""
        done = False
        with self.owner.guarded(self.call, what):
            yield
            done = True
        self.broken = self.broken or not done

    def _split_backward_done(self) -> None:
        """The split's backward ran: the inputs are read now, while they are still what the forward had (FSDP2
        frees its unsharded parameters after their block's backward, before the end of the whole backward)."""
        self.split_done = True
        owner = self.owner
        with self._part("noting the gradients passed on"):
            with owner.isolation.entered(self.inputs, owner.turn):
                self.changed = [i for i, (ref, v) in enumerate(zip(self.args, self.versions))
                                if v is not None and ref is not None and ref() is not None and version(ref()) != v]
                for i in self.parameters:
                    self.inputs[i] = to_host(self.inputs[i])
                self.args = []

    def _at_end_of_backward(self) -> None:
        owner = self.owner
        try:
            with owner.guarded(self.call, "checking the backward"):
                if self.broken:
                    pass  # a hook did not finish: why is on the tally already
                elif not self.split_done:
                    owner.tally.skip(self.call, f"the backward of checked call {self.call} did not run all of the "
                                                "split's autograd nodes (a backward to some inputs only): its "
                                                "gradients were not compared")
                else:
                    with owner.isolation.entered(self.inputs, owner.turn, device=self._cuda_device()):
                        self.check()
        finally:
            self.inputs, self.incoming, self.passed_on, self.delivered = [], [], {}, {}

    def _disarm_regions(self) -> None:
        regions = self.owner.regions
        if regions is not None and regions.backward_call == self.call:
            regions.backward_call = 0

    def captured(self, i: int) -> torch.Tensor | None:
        """The gradient this split passed on to input `i` in this backward (a host copy), None where it passed
        none."""
        return self.passed_on.get(i)

    def _cuda_device(self) -> int | None:
        cuda = [d for d in self.devices if d is not None and d.type == "cuda"]
        return None if not cuda else (cuda[0].index if cuda[0].index is not None else torch.cuda.current_device())

    # ---- the comparison, at the end of the backward ---------------------------------------------------------------
    def check(self) -> None:
        """Judges the gradients captured in this backward against eager's (see the module docstring) and adds
        the verdicts to the owner's tally; run once, at the end of the backward."""
        owner, call = self.owner, self.call
        if self.changed:
            names = ", ".join(owner.describe_input(i) for i in self.changed)
            owner.tally.skip(call, f"inputs changed in place between the forward and the backward ({names}): "
                                   "gradients not compared")
            return
        random = set(owner.facts.random_gradients) if not isinstance(self.draws, Draws) else set()
        chosen = [i for i in self.wanted if i not in random]
        if random & set(self.wanted):
            owner.tally.skip(call, f"the gradients of {len(random & set(self.wanted))} inputs depend on random ops "
                                   f"({', '.join(owner.facts.random_ops)}) that the reference cannot draw as the run "
                                   f"did: {self.draws}")
        if not chosen:
            return
        # What the hooks kept on the host, back on the device for this entry (in the check's pool).
        inputs = [on_device(x, d) for x, d in zip(self.inputs, self.devices)]
        incoming = [on_device(g, d) for g, d in zip(self.incoming, self.output_devices)]
        eager = self._eager_gradients(inputs, incoming, chosen, wide=False)
        thunder = [on_device(self.captured(i), self.devices[i]) for i in chosen]
        thunder = [t if t is not None or e is None else torch.zeros_like(e) for t, e in zip(thunder, eager)]
        eager = [e if e is not None or t is None else torch.zeros_like(t) for t, e in zip(thunder, eager)]

        def float64():
            wide = self._eager_gradients(to_float64(inputs, requires_grad=True), incoming, chosen, wide=True)
            return [w if w is not None else (torch.zeros_like(e, dtype=torch.float64) if isinstance(e, torch.Tensor)
                                             else None) for w, e in zip(wide, eager)]

        picks = None
        if call in owner.picked_otherwise:  # the forward picked otherwise: gradients that follow it are not compared
            owner.picked_otherwise.discard(call)
            picks = Picks()
            picks.differed.append("the forward's picks")  # what `Picks.excuse_gradient` goes by
        judged = judge([f"gradient of {owner.describe_input(i)}" for i in chosen], thunder, eager, float64, picks,
                       gradients=True)
        _, not_compared = not_compared_for_ties(judged)
        if not_compared:
            owner.tally.skip(call, not_compared)
        verified = self.verified(chosen)
        owner.tally.verified_gradients += len(verified)
        counted = []
        for i, judgement in zip(chosen, judged):
            if judgement.reference == NOT_COMPARED_TIE:
                continue
            if i in verified or not judgement.mismatch:  # a capture gone wrong cannot match eager by chance
                counted.append(judgement)
                continue
            how = ("its gradient node did not run in this backward" if i not in self.delivered else
                   "autograd's total for it is not what this split passed on (the input is used elsewhere too, "
                   "e.g. a tied weight or a residual stream)")
            owner.tally.skip(call, f"the gradient of {owner.describe_input(i)} differs from eager's, but the capture "
                                   f"of this split's part of it cannot be verified: {how}; not called a mismatch")
        mismatches = owner.tally.add(call, counted)
        if mismatches:
            passed_on = [thunder[chosen.index(i)] if i in chosen else None for i in self.wanted]
            owner.evidence.keep(owner.tally, owner.label, call, "backward",
                                _as_received(self.inputs, self.requires_grad), passed_on, mismatches,
                                values=[self.wanted.index(i) for i in chosen], grad_outputs=self.incoming)

    def verified(self, chosen: list[int]) -> set[int]:
        """The inputs whose gradient autograd delivered is exactly what this split passed on."""
        return {i for i in chosen if self.delivered.get(i) is True}

    def _eager_gradients(self, inputs: list[Any], incoming: list, chosen: list[int], wide: bool) -> list:
        wanted = set(self.wanted)
        leaves = [x.detach().requires_grad_(i in wanted) if isinstance(x, torch.Tensor) else x
                  for i, x in enumerate(inputs)]
        # Float64Mode turns autocast off itself: the float64 run is the yardstick, whatever the forward ran in.
        mode = Float64Mode() if wide else self.autocast.restored()
        with torch.enable_grad(), mode, SplitCheck.drawn(self.draws):
            fed = [x.clone() if i in wanted and self.non_leaf[i] else x for i, x in enumerate(leaves)]  # as in the run
            outputs = tree_leaves(self.owner.module(*fed))
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
