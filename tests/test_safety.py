"""Training is never broken or changed by the reporting: real faults injected into a real CPU training run.

One tiny GPT trains for STEPS steps under ReportingBackend (split-level timing, every other call sampled) while
faults hit it one after another, each between or during given steps:

    step 3 (sampled)     the timing clock fails, in the forward and in the backward hooks
    after step 1         a flush that works (the dump the next fault must not destroy)
    after step 3         the disk is full (a real full tmpfs where mounting works, else fsync failing with ENOSPC)
    after step 4         a Thunder API raises (thunder.last_traces)
    after step 5         a trace cannot be printed (TraceCtx.python raises)
    after step 6         the dump directory vanishes (removed)
    after step 7         the rank directory is read-only (a read-only bind mount for root, chmod otherwise)
    after step 8         a working flush, with credentials in the environment and on the command line

The same model trains once more on a rank that does not record (ReportingBackend compiling like plain
ThunderCompiler): the losses must be equal, bit for bit. Both runs watch every input and output of every Dynamo
graph through weak references: after each step, none may be alive.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import sys
import weakref

import pytest
import torch

from conftest import cpu_executors, tiny_gpt
from faults import CannotMakeReadOnly, full_disk, read_only, small_tmpfs
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.dump.files import DumpWriteError
from thunderfx_debug.recording.manifest import REDACTED, redacted_argv, redacted_environment
from thunderfx_debug.settings.safety import ReportingFailures

STEPS = 8
SECRETS = {
    "HF_TOKEN": "hf_SECRETVALUE1",
    "WANDB_API_KEY": "SECRETVALUE2",
    "MY_DB_PASSWORD": "SECRETVALUE3",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/SECRETVALUE4.json",
}
SECRET_URL = ("HF_ENDPOINT", "https://me:SECRETVALUE5@hub.example.com/api")
SECRET_ARGV = ["--hf-token", "SECRETVALUE6", "wandb.api_key=SECRETVALUE7"]


class WatchedBackend(ReportingBackend):
    """ReportingBackend whose graphs' inputs and outputs are watched through weak references (it keeps none)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.watched: list[weakref.ref] = []

    def __call__(self, gm, sample_args):
        compiled = super().__call__(gm, sample_args)
        watched = self.watched

        def watched_graph(*inputs):
            outputs = compiled(*inputs)
            watched.extend(weakref.ref(t) for t in _tensors((inputs, outputs)))
            return outputs

        return watched_graph


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _alive_after_step(backend: WatchedBackend, model: torch.nn.Module) -> int:
    """How many of this step's graph inputs and outputs are still alive, parameters and buffers aside."""
    gc.collect()
    owned = {id(t) for t in [*model.parameters(), *model.buffers()]}
    alive = [t for t in (ref() for ref in backend.watched) if t is not None and id(t) not in owned]
    backend.watched.clear()
    return len(alive)


def _train(backend: WatchedBackend, during=None, after=None):
    """Trains the tiny GPT for STEPS AdamW steps. `during[step]` is a context entered around that step, `after[step]`
    a function called after it. Returns (losses, alive inputs/outputs after each step)."""
    from thunderfx_debug.commands.models import synthetic_batches

    torch._dynamo.reset()
    during, after = during or {}, after or {}
    model, config = tiny_gpt(seed=0)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = synthetic_batches(config, batch_size=4, device="cpu")
    losses, alive = [], []
    for step in range(1, STEPS + 1):
        tokens, targets = next(batches)
        with during.get(step, contextlib.nullcontext)():
            loss = compiled(tokens, targets)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        del loss, tokens, targets
        alive.append(_alive_after_step(backend, model))
        if step in after:
            after[step]()
    torch._dynamo.reset()
    return torch.stack(losses), alive


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """Runs the reference and the faulty training; returns what the tests look at."""
    base = tmp_path_factory.mktemp("safety")
    warnings = _Warnings()
    logger = logging.getLogger("thunderfx_debug")
    logger.addHandler(warnings)
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        for name in [n for n in os.environ if n.startswith("THUNDERFX_DEBUG_")]:
            patch.delenv(name)
        # Bit-equal losses need one thread: with two, Inductor's CPU kernels (Thunder's TorchCompile fusions and the
        # inductor splits) differ by an ulp from run to run in this process, with or without any reporting.
        stack.callback(torch.set_num_threads, torch.get_num_threads())
        torch.set_num_threads(1)
        mount = stack.enter_context(small_tmpfs(base / "tmpfs"))
        dump_dir = (mount or base) / "dump"
        options = dict(executors=cpu_executors(), timing="split", timing_every=2, timing_warmup=0)

        # The reference: a rank that does not record (rank 0 is not in THUNDERFX_DEBUG_RANKS).
        reference_dir = base / "reference"
        reference = WatchedBackend(dump_dir=reference_dir, ranks="7", **options)
        reference_losses, reference_alive = _train(reference)
        reference.flush()

        backend = WatchedBackend(dump_dir=dump_dir, **options)
        rank_dir = dump_dir / "rank0"
        seen: dict[str, object] = {}

        def flush_then_load(name, fault=None):
            def run():
                try:
                    with fault() if fault else contextlib.nullcontext():
                        seen[f"flush {name}"] = backend.flush()
                except CannotMakeReadOnly as e:  # root without mount: that fault cannot be made here
                    seen[f"flush {name}"] = e
                seen[f"dump {name}"] = load_report(dump_dir)

            return run

        def broken_clock():
            from thunderfx_debug.recording.timing import HostClock

            def mark(self):
                raise RuntimeError("the clock broke")

            return _patched(HostClock, "mark", mark)

        def last_traces_raises():
            import thunder

            def last_traces(fn):
                raise RuntimeError("last_traces broke")

            return _patched(thunder, "last_traces", last_traces)

        def trace_cannot_be_printed():
            from thunder.core.trace import TraceCtx

            def python(self, **kwargs):
                raise RuntimeError("this trace cannot be printed")

            return _patched(TraceCtx, "python", python)

        def vanished():
            shutil.rmtree(dump_dir)
            assert not dump_dir.exists()
            return contextlib.nullcontext()

        def with_secrets():
            patch.setattr(sys, "argv", [*sys.argv, *SECRET_ARGV])
            for name, value in [*SECRETS.items(), SECRET_URL]:
                patch.setenv(name, value)
            return contextlib.nullcontext()

        losses, alive = _train(
            backend,
            during={3: broken_clock},
            after={
                1: flush_then_load("1"),
                3: flush_then_load("full disk", lambda: full_disk(rank_dir)),
                4: flush_then_load("last_traces raises", last_traces_raises),
                5: flush_then_load("unprintable trace", trace_cannot_be_printed),
                6: flush_then_load("vanished dir", vanished),
                7: flush_then_load("read-only dir", lambda: read_only(rank_dir)),
                8: flush_then_load("final", with_secrets),
            },
        )
        logger.removeHandler(warnings)
        yield dict(
            reference_losses=reference_losses, reference_alive=reference_alive, reference_dir=reference_dir,
            losses=losses, alive=alive, backend=backend, warnings=warnings.messages, dump_dir=dump_dir, **seen,
        )


@contextlib.contextmanager
def _patched(owner, name, value):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owner, name, value)
        yield


def test_losses_are_those_of_a_run_without_reporting(faulty):
    assert torch.equal(faulty["losses"], faulty["reference_losses"]), (faulty["losses"], faulty["reference_losses"])
    assert faulty["losses"][-1] < faulty["losses"][0]


def test_a_rank_that_does_not_record_writes_nothing(faulty):
    assert not faulty["reference_dir"].exists() or list(faulty["reference_dir"].iterdir()) == []


def test_each_kind_of_failure_is_logged_once_saying_what_was_being_done(faulty):
    warnings = faulty["warnings"]
    expected = [
        "starting a timing sample of graph0",
        "marking the start of the backward of graph1",  # the backward runs graph1's hooks first
        "writing the dump (DumpWriteError: [Errno 28]",  # a full disk...
        "reading the traces of graph0/thunder_0 (RuntimeError: last_traces broke)",
        "printing the traces of graph0/thunder_0 (RuntimeError: this trace cannot be printed)",
    ]
    if not isinstance(faulty["flush read-only dir"], CannotMakeReadOnly):
        expected.append("writing the dump (DumpWriteError: [Errno 30]" if os.geteuid() == 0 else
                        "writing the dump (DumpWriteError: [Errno 13]")  # ... and a read-only directory: both logged
    for text in expected:
        matching = [w for w in warnings if f"failed while {text}" in w]
        assert len(matching) == 1, (text, warnings)
    assert len(warnings) == len(expected), warnings
    failures = faulty["backend"].recorder.failures
    assert failures.total > len(expected)  # the same failures again (other splits, other hooks): counted, not logged


def test_a_fault_costs_only_what_it_hit(faulty):
    """The clock failed on step 3 only: that step's samples are lost, the others kept."""
    report = load_report(faulty["dump_dir"])
    assert report.meta["flushes"] == 7
    for graph in report.graphs:
        assert graph.calls == STEPS
        assert graph.timing.calls == (1, 5, 7)
        assert graph.backward_timing.calls == (1, 5, 7)
        for split in graph.splits:
            assert split.timing.calls == (1, 5, 7), (graph.name, split.name)
            if split.kind.value == "thunder":
                assert split.fwd_trace and split.bwd_trace  # the faults of the earlier flushes are gone
    messages = [f["error"] for f in report.meta["reporting_failures"]]
    assert any("the clock broke" in m for m in messages) and any("last_traces broke" in m for m in messages)
    assert report.meta["reporting_failures_count"] >= len(messages)


def test_full_disk_leaves_the_previous_dump(faulty):
    assert faulty["flush full disk"] is None
    previous = faulty["dump full disk"]
    assert previous.meta["flushes"] == 1 and [g.calls for g in previous.graphs] == [1, 1]
    assert all(s.fwd_trace for g in previous.graphs for s in g.splits if s.kind.value == "thunder")


def test_thunder_api_that_raises_loses_the_traces_only(faulty):
    report = faulty["dump last_traces raises"]
    assert report.meta["flushes"] == 3 and [g.calls for g in report.graphs] == [4, 4]
    thunder_splits = [s for g in report.graphs for s in g.splits if s.kind.value == "thunder"]
    assert thunder_splits and all(s.fwd_trace is None and not s.fusions for s in thunder_splits)
    assert all(s.ops for s in thunder_splits)  # what was recorded at compile time is all there


def test_trace_that_cannot_be_printed_loses_its_text_only(faulty):
    report = faulty["dump unprintable trace"]
    assert report.meta["flushes"] == 4 and [g.calls for g in report.graphs] == [5, 5]
    thunder_splits = [s for g in report.graphs for s in g.splits if s.kind.value == "thunder"]
    assert thunder_splits and all(s.fwd_trace is None and s.bwd_trace is None for s in thunder_splits)
    assert all(s.fusions for s in thunder_splits)  # fusion regions are read from the trace's symbols, not its text


def test_vanished_dump_directory_is_written_again(faulty):
    report = faulty["dump vanished dir"]
    assert faulty["flush vanished dir"] == faulty["dump_dir"] / "rank0"
    assert report.meta["flushes"] == 5 and [g.calls for g in report.graphs] == [6, 6]


def test_read_only_directory_leaves_the_previous_dump(faulty):
    if isinstance(faulty["flush read-only dir"], CannotMakeReadOnly):
        pytest.skip(str(faulty["flush read-only dir"]))
    assert faulty["flush read-only dir"] is None
    assert faulty["dump read-only dir"].meta["flushes"] == 5


def test_no_input_or_output_outlives_its_step(faulty):
    """With timing on (steps 1, 3, 5, 7 sampled, gradient hooks on them), no tensor that entered or left a Dynamo
    graph is alive once the step is over: the backend keeps no activations, in either run."""
    assert faulty["alive"] == [0] * STEPS
    assert faulty["reference_alive"] == [0] * STEPS


def test_credentials_never_reach_the_dump(faulty):
    report = faulty["dump final"]
    environment = report.meta["environment"]
    for name in SECRETS:
        assert environment[name] == REDACTED
    assert environment[SECRET_URL[0]] == f"https://{REDACTED}@hub.example.com/api"
    assert report.meta["argv"][-3:] == ["--hf-token", REDACTED, f"wandb.api_key={REDACTED}"]
    for path in faulty["dump_dir"].rglob("*"):
        if path.is_file():
            assert b"SECRETVALUE" not in path.read_bytes(), path


# ---- no training needed ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,redacted",
    [
        ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("GITHUB_TOKEN", True), ("WANDB_API_KEY", True),
        ("OPENAI_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("AWS_SESSION_TOKEN", True),
        ("MY_DB_PASSWORD", True), ("PGPASSWD", True), ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("NCCL_AUTH_KEY", True), ("hf_token", True), ("SSH_PRIVATE_KEY", True), ("COOKIE_JAR", True),
        ("CUDA_VISIBLE_DEVICES", False), ("THUNDERFX_DEBUG_DIR", False), ("TORCH_LOGS", False),
        ("MASTER_ADDR", False), ("WORLD_SIZE", False),
    ],
)
def test_credential_like_names_are_redacted(name, redacted):
    recorded = redacted_environment({name: "value-123", "HOME": "/root", "PATH": "/bin"})
    assert recorded == {name: REDACTED if redacted else "value-123"}  # HOME and PATH are not recorded at all


def test_credentials_in_urls_and_arguments_are_redacted():
    assert redacted_environment({"HF_ENDPOINT": "https://u:p@h.example/x", "TRITON_CACHE_DIR": "/tmp/t"}) == {
        "HF_ENDPOINT": f"https://{REDACTED}@h.example/x", "TRITON_CACHE_DIR": "/tmp/t"}
    assert redacted_argv(["train.py", "--api-key", "k", "--token=t", "--lr", "3e-4", "git+https://u:p@x.com/r"]) == [
        "train.py", "--api-key", REDACTED, f"--token={REDACTED}", "--lr", "3e-4", f"git+https://{REDACTED}@x.com/r"]


def test_strict_mode_raises_what_is_otherwise_logged(tmp_path, monkeypatch, caplog):
    """THUNDERFX_DEBUG_STRICT=1 turns a reporting failure into an exception (a flush on a full disk here)."""
    from conftest import cpu_executors

    lenient = ReportingBackend(dump_dir=tmp_path / "lenient", executors=cpu_executors())
    with full_disk(tmp_path / "lenient"):
        with caplog.at_level(logging.WARNING, logger="thunderfx_debug"):
            assert lenient.flush() is None
    assert "No space left on device" in caplog.text and "THUNDERFX_DEBUG_STRICT=1" in caplog.text

    monkeypatch.setenv("THUNDERFX_DEBUG_STRICT", "1")
    strict = ReportingBackend(dump_dir=tmp_path / "strict", executors=cpu_executors(), strict=False)
    assert strict.config.strict and strict.recorder.failures.strict
    with full_disk(tmp_path / "strict"):
        with pytest.raises(DumpWriteError, match="No space left on device.*The previous dump in .* is intact"):
            strict.flush()


def test_guard_logs_each_kind_once_and_keeps_a_bounded_record(caplog):
    from thunderfx_debug.settings import safety

    failures = ReportingFailures(strict=False)
    with caplog.at_level(logging.WARNING, logger="thunderfx_debug"):
        for i in range(safety.MAX_KEPT_FAILURES + 50):
            with failures.guard(f"reading the traces of graph{i}"):
                raise RuntimeError(f"broken {i}")
        with failures.guard("reading the traces of graph0"):
            raise KeyError("another type")
    assert len(caplog.records) == 2
    assert "reading the traces of graph0 (RuntimeError: broken 0)" in caplog.records[0].getMessage()
    assert len(failures.failures) == safety.MAX_KEPT_FAILURES
    assert failures.total == safety.MAX_KEPT_FAILURES + 51
    with pytest.raises(KeyboardInterrupt):  # not a failure of the reporting: it goes through
        with failures.guard("anything"):
            raise KeyboardInterrupt
    with pytest.raises(RuntimeError):
        with ReportingFailures(strict=True).guard("anything"):
            raise RuntimeError("strict")


# ---- recompiles -------------------------------------------------------------------------------------------------------


def test_each_recompile_is_recorded_with_its_guard_and_warned_about(caplog):
    """Shape changes with dynamic=False recompile the frame: each compile gets its own record, compile id and the
    guard that failed; past THUNDERFX_DEBUG_RECOMPILE_WARN compiles, one warning names the frame."""

    def scaled_sine(x, w):
        return torch.sin(x @ w).sum(0)

    backend = ReportingBackend(executors=cpu_executors(), recompile_warn_threshold=2, strict=True)
    compiled = torch.compile(scaled_sine, backend=backend, dynamic=False)
    w = torch.randn(8, 4, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="thunderfx_debug"):
        for rows in (2, 3, 2, 5, 5):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x, w), scaled_sine(x, w))
    report = backend.report()
    assert [(g.compile_id, g.calls) for g in report.graphs] == [("0/0", 2), ("0/1", 1), ("0/2", 2)]
    assert report.graphs[0].recompile_reason is None
    assert "tensor 'x' size mismatch at index 0. expected 2, actual 3" in report.graphs[1].recompile_reason
    assert "size mismatch at index 0" in report.graphs[2].recompile_reason and "actual 5" in report.graphs[2].recompile_reason
    warnings = [r.getMessage() for r in caplog.records if "was compiled" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"scaled_sine ({__file__}:" in warnings[0] and "compiled 3 times" in warnings[0]
    assert "RECOMPILE_WARN=2" in warnings[0] and "actual 5" in warnings[0]
    assert report.meta["warnings"] == [warnings[0].removeprefix("thunderfx_debug: ")]


def test_real_input_capture_respects_its_cap_and_keeps_no_originals(tmp_path):
    """THUNDERFX_DEBUG_INPUTS=real keeps host copies of a graph's first inputs up to INPUTS_MAX_MB; a graph over the
    cap gets metadata only (its script says why). The originals are not kept."""
    cap_mb = 0.002  # 2097 bytes: a 2x8 float input and the 8x4 weight fit, a 256x8 one does not

    def scaled_sine(x, w):
        return torch.sin(x @ w).sum(0)

    backend = ReportingBackend(dump_dir=tmp_path, executors=cpu_executors(), inputs="real", inputs_max_mb=cap_mb,
                               repro="graph", strict=True)
    compiled = torch.compile(scaled_sine, backend=backend, dynamic=False)
    w = torch.randn(8, 4, requires_grad=True)
    watched = []
    for rows in (2, 256):
        x = torch.randn(rows, 8, requires_grad=True)
        out = compiled(x, w)
        out.sum().backward()
        watched += [weakref.ref(x), weakref.ref(out)]
        del x, out
    gc.collect()
    assert [ref() for ref in watched] == [None] * 4
    rank_dir = backend.flush()

    saved = list(rank_dir.rglob("*_inputs.pt"))
    assert [p.relative_to(rank_dir).as_posix() for p in saved] == ["graph0/inputs/graph0_inputs.pt"]
    content = torch.load(saved[0], weights_only=True)
    tensors = [v["flat"] for v in [*content["inputs"], *(content["outputs"] or [])] if isinstance(v, dict)]
    assert [t.shape for t in tensors[:2]] == [torch.Size([16]), torch.Size([32])]  # x (2x8) and w (8x4)
    assert sum(t.numel() * t.element_size() for t in tensors) <= cap_mb * 2**20
    over = (rank_dir / "graph1" / "graph1_repro_eager.py").read_text()
    assert "THUNDERFX_DEBUG_INPUTS_MAX_MB" in over and "not saved" in over
