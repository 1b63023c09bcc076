"""What each piece holds in memory (`recording.memory`), on real Thunder runs on CPU: a tiny Hugging Face Llama's
splits save, summed, what a count with `saved_tensors_hooks` around a forward of the same model under plain
ThunderCompiler finds; only sampled calls measure, a user's own saved-tensor hooks keep working, and training computes
the same. The CUDA peaks' logic is held here with a fake allocator driven by real autograd on CPU (the H200's figures:
tests/test_memory_cuda.py); the triage's Thunder-against-inductor figures in tests/test_triage_decoders.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import thunderfx_debug
from thunderfx_debug import load_report
from thunderfx_debug.records import DumpError, Memory, Phase
from thunderfx_debug.recording import memory as recording_memory
from thunderfx_debug.recording.memory import Counts, MemoryMeter, MemoryProbe, PieceMemory
from thunderfx_debug.render import memory as render_memory
from thunderfx_debug.settings.safety import ReportingFailures

from conftest import cpu_executors, dump_fixtures, tiny_gpt, train

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import harness  # noqa: E402

EVERY, WARMUP, STEPS = 1, 1, 4
TIMED_CALLS = 3  # calls 2, 3 and 4: the first, second and third sampled calls
SAMPLED_CALLS = 2  # of which memory measures the first two (`recording.memory.measures`)


def saved_by_a_forward(model, forward) -> int:
    """Bytes of the distinct storages autograd saves while `forward()` runs, parameters' storages left out: the
    independent count (hooks around the whole model, not the backend's per piece)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = forward()
    loss.backward()
    return sum(storages.values())


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The tiny Llama: what plain ThunderCompiler's forward saves, and a ReportingBackend run of it (sampled on
    every call after the first) with its dump."""
    from thunderfx_debug import plain_thunder_compiler

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch._dynamo.reset()
        model, batch = harness.build("llama", "tiny")
        plain = torch.compile(model, backend=plain_thunder_compiler(**harness.thunder_options("cpu")))
        counts = [saved_by_a_forward(model, lambda: plain(**batch).loss) for _ in range(2)]
        torch._dynamo.reset()
        model, batch = harness.build("llama", "tiny")
        dump_dir = tmp_path_factory.mktemp("llama_memory")
        backend = thunderfx_debug.ReportingBackend(dump_dir, timing_every=EVERY, timing_warmup=WARMUP,
                                                   flush_every=0, strict=True, **harness.thunder_options("cpu"))
        harness.train(model, batch, backend, steps=STEPS)
        report = load_report(backend.flush())
        yield counts, report, dump_dir / "rank0"
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()


def test_the_llama_splits_saved_bytes_sum_to_what_its_forward_saves_under_plain_thunder_compiler(llama):
    counts, report, _ = llama
    assert counts[0] == counts[1] > 0  # the independent count, the same on two calls
    (graph,) = report.graphs
    measured = [s for s in graph.splits if s.memory is not None]
    assert len(measured) == len(graph.splits) >= 3 and sum(s.kind.value == "thunder" for s in measured) >= 2
    assert sum(s.memory.saved_bytes for s in measured) == counts[0]
    assert graph.memory.saved_bytes == counts[0]  # the graph's own count: every split's storages, once each
    assert report.step_memory.saved_bytes == counts[0]  # one graph: the step is that graph
    decoder = max(measured, key=lambda s: len(s.ops))
    assert decoder.memory.saved_bytes > counts[0] / 2  # the decoder split holds most of it


def test_only_sampled_calls_measure_and_a_cpu_run_has_no_peaks(llama):
    _, report, _ = llama
    (graph,) = report.graphs
    pieces = [graph.memory, report.step_memory, *(s.memory for s in graph.splits)]
    assert graph.timing.count == TIMED_CALLS  # the third sampled call is timed, and measures no memory
    assert all(m.calls == SAMPLED_CALLS for m in pieces)
    assert all(m.peak_bytes is None and m.peak_calls == 0 for m in pieces)
    assert all(m.saved_least_bytes == m.saved_bytes for m in pieces)  # the same on both sampled calls


def test_graph_json_records_memory_and_the_summary_ranks_the_splits(llama):
    _, report, rank_dir = llama
    data = json.loads((rank_dir / "graph0" / "graph.json").read_text())
    assert set(data["memory"]) >= {"saved_bytes", "peak_bytes"}
    assert all(set(split["memory"]) >= {"saved_bytes", "peak_bytes"} for split in data["splits"])
    assert data["memory"]["saved_bytes"] == report.graphs[0].memory.saved_bytes
    top = render_memory.top_splits(report, "saved_bytes")
    assert [p.memory.saved_bytes for p in top] == sorted((s.memory.saved_bytes for s in report.graphs[0].splits
                                                          if s.memory.saved_bytes), reverse=True)
    assert render_memory.summary_lines(report) and "<h3>Memory</h3>" in render_memory.html_section(report)


def test_diff_compares_memory_between_runs(llama):
    import dataclasses

    _, report, _ = llama
    (graph,) = report.graphs
    decoder = max(graph.splits, key=lambda s: len(s.ops))
    grown = dataclasses.replace(decoder.memory, saved_bytes=decoder.memory.saved_bytes * 2,
                                saved_least_bytes=decoder.memory.saved_bytes * 2)
    other = dataclasses.replace(report, graphs=(dataclasses.replace(graph, splits=tuple(
        dataclasses.replace(s, memory=grown) if s is decoder else s for s in graph.splits)),))
    verdicts = {(c.path, c.figure): c.verdict for c in render_memory.memory_changes(report, other)}
    assert verdicts[(f"graph0/{decoder.name}", "saved")] == "more"
    assert verdicts[("graph0", "saved")] == "same" and verdicts[("step", "saved")] == "same"
    assert {v for k, v in verdicts.items() if k[0] != f"graph0/{decoder.name}"} == {"same"}
    from thunderfx_debug.render.diff import diff_reports

    assert diff_reports(report, other).memory == render_memory.memory_changes(report, other)


# ---- the training path on a tiny GPT --------------------------------------------------------------------------------
class CountingHooks(torch.autograd.graph.saved_tensors_hooks):
    """A user's own saved-tensor hooks: counts packs and unpacks."""

    def __init__(self):
        self.packs = self.unpacks = 0

        def pack(tensor):
            self.packs += 1
            return tensor

        def unpack(tensor):
            self.unpacks += 1
            return tensor

        super().__init__(pack, unpack)


def test_sampled_calls_pass_saved_tensors_on_to_the_users_hooks_and_change_no_number(monkeypatch, one_thread):
    pushes = []
    push = MemoryProbe.push
    monkeypatch.setattr(MemoryProbe, "push", lambda self: pushes.append(1) or push(self))

    def run(**options):
        torch._dynamo.reset()
        model, config = tiny_gpt(seed=0)
        backend = thunderfx_debug.ReportingBackend(strict=True, executors=cpu_executors(), **options)
        compiled = torch.compile(model, backend=backend)
        from thunderfx_debug.commands.models import synthetic_batches

        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        batches = synthetic_batches(config, batch_size=4, device="cpu")
        counts, losses = [], []
        for _ in range(5):
            tokens, targets = next(batches)
            hooks = CountingHooks()
            with hooks:
                loss = compiled(tokens, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            counts.append((hooks.packs, hooks.unpacks))
            losses.append(loss.detach())
        return backend, counts, torch.stack(losses), [p.detach().clone() for p in model.parameters()]

    _, off_counts, off_losses, off_params = run(timing="off")
    assert not pushes
    backend, counts, losses, params = run(timing_every=3, timing_warmup=1)  # sampled: calls 2 and 5
    report = backend.report()
    pieces = 2 * (len(report.graphs) + sum(len(g.splits) for g in report.graphs))  # a push per piece, twice
    assert len(report.graphs) == 2 and len(pushes) == pieces
    assert counts == off_counts and counts[0][0] > 0  # the user's hooks saw every tensor, sampled call or not
    assert torch.equal(losses, off_losses) and all(torch.equal(a, b) for a, b in zip(params, off_params))
    assert all(g.memory.calls == 2 and g.memory.saved_bytes > 0 for g in report.graphs)
    assert report.graphs[0].memory.saved_bytes == sum(s.memory.saved_bytes for s in report.graphs[0].splits)


# ---- peaks, with a fake allocator ----------------------------------------------------------------------------------
class FakeAllocator:
    """An allocator whose counts and history the test drives (`alloc`, `free`), recording as the CUDA one does."""

    def __init__(self, user_records: bool = False, keeps: int = 1 << 20):
        self.allocs = self.frees = self.allocated = 0
        self.events: list[int] = []
        self.on = self.user_records = user_records
        self.keeps = keeps
        self.switches: list[bool] = []

    def alloc(self, nbytes: int) -> None:
        self.allocs += 1
        self.allocated += nbytes
        self._event(nbytes)

    def free(self, nbytes: int) -> None:
        self.frees += 1
        self.allocated -= nbytes
        self._event(-nbytes)

    def _event(self, signed: int) -> None:
        if self.on:
            self.events = (self.events + [signed])[-self.keeps:]

    def counts(self) -> Counts:
        return Counts(self.allocs, self.frees, self.allocated)

    def recording(self) -> bool:
        return self.on

    def record(self, on: bool) -> None:
        self.switches.append(on)
        self.on = on
        if on:
            self.events = []

    def history(self) -> list[int]:
        return list(self.events)


class Allocating(torch.autograd.Function):
    """y = 2x, allocating `forward` bytes (freed before it returns but `held`) in its forward and `backward` in its
    backward (all freed) on the fake allocator."""

    @staticmethod
    def forward(ctx, x, allocator, forward, held, backward):
        allocator.alloc(forward)
        allocator.free(forward - held)
        ctx.allocator, ctx.backward = allocator, backward
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        ctx.allocator.alloc(ctx.backward)
        ctx.allocator.free(ctx.backward)
        return grad * 2, None, None, None, None


def _metered(allocator: FakeAllocator):
    failures = ReportingFailures(strict=True)
    probe = MemoryProbe(failures, allocator)
    graph, split = PieceMemory(), PieceMemory()
    graph_meter = MemoryMeter("graph0", probe, graph, failures, step=True)
    split_meter = MemoryMeter("graph0/thunder_0", probe, split, failures)

    def step(x):
        def graph_forward(x):
            allocator.alloc(100)  # the graph's own, before its split, held
            return split_meter.run(lambda v: Allocating.apply(v, allocator, 1000, 300, 50), (x,), 2) + 0

        y = graph_meter.run(graph_forward, (x,), 2)
        y.sum().backward()

    return probe, graph, split, step


def test_peaks_come_from_the_allocators_history_between_each_windows_counts():
    allocator = FakeAllocator()
    probe, graph, split, step = _metered(allocator)
    allocator.alloc(5000)  # allocated before the step: no window's
    step(torch.ones(3, requires_grad=True))
    assert split.record().peak_forward_bytes == 1000 and graph.record().peak_forward_bytes == 1100
    assert split.record().peak_backward_bytes == 50 and graph.record().peak_backward_bytes == 50
    assert probe.step.record().peak_bytes == 1100  # the step: from the graph's forward to the last backward's end
    assert allocator.switches == [True, False]  # recorded for the step only, once
    assert split.record().peak_calls == graph.record().peak_calls == 1


def test_a_users_own_history_is_read_and_never_switched():
    allocator = FakeAllocator(user_records=True)
    probe, graph, split, step = _metered(allocator)
    step(torch.ones(3, requires_grad=True))
    assert allocator.switches == [] and allocator.on
    assert split.record().peak_forward_bytes == 1000 and graph.record().peak_backward_bytes == 50


def test_a_users_history_that_no_longer_holds_a_window_gives_no_peak_for_it():
    allocator = FakeAllocator(user_records=True, keeps=3)  # the step makes 5 events
    probe, graph, split, step = _metered(allocator)
    step(torch.ones(3, requires_grad=True))
    assert graph.record().peak_forward_bytes is None and split.record().peak_forward_bytes is None
    assert split.record().peak_backward_bytes == 50  # its two events are still held
    assert allocator.switches == []


def test_a_backward_that_never_comes_is_closed_by_the_next_call_without_a_peak():
    allocator = FakeAllocator()
    failures = ReportingFailures(strict=True)
    probe = MemoryProbe(failures, allocator)
    piece = PieceMemory()
    meter = MemoryMeter("graph0", probe, piece, failures, step=True)
    meter.run(lambda v: Allocating.apply(v, allocator, 10, 5, 5), (torch.ones(2, requires_grad=True),), 2)
    assert allocator.on  # the step goes on while its backward is expected
    recording_memory.GraphMemory(meter).finish()
    assert not allocator.on and allocator.switches == [True, False]
    record = piece.record()
    assert record.peak_forward_bytes == 10 and record.peak_backward_bytes is None


def test_peak_between_refuses_a_stretch_whose_allocations_are_not_all_there():
    now = Counts(3, 1, 0)
    assert recording_memory.peak_between([4, 6, -4, 1], now, Counts(1, 0, 4), now) == 6
    assert recording_memory.peak_between([6, -4, 1], now, Counts(0, 0, 0), now) is None  # starts before the history
    assert recording_memory.peak_between([4, 6, 1], now, Counts(1, 0, 4), now) is None  # the free is missing


def test_a_history_that_missed_an_event_gives_no_peaks():
    allocator = FakeAllocator()
    probe, graph, split, step = _metered(allocator)
    event = allocator._event
    skipped = []
    allocator._event = lambda signed: skipped.append(signed) if signed == -700 else event(signed)
    step(torch.ones(3, requires_grad=True))
    assert skipped and all(m.record().peak_bytes is None for m in (graph, split, probe.step))
    assert "did not hold every allocation" in probe.step.note and allocator.switches == [True, False]


# ---- records --------------------------------------------------------------------------------------------------------
def test_memory_records_round_trip_and_dumps_without_them_load():
    memory = Memory(saved_bytes=10, peak_forward_bytes=30, peak_backward_bytes=20, calls=2, saved_least_bytes=8,
                    peak_least_bytes=25, peak_calls=2)
    data = memory.to_json()
    assert data["peak_bytes"] == 30 and Memory.from_json(data, "m") == memory
    with pytest.raises(DumpError, match=r"graph.json.memory.saved_bytes"):
        Memory.from_json({"saved_bytes": "many"}, "graph.json.memory")
    old = load_report(dump_fixtures() / "normal")
    assert old.step_memory is None and all(g.memory is None for g in old.graphs)
    assert render_memory.summary_lines(old) == [] and render_memory.html_section(old) == ""


def test_piece_memory_keeps_the_largest_and_least_of_each_figure():
    piece = PieceMemory()
    for saved, forward in ((10, 5), (12, 7), (11, None)):
        piece.add_saved(saved)
        piece.add_peak(Phase.FORWARD, forward)
    piece.add_peak(Phase.BACKWARD, 6)
    record = piece.record()
    assert (record.saved_bytes, record.saved_least_bytes, record.calls) == (12, 10, 3)
    assert (record.peak_bytes, record.peak_forward_bytes, record.peak_least_bytes, record.peak_calls) == (7, 7, 6, 2)
