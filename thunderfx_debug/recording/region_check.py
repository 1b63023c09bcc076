"""The fusion-level check (THUNDERFX_DEBUG_CHECK=fusion): a region observer (see `regions`) that, on checked calls,
judges each fusion region's outputs against its torch reference (`thunder.reference`: the region's ops lowered by
Thunder's torch executor) run on the region's real inputs right after the region, and at the end of the split's
trace, whether what each region returned still holds the values it had right after the region.

The second part catches memory written behind the program's back: a kernel that writes out of bounds into a
neighbouring tensor (the H200's nvFuser does, past the `iota` output of a GPT's first fusion), or a buffer freed
and reused too early; comparing a region with its reference at its own end cannot see that. The watched tensors
are each region's outputs (copied right after the region) and, in the forward, the split's inputs (copied before
the split ran); at the end of the trace each one still alive whose version counter did not move (an in-place
update through PyTorch is the program's own; a stray write bumps nothing) must equal its copy. A change found
there names the tensor that was hit, not the kernel that wrote it: so the next checked call compares the watched
tensors after every region, and the first region after which one changed is named as the one that wrote it.
A copy is dropped as soon as its tensor dies, and all of them at the end of the trace.

The observer is armed by the split's check: `forward_call` around the forward of a checked call, `backward_call`
from the hooks of its backward. Unarmed runs of the trace pay one attribute test per mark.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import Phase
from thunderfx_debug.recording.check import CheckTally, EvidenceKeeper, guarded, version
from thunderfx_debug.recording.compare import Judged, judge, max_abs_difference, not_compared_for_ties
from thunderfx_debug.recording.isolation import CheckIsolation, on_device, to_host
from thunderfx_debug.recording.turns import Turn
from thunderfx_debug.scripts.judging_rule import Float64Mode, Picks, to_float64
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder.reference import RegionReferences

#: `Check.reference` of a value judged against itself (did it change after the region returned it?)
UNCHANGED = "its own value when it was returned (or received)"


@dataclasses.dataclass
class _Watched:
    """A tensor that must keep its values: `key` is the region that returned it (None for an input of the split),
    `label` names it, `copy` holds its values from when it was returned (or received)."""

    key: str | None
    label: str
    tensor: weakref.ref
    copy: torch.Tensor  # on the host
    version: int | None


class RegionCheck:
    """Checks the regions of one split (`label`, e.g. "graph0/thunder_0"); results go to `tallies` by region key,
    and changes of the split's inputs to `split_tally`."""

    def __init__(self, label: str, references: RegionReferences, tallies: dict[str, CheckTally],
                 failures: ReportingFailures, evidence: EvidenceKeeper, split_tally: CheckTally | None = None,
                 isolation: CheckIsolation | None = None, turn: Turn | None = None):
        self.label, self.references, self.tallies = label, references, tallies
        self.failures, self.evidence = failures, evidence
        self.isolation = isolation if isolation is not None else CheckIsolation()
        self.turn = turn  # the split's turns (`turns.Turns`), which take what the regions' checks cost
        self.split_tally = split_tally if split_tally is not None else CheckTally()
        self.forward_call = 0
        self.backward_call = 0
        self._call = 0
        self._phase = ""
        self._inputs: tuple = ()
        self._before: dict[int, torch.Tensor] = {}  # host copies of the inputs the running region writes into
        self._written: list[torch.Tensor] = []  # the inputs the running region writes into as the graph asks
        self._watched: dict[int, _Watched] = {}
        self._next_id = 0
        self._split_inputs: list[tuple[str, torch.Tensor]] = []
        self._written_storages: set[int] = set()
        self._localise = False  # compare the watched tensors after every region (the call after a change was seen)
        self._localising = False

    # ---- called by the split's check ------------------------------------------------------------------------------
    def watch_inputs(self, labelled: list[tuple[str, Any]], written: set[int]) -> None:
        """The split's inputs, before its forward runs on a checked call: watched through its forward, but for the
        positions in `written` (the split writes into them, maybe from a fusion, which bumps no version counter);
        no tensor sharing their memory is watched either."""
        self._split_inputs = [(label, value) for i, (label, value) in enumerate(labelled)
                              if i not in written and isinstance(value, torch.Tensor) and value.numel()]
        self._written_storages = {labelled[i][1].untyped_storage().data_ptr() for i in written
                                  if i < len(labelled) and isinstance(labelled[i][1], torch.Tensor)}

    # ---- called by the instrumented traces ------------------------------------------------------------------------
    def begin_trace(self, phase: str) -> None:
        self._call = self.forward_call if phase == Phase.FORWARD else self.backward_call
        if not self._call:
            return
        self._phase = phase
        self._watched = {}
        self._localising, self._localise = self._localise, False
        inputs, self._split_inputs = self._split_inputs, []
        if phase == Phase.FORWARD:
            with guarded(self.failures, self.split_tally, self._call, "copying the inputs", self.label), \
                    self.isolation.entered([value for _, value in inputs], self.turn):
                for label, value in inputs:
                    self._watch(None, label, value)

    def begin_region(self, key: str, *inputs) -> None:
        if not self._call:
            return
        self._inputs = inputs
        self._before, self._written = {}, []
        with guarded(self.failures, self._tally(key), self._call, "preparing the check", f"{self.label}/{key}"):
            written = self.references.get(key).written_inputs
            # the graph's own in-place ops, written by the region: not a stray write to the tensors they hit
            self._written = [inputs[i] for i in written if i < len(inputs) and isinstance(inputs[i], torch.Tensor)]
            if written:  # the reference needs the inputs as the region got them
                with self.isolation.entered(inputs, self.turn):
                    self._before = {i: to_host(x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}

    def end_region(self, key: str, *outputs) -> None:
        if not self._call:
            return
        inputs, self._inputs = self._inputs, ()
        before, self._before = self._before, {}
        written, self._written = self._written, []
        tally, where = self._tally(key), f"{self.label}/{key}"
        with guarded(self.failures, tally, self._call, "checking the fusion region", where), \
                self.isolation.entered([*inputs, *outputs], self.turn):
            inputs = tuple(on_device(before[i], x.device) if i in before else x for i, x in enumerate(inputs))
            self._check(key, inputs, outputs)
        with guarded(self.failures, tally, self._call, "checking that the fusion regions' outputs held", where), \
                self.isolation.entered([*written, *outputs], self.turn):
            self._rewatch_written(written)
            if self._localising:
                self._compare_watched(self._call, culprit=key)
            names = self.references.get(key).output_names
            for i, value in enumerate(tree_leaves(list(outputs))):
                if isinstance(value, torch.Tensor) and value.numel():
                    self._watch(key, self._output_label(names, i), value)

    def end_trace(self, phase: str) -> None:
        if not self._call or phase != self._phase:
            return
        call, self._call = self._call, 0
        with guarded(self.failures, self.split_tally, call, "checking that the fusion regions' outputs held",
                     self.label), self.isolation.entered(self._alive(), self.turn):
            if self._compare_watched(call, culprit=None):
                self._localise = True
        self._watched = {}
        if phase == Phase.BACKWARD:
            self.backward_call = 0  # one backward per checked call
        else:
            self._written_storages = set()

    # ---- checks ---------------------------------------------------------------------------------------------------
    def _tally(self, key: str) -> CheckTally:
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = CheckTally()
        return tally

    def _check(self, key: str, inputs: tuple, outputs: tuple) -> None:
        call, tally = self._call, self._tally(key)
        reference = self.references.get(key)
        if not reference.fits(inputs):
            tally.skip(call, "the region that ran is not the one of the trace Thunder holds for the split (another "
                             "cache entry): not compared")
            return
        if reference.random_ops:
            tally.skip(call, f"the region draws random numbers ({', '.join(reference.random_ops)}) that its torch "
                             "reference cannot draw as the run did: its values are not compared, only that they hold")
            return
        values = tree_leaves(list(outputs))
        picks = Picks()  # what the reference's topk, sort, argmax picked, for indices that pick among ties
        with torch.no_grad(), picks:
            expected = tree_leaves(reference.fn(*inputs))
        if len(expected) != len(values):
            tally.add(call, judge([f"outputs: {len(values)} values where the reference has {len(expected)}"],
                                  [len(values)], [len(expected)]))
            return

        def float64():
            with torch.no_grad(), Float64Mode():
                return tree_leaves(reference.fn(*to_float64(inputs)))

        judged = judge([self._output_label(reference.output_names, i) for i in range(len(values))], values,
                       expected, float64, picks)
        judged, not_compared = not_compared_for_ties(judged)
        if not_compared:
            tally.skip(call, not_compared)
        mismatches = tally.add(call, judged)
        self.evidence.keep(tally, f"{self.label}/{key}", call, self._phase, inputs, values, mismatches,
                           values=range(len(values)))

    @staticmethod
    def _output_label(names, i: int) -> str:
        return f"output {i} ({names[i]})" if i < len(names) else f"output {i}"

    def _watch(self, key: str | None, label: str, value: torch.Tensor) -> None:
        if self._written_storages and value.untyped_storage().data_ptr() in self._written_storages:
            return
        entry_id = self._next_id
        self._next_id += 1
        watched = self._watched

        def forget(_, entry_id=entry_id, watched=watched):  # the tensor died: its copy is not needed
            watched.pop(entry_id, None)

        watched[entry_id] = _Watched(key, label, weakref.ref(value, forget), to_host(value), version(value))

    def _rewatch_written(self, written: list[torch.Tensor]) -> None:
        """The watched tensors that share memory with what the region just wrote as the graph asked (`copy_` into
        its inputs) hold their new values from here on."""
        storages = {t.untyped_storage().data_ptr() for t in written}
        if not storages:
            return
        for entry_id, entry in list(self._watched.items()):
            tensor = entry.tensor()
            if tensor is not None and tensor.untyped_storage().data_ptr() in storages:
                self._watched[entry_id] = dataclasses.replace(entry, copy=to_host(tensor), version=version(tensor))

    def _alive(self) -> list[torch.Tensor]:
        return [t for t in (entry.tensor() for entry in self._watched.values()) if t is not None]

    def _compare_watched(self, call: int, culprit: str | None) -> bool:
        """Compares the watched tensors still alive (and not updated through PyTorch) with their copies; records
        each one that changed, on `culprit` (the region that just ran) or, without one, on the tensor's own piece.
        Returns whether any changed. Each copy comes back to the device in turn (one at a time: the entry's memory is
        that of the largest), and the differences are read with one synchronisation."""
        alive = []
        for entry_id, entry in list(self._watched.items()):
            tensor = entry.tensor()
            if tensor is not None and version(tensor) == entry.version and tensor.shape == entry.copy.shape:
                alive.append((entry_id, entry, tensor))
        if not alive:
            return False
        device = alive[0][2].device
        differences = torch.stack([max_abs_difference(t, on_device(e.copy, t.device)).to(device)
                                   for _, e, t in alive]).tolist()
        changed = False
        for (entry_id, entry, tensor), difference in zip(alive, differences):
            owner = "the split's " + entry.label if entry.key is None else f"{entry.label} of {entry.key}"
            if culprit is not None:
                if difference > 0:  # blamed on the region that just ran; watched afresh for the regions after it
                    self._tally(culprit).writes_unowned_memory = True
                    self._note(culprit, call, [_changed(f"{owner} changed while {culprit} ran (it is not an output "
                                                        f"of {culprit})", difference)])
                    self._watched[entry_id] = dataclasses.replace(entry, copy=to_host(tensor))
                    changed = True
                continue
            where = f"the end of the split's {self._phase}"
            tally = self.split_tally if entry.key is None else self._tally(entry.key)
            if difference > 0:
                changed = True
                done = "received" if entry.key is None else "returned"
                judged = [_changed(f"{owner} changed after it was {done}, before {where}, with no write PyTorch "
                                   "knows of (the region that wrote it is looked for on the next checked call)",
                                   difference)]
                tally.overwritten = True
                if entry.key is None:
                    mismatches = self.split_tally.add(call, judged)
                    self.evidence.keep(self.split_tally, self.label, call, self._phase, None, None, mismatches)
                else:
                    self._note(entry.key, call, judged)
            elif entry.key is not None:
                tally.add(call, [_changed(entry.label, 0.0)])
        return changed

    def _note(self, key: str, call: int, judged: list[Judged]) -> None:
        """A region's values that changed behind the program's back: a mismatch of the region, whose script is
        then written from the findings (its inputs of that call are gone by now)."""
        mismatches = self._tally(key).add(call, judged)
        self.evidence.keep(self._tally(key), f"{self.label}/{key}", call, self._phase, None, None, mismatches)


def _changed(label: str, difference: float) -> Judged:
    ratio = float("inf") if difference > 0 else 0.0
    return Judged(label, difference, ratio, ratio, 0.0, 0.0, 0.0, UNCHANGED)
