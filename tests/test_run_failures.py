"""When Thunder, or an executor of the user's, raises in the run (CPU, real Thunder runs): training raises what plain
ThunderCompiler raises; the dump records the exception as it was raised (its type and own message, where it was
raised, the failing piece, its phase and call) with the failing call's inputs; the failing piece's Thunder script,
run in a fresh interpreter where thunderfx_debug cannot be imported, raises the same (RESULT REPRODUCED), or says
why it does not (NOT REPRODUCED), never OK; the graph's other pieces' scripts are not REFUSED or CRASH for the input
rebuild, and say so where the failure kept them from running; the summary's and the page's first lines name the
failure; verify counts it; the minimizer shrinks it.

The failures: Thunder's tracing (`Tensor.unfold`'s automatic registration refuses a 2-D input), Thunder's autograd
connection at the first call (a split that hands the next one `x.size()` under dynamic shapes: Thunder 0.2.6's
`assert len(flat_output) == len(is_differentiable_outputs)`, the assertion a Whisper-style model hits on the device),
and the executors of tests/raising_executors.py: at a later call (on a shape the run met at its third step), in the
backward, and one whose failure only the training process's state decides.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from conftest import cpu_executors
from thunderfx_debug import ReportingBackend, load_report, plain_thunder_compiler
from thunderfx_debug.children.standalone import run_script
from thunderfx_debug.commands.verify import VERIFY_JSON
from thunderfx_debug.records import FailedIn

SCRIPT_ENV = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
TESTS = Path(__file__).resolve().parent


class SizeAcrossASplit(torch.nn.Module):
    """Its first Thunder split hands `y.size()` to the last (the inductor split of torch.sinc sits between them):
    under dynamic shapes ThunderFX's splitter counts that size as one output of the split and Thunder's trace as two
    numbers, and Thunder 0.2.6 asserts `len(flat_output) == len(is_differentiable_outputs)` at the first call."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = torch.nn.Linear(8, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        y = self.lin(x)
        size = y.size()
        z = torch.sinc(y)
        return self.out(z.reshape(size).relu()).sum()


class TanhThenSinc(torch.nn.Module):
    """A Thunder split with a tanh (which the executors of tests/raising_executors.py claim), an inductor split
    (torch.sinc), and a Thunder split after it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 6)

    def forward(self, x):
        return (torch.sinc(self.lin(x).tanh()) * 2).sum()


def _train(model, backend, batches, dynamic=False):
    """Trains on `batches` until a step raises: (the steps done, the exception or None)."""
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, batch in enumerate(batches):
        try:
            compiled(batch).backward()
        except Exception as error:  # noqa: BLE001  (what the run raises is the subject)
            return step, error
        optimizer.step()
        optimizer.zero_grad()
    return len(batches), None


def _batches(*sizes):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(size, 8, generator=generator) for size in sizes]


def _run_both(make_model, batches, dynamic=False, **options):
    """Trains under plain ThunderCompiler, then under ReportingBackend (dumping to options["dump_dir"]): both
    results, each (steps done, exception)."""
    executors = options.pop("executors", cpu_executors())
    torch.manual_seed(0)
    plain = _train(make_model(), plain_thunder_compiler(executors=executors), batches, dynamic)
    torch._dynamo.reset()
    torch.manual_seed(0)
    backend = ReportingBackend(executors=executors, strict=True, **options)
    reporting = _train(make_model(), backend, batches, dynamic)
    return plain, reporting, backend


def _same_as_plain(plain, reporting):
    (plain_steps, plain_error), (steps, error) = plain, reporting
    assert plain_error is not None and error is not None, (plain, reporting)
    assert steps == plain_steps and type(error) is type(plain_error) and str(error) == str(plain_error)
    return error


def _script(rank_dir: Path, graph, label: str, piece: str | None = None) -> Path:
    files = graph.files if piece is None else graph.split(piece).files
    return rank_dir / files[label]


def _run(script: Path):
    run = run_script(script, env=SCRIPT_ENV)
    return run, f"{run.result_line}\n--- stdout:\n{run.stdout[-3000:]}\n--- stderr:\n{run.stderr[-3000:]}"


def test_a_failure_of_thunders_autograd_connection_is_recorded_and_reproduced_by_its_scripts(tmp_path):
    plain, reporting, backend = _run_both(SizeAcrossASplit, _batches(4, 4), dynamic=True, dump_dir=tmp_path,
                                          repro="split,graph", triage="split")
    error = _same_as_plain(plain, reporting)
    assert isinstance(error, AssertionError) and reporting[0] == 0
    rank_dir = tmp_path / "rank0"
    report = load_report(rank_dir)
    graph = report.graphs[0]
    failure = graph.failure
    assert failure.piece == "graph0/thunder_0" and failure.failed_in is FailedIn.FORWARD and failure.call == 1
    assert failure.type == "AssertionError" and failure.message == ""
    assert failure.raised_at.startswith("thunder/executors/torch_autograd.py:") and "forward" in failure.raised_at
    assert failure.raised_code == "assert len(flat_output) == len(is_differentiable_outputs)"
    assert failure.not_run == ("graph0/inductor_1", "graph0/thunder_2")
    assert failure.sources and failure.sources[0].endswith("forward")
    assert failure.script == graph.split("thunder_0").files["repro_thunder"]
    assert graph.split("thunder_2").triage.error == "not triaged: it never ran: graph0/thunder_0 raised before it"
    # The summary's and the page's first lines name it: what raised, where, the model's line, the script.
    summary = str(report).splitlines()
    assert summary[0] == "FAILED: graph0/thunder_0 raised AssertionError in the forward of its first call"
    assert "torch_autograd.py" in summary[1] and "test_run_failures.py" in summary[2]
    assert summary[3] == f"  reproduce: python {failure.script}  " + summary[3].split("  ", 2)[2]
    from thunderfx_debug.render.html import render_html

    page = render_html({0: report}, {0: "rank0/"})
    body = page[page.index("<body>"):]
    assert body.index("FAILED") < body.index("Time to first step") and failure.script in body[:3000]
    # The split's and the graph's Thunder scripts, standalone, raise the run's AssertionError.
    for script in (_script(rank_dir, graph, "repro_thunder", "thunder_0"), _script(rank_dir, graph, "repro_thunder")):
        run, said = _run(script)
        assert run.outcome == "REPRODUCED" and run.returncode == 7, said
        assert "AssertionError" in run.result_line and "flat_output" in run.stderr
    # The other pieces' scripts: none is REFUSED or CRASH (the inductor split gets the size as the torch.Size it
    # is); those that never ran say so; the failing split's inductor script cannot give inductor a torch.Size output
    # and says that this script, not inductor, could not build it.
    outcomes = {}
    for split in graph.splits:
        for label, path in split.files.items():
            if label.startswith("repro_") and not (split.name == "thunder_0" and label == "repro_thunder"):
                run, said = _run(rank_dir / path)
                outcomes[f"{split.name}:{label}"] = run.outcome
                assert run.outcome not in ("REFUSED", "CRASH", "NO_RESULT", "KILLED"), said
    assert outcomes["thunder_0:repro_inductor"] == "NOT_REBUILT"
    assert outcomes["inductor_1:repro_inductor"] == "OK" and outcomes["thunder_2:repro_thunder"] == "OK"
    for split in ("inductor_1", "thunder_2"):
        text = _script(rank_dir, graph, "repro_thunder" if split == "thunder_2" else "repro_eager", split).read_text()
        assert "It never ran in the run: graph0/thunder_0 raised AssertionError" in text


def test_a_failure_of_thunders_tracing_is_reproduced_with_the_runs_values(tmp_path):
    def unfold_sum(x):
        # Thunder 0.2.6 registers Tensor.unfold with the meta of torch.nn.functional.unfold (im2col), which refuses
        # a 2-D input: Thunder's tracing raises at the split's first call. Eager computes it.
        return x.unfold(1, 2, 1).sum() * 2

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    plain = _train_function(unfold_sum, plain_thunder_compiler(), x)
    torch._dynamo.reset()
    backend = ReportingBackend(dump_dir=tmp_path, inputs="real", strict=True)
    error = _same_as_plain(plain, _train_function(unfold_sum, backend, x))
    assert isinstance(error, NotImplementedError)
    graph = load_report(tmp_path).graphs[0]
    failure = graph.failure
    assert failure.type == "NotImplementedError" and failure.message.startswith(
        "Exception encountered when doing automatic registration for unfold")
    assert failure.raised_at.startswith("thunder/torch/__init__.py:") and failure.call == 1
    script = tmp_path / "rank0" / failure.script
    assert "INPUTS_FILE" in script.read_text()  # the run's values
    run, said = _run(script)
    assert run.outcome == "REPRODUCED", said
    assert "automatic registration for unfold" in run.result_line


def _train_function(fn, backend, x):
    compiled = torch.compile(fn, backend=backend)
    try:
        compiled(x)
    except Exception as error:  # noqa: BLE001
        return 0, error
    return 1, None


@pytest.mark.parametrize("inputs", ["meta", "real"])
def test_a_users_executor_that_raises_at_a_later_call_is_reproduced_with_that_calls_inputs(tmp_path, inputs):
    import raising_executors

    executors = [raising_executors.size7_ex, *cpu_executors()]
    # dynamic: one Dynamo graph, whose Thunder split meets a batch of 7 at the third step
    plain, reporting, backend = _run_both(TanhThenSinc, _batches(4, 4, 7, 4), dynamic=True, executors=executors,
                                          dump_dir=tmp_path, inputs=inputs)
    error = _same_as_plain(plain, reporting)
    assert isinstance(error, ValueError) and reporting[0] == 2
    rank_dir = tmp_path / "rank0"
    graph = load_report(rank_dir).graphs[0]
    failure = graph.failure
    assert (failure.piece, failure.failed_in, failure.call, failure.inputs_call) == ("graph0/thunder_0",
                                                                                   FailedIn.FORWARD, 3, 3)
    assert failure.type == "ValueError" and failure.message == "size7_tanh refuses a dimension of size 7 (shape (7, 6))"
    assert failure.raised_at.startswith("tests/raising_executors.py:") and failure.raised_at.endswith("_size7_tanh")
    assert not failure.not_run
    # The summary says what raised, not Dynamo's advice.
    assert str(load_report(rank_dir)).splitlines()[0] == (
        "FAILED: graph0/thunder_0 raised ValueError: size7_tanh refuses a dimension of size 7 (shape (7, 6)) in the "
        "forward of its call 3")
    script = rank_dir / failure.script
    text = script.read_text()
    assert "registered by importing raising_executors" in text and str(TESTS) in text
    assert "Its inputs are those of the failing call (call 3)" in text
    assert ("metadata of the run's call 3" if inputs == "meta" else "the run passed on its call 3 of this piece") in text
    run, said = _run(script)
    assert run.outcome == "REPRODUCED" and run.returncode == 7, said
    assert "size7_tanh refuses a dimension of size 7" in run.result_line
    assert "executor 'thunderfx_debug_test_size7': registered by importing 'raising_executors'" in run.stdout


def test_a_failure_in_the_backward_is_recorded_with_its_split_and_reproduced(tmp_path):
    import raising_executors

    executors = [raising_executors.backward_ex, *cpu_executors()]
    plain, reporting, backend = _run_both(TanhThenSinc, _batches(4, 4), executors=executors, dump_dir=tmp_path)
    error = _same_as_plain(plain, reporting)
    assert isinstance(error, RuntimeError) and reporting[0] == 0
    # A backward raises inside autograd's engine (on a thread of its own on CUDA), where the dump is not written:
    # the graph's next call writes it, as the flush at exit does where the training ends there.
    backend.flush()
    graph = load_report(tmp_path).graphs[0]
    failure = graph.failure
    assert (failure.piece, failure.failed_in, failure.call) == ("graph0/thunder_0", FailedIn.BACKWARD, 1)
    assert failure.raised_at.endswith("_tanh_backward") and "cannot differentiate" in failure.message
    assert str(load_report(tmp_path)).startswith("FAILED: graph0/thunder_0 raised RuntimeError: tanh_backward of "
                                                 "backward_ex cannot differentiate (gradient of shape (4, 6)) in the "
                                                 "backward of its first call")
    run, said = _run(tmp_path / "rank0" / failure.script)
    assert run.outcome == "REPRODUCED", said
    assert "in the backward of call 1" in run.result_line


def test_with_fallback_a_graph_whose_backward_raised_runs_without_thunder_from_its_next_step(tmp_path):
    import raising_executors

    backend = ReportingBackend(dump_dir=tmp_path, on_error="fallback", strict=True,
                               executors=[raising_executors.backward_ex, *cpu_executors()])
    torch.manual_seed(0)
    model = TanhThenSinc()
    compiled = torch.compile(model, backend=backend)
    first, *later = _batches(4, 4, 4)
    with pytest.raises(RuntimeError, match="cannot differentiate"):  # a backward that raised cannot be taken back
        compiled(first).backward()
    model.zero_grad()
    for step, batch in enumerate(later):  # from the next step on the graph runs without Thunder, as eager does
        compiled(batch).backward()
        if step == 0:  # that call wrote the dump, the failure in it
            assert load_report(tmp_path).graphs[0].failure.failed_in is FailedIn.BACKWARD
        grad, model.lin.weight.grad = model.lin.weight.grad, None
        TanhThenSinc.forward(model, batch).backward()
        torch.testing.assert_close(grad, model.lin.weight.grad)
        model.zero_grad()
    graph = load_report(backend.flush()).graphs[0]
    assert graph.fallback and graph.calls == 3
    assert graph.failure.failed_in is FailedIn.BACKWARD and graph.failure.piece == "graph0/thunder_0"


def test_a_failure_that_needs_the_runs_state_is_not_reproduced_and_its_script_says_why(tmp_path):
    import raising_executors

    backend = ReportingBackend(dump_dir=tmp_path, strict=True,
                               executors=[raising_executors.third_call_ex, *cpu_executors()])
    torch.manual_seed(0)
    steps, error = _train(TanhThenSinc(), backend, _batches(4, 4, 4, 4))
    assert steps == 2 and isinstance(error, RuntimeError)
    failure = load_report(tmp_path).graphs[0].failure
    assert failure.call == 3 and failure.message == "third_call_tanh raises from its third call on"
    run, said = _run(tmp_path / "rank0" / failure.script)
    assert run.outcome == "NOT_REPRODUCED" and run.returncode == 8, said
    assert "the run raised RuntimeError: third_call_tanh raises from its third call on" in run.result_line
    assert "the 2 calls of the piece before the failing one" in run.result_line


def test_a_script_whose_executor_cannot_be_imported_says_which_is_missing(tmp_path, monkeypatch):
    folder = tmp_path / "user_code"
    folder.mkdir()
    shutil.copy(TESTS / "raising_executors.py", folder / "gone_executors.py")
    source = (folder / "gone_executors.py").read_text().replace('"thunderfx_debug_test_', '"thunderfx_debug_gone_')
    (folder / "gone_executors.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    import gone_executors

    backend = ReportingBackend(dump_dir=tmp_path / "dump", strict=True,
                               executors=[gone_executors.size7_ex, *cpu_executors()])
    steps, error = _train(TanhThenSinc(), backend, _batches(7))
    assert steps == 0 and isinstance(error, ValueError)
    shutil.rmtree(folder)  # the user's module is gone where the script runs
    failure = load_report(tmp_path / "dump").graphs[0].failure
    run, said = _run(tmp_path / "dump" / "rank0" / failure.script)
    assert run.outcome == "NOT_REBUILT", said
    assert "the run's executor 'thunderfx_debug_gone_size7' is not registered here" in run.result_line
    assert "importing 'gone_executors'" in run.result_line and "no claim about Thunder" in run.result_line
    assert "Thunder raised" not in run.result_line


def test_verify_counts_a_reproduced_failure_and_says_so_first(tmp_path):
    from thunderfx_debug.commands.cli import main as cli

    plain, reporting, backend = _run_both(SizeAcrossASplit, _batches(4), dynamic=True, dump_dir=tmp_path)
    _same_as_plain(plain, reporting)
    status = cli(["verify", str(tmp_path), "--jobs", "1", "--only", "*thunder_0_repro_thunder.py"])
    verified = json.loads((tmp_path / VERIFY_JSON).read_text())
    assert status == 1 and not verified["clean"]
    assert verified["counts"] == {"split_thunder": {"REPRODUCED": 1}}
    assert verified["reproduced"] == ["rank0/graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py"]
    first = (tmp_path / "verify.md").read_text().splitlines()[2:5]
    assert "1 REPRODUCED" in first[0] and "The run's failure is reproduced on its own by" in first[2]


def test_minimize_at_flush_shrinks_a_reproducing_failure_to_the_ops_that_still_raise_it(tmp_path):
    plain, reporting, backend = _run_both(SizeAcrossASplit, _batches(4), dynamic=True, dump_dir=tmp_path,
                                          minimize=True, minimize_budget=300)
    _same_as_plain(plain, reporting)
    split = load_report(tmp_path).graphs[0].split("thunder_0")
    minimized = split.minimized
    assert minimized is not None and minimized.script, minimized
    assert (minimized.ops_before, minimized.ops_after) == (2, 1)
    assert minimized.verdict.startswith("RESULT REPRODUCED") and minimized.final.startswith("RESULT REPRODUCED")
    run, said = _run(tmp_path / "rank0" / minimized.script)
    assert run.outcome == "REPRODUCED", said


def test_split_scripts_tell_thunder_which_outputs_are_differentiable_as_thunderfx_did(tmp_path):
    import runpy

    import thunder

    backend = ReportingBackend(dump_dir=tmp_path, repro="split", strict=True, executors=cpu_executors())
    torch.manual_seed(0)
    model = SizeAcrossASplit()
    torch.compile(model, backend=backend)(_batches(4)[0]).backward()  # static shapes: no size crosses a split
    rank_dir = backend.flush()
    graph = load_report(rank_dir).graphs[0]
    states = {split.name: split for split in backend.recorder.graphs[0].splits}
    compared = 0
    for split in graph.splits:
        if split.kind.value != "thunder":
            continue
        options = thunder.compile_data(states[split.name].split.compiled).compile_options
        in_the_run = options["is_differentiable_outputs"]
        script = runpy.run_path(str(rank_dir / split.files["repro_thunder"]), run_name="not_main")
        torch.manual_seed(0)
        here = script["differentiable_outputs_as_thunderfx"](script["DynamoModule"](), script["make_inputs"]())
        assert here == list(in_the_run), split.name
        compared += 1
    assert compared == 2


def test_the_fusion_region_a_failure_was_raised_in_is_read_from_the_trace_frame_that_called_it():
    # A frame of a Thunder trace as Thunder compiles one (file name `thunder.<name>_<n>`, its text in linecache),
    # whose region raises as nvFuser does when it fails to compile a fusion.
    import linecache

    from thunderfx_debug.thunder.failures import exception_facts

    source = "def backward_fn(saved, cotangents):\n    [t4] = nvFusion3(saved, cotangents)\n    return t4\n"
    name = "thunder.backward_fn_99"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)

    def nvfusion3(*args):
        raise RuntimeError("INTERNAL ASSERT FAILED at fusion_kernel_runtime.cpp:476")

    namespace = {"nvFusion3": nvfusion3}
    exec(compile(source, name, "exec"), namespace)  # noqa: S102  (the test's own code)
    with pytest.raises(RuntimeError) as raised:
        namespace["backward_fn"](None, None)
    facts = exception_facts(raised.value)
    assert facts.region == "nvFusion3_backward" and facts.type == "RuntimeError"
    assert facts.raised_in.endswith(" nvfusion3") and facts.message.startswith("INTERNAL ASSERT FAILED")


def test_the_summary_of_several_ranks_names_each_failure_first_with_its_rank_and_script():
    from thunderfx_debug.records import GraphRecord, RankRecord, RunFailure
    from thunderfx_debug.render.summary import render_ranks

    failure = RunFailure(piece="graph2/thunder_1", failed_in=FailedIn.BACKWARD, type="RuntimeError",
                         message="nvFuser failed\nmore", call=4,
                         script="graph2/graph2_thunder_1/graph2_thunder_1_repro_thunder.py")
    reports = {0: RankRecord(graphs=(GraphRecord("graph2", 2),), meta={"rank": 0}),
               1: RankRecord(graphs=(GraphRecord("graph2", 2, failure=failure),), meta={"rank": 1})}
    assert render_ranks(reports).splitlines()[0] == (
        "FAILED on rank 1: graph2/thunder_1 raised RuntimeError: nvFuser failed in the backward of its call 4; "
        "reproduce: python rank1/graph2/graph2_thunder_1/graph2_thunder_1_repro_thunder.py")
