"""What each graph and split holds in memory, measured on sampled calls only (an unsampled call runs none of this).

Saved bytes. Around the forward of a sampled call, `saved_tensors_hooks` sees every tensor autograd saves for the
backward (a Thunder split's `save_for_backward`, an inductor split's, eager autograd's); the piece's figure is the
distinct storages among them (by device and data pointer, each counted once with its whole size), the storages of
parameters left out (the model holds those anyway). Hooks nest in a stack of which only the innermost packs, so one
pair of hooks serves the graph and the splits inside it (`MemoryProbe.push`): a split's tensors are those packed
while its own forward ran, the graph's all of them. A user's own hooks in force (`save_on_cpu`) keep working: ours
pass each tensor on to them. The tensors are held only until the piece's forward returns (they are saved anyway).

Peaks (CUDA). torch's caching allocator keeps one peak per device, which `reset_peak_memory_stats` sets back to what
is allocated now; a piece's peak from that counter needs a reset at the piece's start, which would change what the
user reads from `torch.cuda.max_memory_allocated()` for the rest of the step, and there is no way to set the peak
back. So the counter is never touched: on a sampled call the allocator's history of allocations and frees is
recorded (`torch.cuda.memory._record_memory_history`, without stack traces) from the first piece's start until its
last piece's backward has ended, each phase's bounds are the allocator's cumulative counts of allocations and frees
read at its start and end (host-side counters: no synchronisation), and once no window is open the history is read
once (`torch.cuda.memory._snapshot`) and each window's peak is the largest running sum of the sizes between its
bounds. Where the user records the allocator's history themselves, it is read as it is and never started, stopped
or cleared here. A history that no longer holds a window (more events than it keeps) gives no peak for it. The
sizes are the bytes requested, so a peak can read up to the allocator's rounding (512 bytes per block) below what
`max_memory_allocated` counts for the same allocations.

Which sampled calls measure (`measures`): the first two, then the 4th, 8th and 16th, then every 16th. A piece's
figures change little from one call to the next (the same code on inputs of the same shapes), while a measured step
costs host time on the training path that an unsampled one does not (reading the allocator's counts at each phase's
bounds and its history at the step's end, walking each piece's autograd graph: 5-20 ms on the H200 for a 4-layer
decoder or MoE, about a step); a short run still measures its first sampled calls, and a long one pays for memory on
one sampled call in 16.

A backward that never comes (an evaluation call with grad on) leaves its window open until the graph's next call,
which closes it without a peak (`MemoryMeter.cancel`): the history is never recorded across unsampled steps.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug.records import Memory, Phase
from thunderfx_debug.recording.backward_window import BackwardWindow
from thunderfx_debug.settings.safety import ReportingFailures
from thunderfx_debug.thunder import torch_private

#: Events the allocator's history keeps while this package records it (a sampled step of a 7B model allocates a few
#: tens of thousands of times; an event costs about 100 bytes of host memory).
MAX_EVENTS = 1 << 18


def measures(sampled_index: int) -> bool:
    """Whether the `sampled_index`-th sampled call (1-based) measures memory: 1, 2, 4, 8, 16, then every 16th.

    Example:
        >>> [i for i in range(1, 70) if measures(i)]
        [1, 2, 4, 8, 16, 32, 48, 64]
    """
    return sampled_index > 0 and (sampled_index & (sampled_index - 1) == 0 or sampled_index % 16 == 0)


class Counts(NamedTuple):
    """The allocator's cumulative allocations and frees, and the bytes allocated, at one point."""

    allocs: int
    frees: int
    allocated: int


class Allocator(Protocol):
    """The CUDA caching allocator of one device as the probe reads it (a fake one in tests)."""

    def counts(self) -> Counts: ...

    def recording(self) -> bool: ...

    def record(self, on: bool) -> None: ...

    def history(self) -> list[int]:
        """Every recorded allocation (its bytes) and free (minus its bytes), oldest first."""


class CudaAllocator:
    """The allocator of CUDA device `device` (`thunder.torch_private`)."""

    def __init__(self, device: int):
        self.device = device

    def counts(self) -> Counts:
        return Counts(*torch_private.allocator_counts(self.device))

    def recording(self) -> bool:
        return torch_private.allocator_history_recording()

    def record(self, on: bool) -> None:
        torch_private.record_allocator_history(on, MAX_EVENTS)

    def history(self) -> list[int]:
        return torch_private.allocator_history(self.device)


def peak_between(history: Sequence[int], now: Counts, start: Counts, end: Counts) -> int | None:
    """The most allocated between `start` and `end` above what was allocated at `start`, from `history` read when
    the counts were `now`; None where the history does not hold that stretch whole.

    The history's last event is the allocator's `now.allocs + now.frees`-th, so a point whose counts are (a, f)
    lies that many events before its end.

    Example (allocate 4, allocate 6, free 4, allocate 1; the window spans the last three events):
        >>> now = Counts(3, 1, 0)
        >>> peak_between([4, 6, -4, 1], now, start=Counts(1, 0, 4), end=now)
        6
    """
    return HistoryPeaks(history, now).peak(start, end)


class HistoryPeaks:
    """One reading of the allocator's history, from which the peak of any window is a slice's maximum: running sums
    and allocation counts are summed once (a step's history holds thousands of events; a sampled MoE step has a
    hundred windows)."""

    def __init__(self, history: Sequence[int], now: Counts):
        self.n, self.total = len(history), now.allocs + now.frees
        self.running = list(itertools.accumulate(history, initial=0))  # running[i]: the sum of the first i events
        self.allocs = list(itertools.accumulate((size > 0 for size in history), initial=0))

    def peak(self, start: Counts, end: Counts) -> int | None:
        first = self.n - (self.total - start.allocs - start.frees)
        last = self.n - (self.total - end.allocs - end.frees)
        if first < 0 or not first <= last <= self.n:
            return None
        allocs = self.allocs[last] - self.allocs[first]
        if allocs != end.allocs - start.allocs or (last - first) - allocs != end.frees - start.frees:
            return None  # events missing (a history that skips some)
        if last == first:
            return 0
        return max(0, max(self.running[first + 1:last + 1]) - self.running[first])

    def whole_since(self, since: Counts, now: Counts) -> bool:
        """Whether the history, recorded from counts `since` to `now`, holds every allocation and free between."""
        allocs = self.allocs[-1]
        return allocs == now.allocs - since.allocs and self.n - allocs == now.frees - since.frees


@dataclasses.dataclass
class Window:
    """One phase of one piece on one call: its bounds on the allocator, and where its peak goes."""

    sink: Callable[[int | None], None]
    start: Counts | None = None
    end: Counts | None = None


class PieceMemory:
    """The measured calls of one piece: the largest and smallest of each figure (a few integers, however long the
    run). `record()` is its `Memory`."""

    def __init__(self):
        self.calls = self.peak_calls = 0
        self.saved: list[int] = []  # [largest, smallest]
        self.peaks: dict[Phase, list[int]] = {}
        self.note: str | None = None

    def add_saved(self, nbytes: int) -> None:
        self.calls += 1
        self.saved = [max(self.saved[0], nbytes), min(self.saved[1], nbytes)] if self.saved else [nbytes, nbytes]

    def add_peak(self, phase: Phase, nbytes: int | None) -> None:
        if nbytes is None:
            return
        if phase is Phase.FORWARD:
            self.peak_calls += 1
        seen = self.peaks.get(phase)
        self.peaks[phase] = [max(seen[0], nbytes), min(seen[1], nbytes)] if seen else [nbytes, nbytes]

    def record(self) -> Memory | None:
        if not self.calls and not self.peaks:
            return None
        forward, backward = self.peaks.get(Phase.FORWARD), self.peaks.get(Phase.BACKWARD)
        least = [p[1] for p in (forward, backward) if p]
        return Memory(
            saved_bytes=self.saved[0] if self.saved else None,
            peak_forward_bytes=forward[0] if forward else None,
            peak_backward_bytes=backward[0] if backward else None,
            calls=self.calls,
            saved_least_bytes=self.saved[1] if self.saved else None,
            peak_least_bytes=max(least) if least else None,
            peak_calls=self.peak_calls,
            note=self.note,
        )


def _identity(value):
    return value


class MemoryProbe:
    """One process's saved-tensor hooks and allocator windows, shared by every graph and split that measures
    memory (see the module docstring), and the sampled steps' figures (`step`).

    A step is a stretch from the first window's start until no window is open any more: on a training step whose
    graphs are sampled together, from the first graph's forward to the end of the last backward. Its saved bytes
    are the distinct storages its graphs saved (`add_step`), its peak is what was allocated at most above what was
    allocated at its start.

    Args:
        failures: where a failure of the probe's own work goes (logged once; raised in strict mode).
        allocator: the CUDA allocator whose history gives the peaks; None on CPU (saved bytes only). `for_device`
            makes it on first use for a CUDA device.
    """

    def __init__(self, failures: ReportingFailures, allocator: Allocator | None = None):
        self.failures = failures
        self.allocator = allocator
        self.step = PieceMemory()
        self._packed: list[Any] = []
        self._hooks: list[Any] = []  # the hooks context of each push, innermost last
        self._open = 0  # windows open, and backward windows expected (`hold`): the step goes on while any is
        self._closed: list[Window] = []
        self._ours: Counts | None = None  # the counts when this probe started the history now being recorded
        self._step_start: Counts | None = None
        self._step_end: Counts | None = None
        self._step_storages: dict[tuple[torch.device, int], int] = {}
        self._step_any = False
        # The parameters' storages of the graph call being measured, for the splits inside it (read once per call)
        self.parameters: set[tuple[torch.device, int]] | None = None

    def for_device(self, device: torch.device) -> None:
        """Peaks for pieces on `device` (CUDA): the first CUDA device seen is the one measured."""
        if self.allocator is None and device.type == "cuda":
            self.allocator = CudaAllocator(device.index if device.index is not None else torch.cuda.current_device())

    # ---- saved tensors ----------------------------------------------------------------------------------------------
    def push(self) -> int:
        """Starts counting what autograd saves (hooks pushed unless a push is still in force); returns the mark that
        `pop` takes."""
        if not self._hooks:
            packed = self._packed
            outer = torch_private.saved_tensors_hooks_in_use()
            if outer is None:
                def pack(tensor):
                    packed.append(tensor)
                    return tensor

                unpack = _identity
            else:
                outer_pack, unpack = outer

                def pack(tensor):
                    packed.append(tensor)
                    return outer_pack(tensor)

                self.step.note = ("other saved-tensor hooks were in force (save_on_cpu, checkpointing): saved bytes "
                                  "count what autograd saved, which those hooks may hold elsewhere")
            hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
            hooks.__enter__()
            self._hooks.append(hooks)
        else:
            self._hooks.append(None)
        return len(self._packed)

    def pop(self, mark: int) -> list[Any]:
        """Ends the push that returned `mark`: the tensors saved since."""
        saved = self._packed[mark:]
        hooks = self._hooks.pop()
        if hooks is not None:
            hooks.__exit__(None, None, None)
        if not self._hooks:
            self._packed.clear()
        return saved

    # ---- allocator windows ------------------------------------------------------------------------------------------
    def open(self, sink: Callable[[int | None], None]) -> Window:
        """Opens a window (a piece's forward or backward) whose peak goes to `sink` once the step is read."""
        window = Window(sink)
        allocator = self.allocator
        if allocator is not None:
            if self._open == 0 and not self._closed and not allocator.recording():
                allocator.record(True)
                self._ours = allocator.counts()
            window.start = allocator.counts()
            if self._step_start is None:
                self._step_start = window.start
        self._step_any = True
        self._open += 1
        return window

    def close(self, window: Window) -> None:
        if self.allocator is not None:
            window.end = self._step_end = self.allocator.counts()
        self._closed.append(window)
        self._leave()

    def cancel(self, window: Window) -> None:
        """A window whose end never came: no peak for it."""
        window.start = None
        self._closed.append(window)
        self._leave()

    def hold(self) -> None:
        """A backward window is expected (its hooks are in place): the step is not over before it opened."""
        self._open += 1

    def release(self) -> None:
        """The expected window opened (after `open`) or will not come."""
        self._leave()

    def add_step(self, storages: dict[tuple[torch.device, int], int]) -> None:
        """A graph's saved storages, into the step's."""
        self._step_storages.update(storages)

    def _leave(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._read_step()

    def _read_step(self) -> None:
        windows, self._closed = self._closed, []
        step_start, step_end, self._step_start, self._step_end = self._step_start, self._step_end, None, None
        storages, self._step_storages = self._step_storages, {}
        any_window, self._step_any = self._step_any, False
        history: HistoryPeaks | None = None
        now = None
        ours, self._ours = self._ours, None
        try:
            with self.failures.guard("reading the allocator's history of a sampled step"):
                if self.allocator is not None and any(w.start is not None for w in windows):
                    now = self.allocator.counts()
                    history = HistoryPeaks(self.allocator.history(), now)
                    if ours is not None and not history.whole_since(ours, now):
                        # Another thread allocated between a count and its event, or the history dropped some:
                        # the bounds cannot be placed on it.
                        history = None
                        self.step.note = ("the allocator's history of a sampled step did not hold every allocation "
                                          "and free counted meanwhile (another thread allocating, or more than "
                                          f"{MAX_EVENTS} events): no peaks for it")
        finally:
            if ours is not None:
                with self.failures.guard("stopping the allocator's history"):
                    self.allocator.record(False)
        for window in windows:
            peak = None
            if history is not None and window.start is not None and window.end is not None:
                peak = history.peak(window.start, window.end)
            with self.failures.guard("storing a peak of a sampled call"):
                window.sink(peak)
        if any_window:
            self.step.add_saved(sum(storages.values()))
        if history is not None and step_start is not None and step_end is not None:
            peak = history.peak(step_start, step_end)
            self.step.add_peak(Phase.FORWARD, peak)  # the step as one phase


def saved_storages(saved: Sequence[Any],
                   parameters: set[tuple[torch.device, int]]) -> dict[tuple[torch.device, int], int]:
    """(device, data pointer) -> bytes of the distinct storages of the `saved` tensors, `parameters` left out."""
    storages = {}
    for tensor in saved:
        if not isinstance(tensor, torch.Tensor):
            continue
        try:
            storage = tensor.untyped_storage()
        except Exception:  # noqa: BLE001  (a tensor without a storage of its own: a subclass, sparse, nested)
            continue
        pointer = storage.data_ptr()
        key = (tensor.device, pointer)  # the device itself: its str() costs more than the rest of the loop
        if pointer and key not in parameters:
            storages[key] = storage.nbytes()
    return storages


def parameter_storages(args: Sequence[Any], constants: Sequence[torch.Tensor]) -> set[tuple[torch.device, int]]:
    """The storages of the parameters among a call's inputs and of the module's own (`constants`)."""
    keys = set()
    for value in (*args, *constants):
        if isinstance(value, torch.nn.Parameter):
            keys.add((value.device, value.untyped_storage().data_ptr()))
    return keys


class MemoryMeter:
    """Measures one graph or split on its sampled calls: `run(fn, args, call)` in place of `fn(*args)`.

    `state` gets the piece's figures; `constants` are parameters the piece reaches without taking them as inputs
    (a GraphModule's own); a graph's meter (`step=True`) also adds its saved storages to the step's, and hands the
    splits inside its call the parameters' storages it read. A split's backward window is opened only where peaks
    are measured (CUDA): its walk of the autograd graph would give nothing else; a graph's always (the step lasts
    until the graph's backward has ended). The piece's function runs exactly once and its exceptions are the user's;
    a failure of the measuring itself loses that call's figures (logged once, see `failures`)."""

    def __init__(self, label: str, probe: MemoryProbe, state: PieceMemory, failures: ReportingFailures,
                 constants: Sequence[torch.Tensor] = (), step: bool = False):
        self.label, self.probe, self.state, self.failures = label, probe, state, failures
        self.constants, self.step = tuple(constants), step
        self._backward: BackwardPeakWindow | None = None

    def run(self, fn: Callable, args: Sequence[Any], call: int) -> Any:
        probe = self.probe
        mark = window = None
        with self.failures.guard(f"starting the memory sample of {self.label}"):
            self.cancel()
            if self.step:
                probe.parameters = parameter_storages(args, self.constants)
            mark = probe.push()
            try:
                window = probe.open(self._sink(Phase.FORWARD))
            except BaseException:
                probe.pop(mark)
                raise
        if mark is None:
            return fn(*args)
        try:
            out = fn(*args)
        except BaseException:
            with self.failures.guard(f"ending the memory sample of {self.label}"):
                if self.step:
                    probe.parameters = None
                probe.pop(mark)
                probe.cancel(window)
            raise
        with self.failures.guard(f"ending the memory sample of {self.label}"):
            saved = probe.pop(mark)
            try:
                parameters = probe.parameters
                storages = saved_storages(saved, parameters if parameters is not None
                                          else parameter_storages(args, self.constants))
                self.state.add_saved(sum(storages.values()))
                if self.step:
                    probe.add_step(storages)
                    probe.parameters = None
                if self.step or probe.allocator is not None:
                    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                    # Before the forward's window closes: the step goes on until this backward window has come.
                    self._backward = BackwardPeakWindow(self, args, outputs)
            finally:
                probe.close(window)
        return out

    def cancel(self) -> None:
        """Drops the last sampled call's backward window where its backward never ended (called before the next
        call of the graph)."""
        if self._backward is not None:
            self._backward.cancel()
            self._backward = None

    def _sink(self, phase: Phase) -> Callable[[int | None], None]:
        state = self.state

        def sink(peak: int | None) -> None:
            state.add_peak(phase, peak)

        return sink


class BackwardPeakWindow:
    """The allocator window of one sampled call's backward: opened when the piece's backward starts, closed when it
    has ended (the piece's `backward_window.BackwardWindow`). The probe holds the step open until this window has
    opened, or will not: closed by `cancel()` before its backward came, it gives no peak. The hooks run inside the
    user's backward: a failure in them is the meter's (logged)."""

    def __init__(self, meter: MemoryMeter, inputs: Sequence[Any], outputs: Sequence[torch.Tensor]):
        self.meter = meter
        self.window: Window | None = None
        self.held = False  # the probe holds the step open for this window, which has not opened yet
        self.backward = BackwardWindow.around(inputs, outputs, on_start=self._open, on_end=self._close,
                                              on_close=self._drop)
        if self.backward is not None:
            meter.probe.hold()
            self.held = True

    def _open(self) -> None:
        meter = self.meter
        with meter.failures.guard(f"opening the backward memory window of {meter.label}"):
            if self.held:
                self.window = meter.probe.open(meter._sink(Phase.BACKWARD))
                self.held = False
                meter.probe.release()

    def _close(self) -> None:
        meter = self.meter
        with meter.failures.guard(f"closing the backward memory window of {meter.label}"):
            if self.window is not None:
                window, self.window = self.window, None
                meter.probe.close(window)

    def _drop(self) -> None:
        """The backward window closed: what it still holds of the probe goes (nothing after an ended backward)."""
        probe = self.meter.probe
        with self.meter.failures.guard(f"closing the backward memory window of {self.meter.label}"):
            if self.window is not None:
                window, self.window = self.window, None
                probe.cancel(window)
            if self.held:
                self.held = False
                probe.release()

    def cancel(self) -> None:
        if self.backward is not None:
            self.backward.close()


class GraphMemory:
    """The meters of one graph and its splits: `finish()` before each call that follows a sampled one closes the
    backward windows that never ended."""

    def __init__(self, graph: MemoryMeter, splits: Sequence[MemoryMeter] = ()):
        self.graph, self.splits = graph, list(splits)

    def finish(self) -> None:
        self.graph.cancel()
        for meter in self.splits:
            meter.cancel()
