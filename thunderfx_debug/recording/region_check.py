"""The fusion-level check (THUNDERFX_DEBUG_CHECK=fusion): a region observer (see `regions`) that, on checked calls,
judges each fusion region's outputs against its torch reference (`thunder.reference`: the region's ops lowered by
Thunder's torch executor) run on the region's real inputs right after the region, and at the end of the split's
trace, whether what each region returned still holds the values it had right after the region.

The second part catches memory written after a region returned: a kernel that writes out of bounds into a
neighbouring tensor (the H200's nvFuser does, past the `iota` output of a GPT's first fusion), or a buffer freed
and reused too early; comparing a region with its reference at its own end cannot see that. It compares a copy
taken right after the region with the tensor at the end of the trace, for the outputs still alive then whose
version counter did not move (an in-place update through PyTorch is legitimate; a stray write bumps nothing).
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
from thunderfx_debug.recording.check import CheckTally, EvidenceKeeper, kept_random_state, version
from thunderfx_debug.recording.compare import Float64Mode, Judged, judge, max_abs_difference, to_float64
from thunderfx_debug.safety import ReportingFailures
from thunderfx_debug.thunder.reference import RegionReferences

#: `Check.reference` of a value judged against itself (did it change after the region returned it?)
UNCHANGED = "its own value right after the region returned"


@dataclasses.dataclass
class _Returned:
    key: str
    label: str
    tensor: weakref.ref
    copy: torch.Tensor
    version: int | None


class RegionCheck:
    """Checks the regions of one split (`label`, e.g. "graph0/thunder_0"); results go to `tallies` by region key."""

    def __init__(self, label: str, references: RegionReferences, tallies: dict[str, CheckTally],
                 failures: ReportingFailures, evidence: EvidenceKeeper):
        self.label, self.references, self.tallies = label, references, tallies
        self.failures, self.evidence = failures, evidence
        self.forward_call = 0
        self.backward_call = 0
        self._call = 0
        self._phase = ""
        self._inputs: tuple = ()
        self._returned: dict[int, _Returned] = {}
        self._next_id = 0

    # ---- called by the instrumented traces ------------------------------------------------------------------------
    def begin_trace(self, phase: str) -> None:
        self._call = self.forward_call if phase == Phase.FORWARD else self.backward_call
        if self._call:
            self._phase = phase
            self._returned = {}

    def begin_region(self, key: str, *inputs) -> None:
        if not self._call:
            return
        self._inputs = inputs
        with self.failures.guard(f"preparing the check of {self.label}/{key}"):
            if self.references.get(key).mutates_inputs:  # the reference needs the inputs as the region got them
                self._inputs = tuple(x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs)

    def end_region(self, key: str, *outputs) -> None:
        if not self._call:
            return
        inputs, self._inputs = self._inputs, ()
        with self.failures.guard(f"checking the fusion regions of {self.label}"):
            self._check(key, inputs, outputs)
        with self.failures.guard(f"copying the outputs of the fusion regions of {self.label}"):
            self._remember(key, outputs)

    def end_trace(self, phase: str) -> None:
        if not self._call or phase != self._phase:
            return
        call, self._call = self._call, 0
        returned, self._returned = self._returned, {}
        with self.failures.guard(f"checking that the fusion regions' outputs held in {self.label}"):
            self._check_unchanged(call, list(returned.values()))
        if phase == Phase.BACKWARD:
            self.backward_call = 0  # one backward per checked call

    # ---- checks ---------------------------------------------------------------------------------------------------
    def _tally(self, key: str) -> CheckTally:
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = CheckTally()
        return tally

    def _check(self, key: str, inputs: tuple, outputs: tuple) -> None:
        call, tally = self._call, self._tally(key)
        reference = self.references.get(key)
        if reference.random_ops:
            tally.skip(call, f"the region draws random numbers ({', '.join(reference.random_ops)}), which torch "
                             "draws differently: its values are not compared, only that they hold")
            return
        values = tree_leaves(list(outputs))
        with kept_random_state(inputs), torch.no_grad():
            expected = tree_leaves(reference.fn(*inputs))
        if len(expected) != len(values):
            tally.add(call, judge([f"outputs: {len(values)} values where the reference has {len(expected)}"],
                                  [len(values)], [len(expected)]))
            return

        def float64():
            with kept_random_state(inputs), torch.no_grad(), Float64Mode():
                return tree_leaves(reference.fn(*to_float64(inputs)))

        judged = judge([self._output_label(reference.output_names, i) for i in range(len(values))], values,
                       expected, float64)
        mismatches = tally.add(call, judged)
        self.evidence.keep(tally, f"{self.label}/{key}", call, self._phase, inputs, values, mismatches)

    @staticmethod
    def _output_label(names, i: int) -> str:
        return f"output {i} ({names[i]})" if i < len(names) else f"output {i}"

    def _remember(self, key: str, outputs: tuple) -> None:
        names = self.references.get(key).output_names
        for i, value in enumerate(tree_leaves(list(outputs))):
            if not isinstance(value, torch.Tensor) or value.numel() == 0:
                continue
            entry_id = self._next_id
            self._next_id += 1
            returned = self._returned

            def forget(_, entry_id=entry_id, returned=returned):  # the tensor died: its copy is not needed
                returned.pop(entry_id, None)

            returned[entry_id] = _Returned(key, self._output_label(names, i), weakref.ref(value, forget),
                                           value.detach().clone(), version(value))

    def _check_unchanged(self, call: int, returned: list[_Returned]) -> None:
        alive = []
        for entry in returned:
            tensor = entry.tensor()
            if tensor is not None and version(tensor) == entry.version and tensor.shape == entry.copy.shape:
                alive.append((entry, tensor))
        if not alive:
            return
        differences = torch.stack([max_abs_difference(t, e.copy).to(alive[0][1].device) for e, t in alive]).tolist()
        where = f"the end of the split's {self._phase}" if self._phase else "the end of the split"
        for (entry, _), difference in zip(alive, differences):
            changed = difference > 0
            label = entry.label + (f": changed after the region returned it, before {where}" if changed else "")
            ratio = float("inf") if changed else 0.0
            self._tally(entry.key).add(call, [Judged(label, difference, ratio, ratio, 0.0, 0.0, 0.0, UNCHANGED)])
