"""Minimizing (THUNDERFX_DEBUG_MINIMIZE at flush, `thunderfx-debug minimize SCRIPT`) on real Thunder runs on CPU:
executors of our own compute one op wrongly inside a fusion region and a split of 20+ ops (`wrong_fusions`), and
each is cut to at most 3 ops that include it, whose minimal script still says MISMATCH in a fresh interpreter where
thunderfx_debug cannot be imported; a piece that does not fail is left alone; a failure that changes between
identical runs is said to be random instead of shrunk; a split that raised in the run is cut to ops that still raise
the same; scripts that pass are refused. Then the pieces without Thunder: the handback of a region, records,
settings, the command's mistakes.

Each trial is a script run in a child process (about a second here); a piece of 24 ops takes a dozen trials.
"""

from __future__ import annotations

import dataclasses
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import dump_fixtures, sitecustomize_source
from wrong_executors import wrong_sin_executor
from wrong_fusions import (WRONG_FUSION, aborting_sin_executor, crashing_sin_executor, flaky_sin_executor,
                           wrong_fusion_executor)
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.children.standalone import run_script
from thunderfx_debug.commands.cli import main
from thunderfx_debug.minimize import offline
from thunderfx_debug.minimize.trials import TrialRunner
from thunderfx_debug.settings.config import ConfigError, load_config
from thunderfx_debug.records import DumpError, InputMeta, Minimized, Phase, SplitKind, SplitRecord
from thunderfx_debug.render.html import render_html
from thunderfx_debug.thunder import script_support

TESTS = Path(__file__).resolve().parent


class Deep(nn.Module):
    """thunder_0 (matmul, relu, add: clean), inductor_1 (torch.sinc, which Thunder lacks), thunder_2: 24 ops with
    one sin, whose value no later op's backward needs (so the backward has no sin)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)
        self.v = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x):
        h = torch.sinc(torch.relu(x @ self.w) + 1) @ self.v
        for _ in range(6):
            h = torch.tanh(h) * 1.1 + 0.1
        h = torch.sin(h) * 2 + 1
        return (h * 3).sum()


def _thunder_executors(first):
    import thunder

    return [first, *thunder.get_default_executors()]


def _train_once(backend) -> Path:
    torch.manual_seed(0)
    compiled = torch.compile(Deep(), backend=backend)
    compiled(torch.randn(4, 8)).backward()
    return backend.flush()


def _fresh_interpreter_env(tmp_path: Path, *registrations: str) -> dict[str, str]:
    """The environment of a fresh interpreter that registers the test's executors at start (a `sitecustomize`, as
    a user's own executor is registered by the code that defines it) without importing thunderfx_debug: Thunder is
    imported with the workaround the scripts themselves carry (`script_support`, copied)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "thunder_import.py").write_text(Path(script_support.__file__).read_text())
    (site / "sitecustomize.py").write_text(sitecustomize_source(
        "from thunder_import import import_thunder\nimport_thunder()\nimport wrong_executors, wrong_fusions\n"
        + "".join(f"{call}()\n" for call in registrations)))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(TESTS)]), "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def _minimal_run(script: Path, env: dict[str, str]):
    run = run_script(script, env=env, timeout_s=300)
    assert not re.search(r"^\s*(import|from) thunderfx_debug", script.read_text(), re.M)
    return run


def _kept_sin(minimized: Minimized) -> bool:
    return any("torch.sin(" in op for op in minimized.kept)


def test_a_wrong_op_in_a_region_and_in_a_split_is_minimized_to_it_at_flush_and_a_clean_piece_is_left_alone(tmp_path):
    backend = ReportingBackend(dump_dir=tmp_path, check="fusion", check_every=1, strict=True, minimize=True,
                               executors=_thunder_executors(wrong_fusion_executor()))
    rank_dir = _train_once(backend)
    report = load_report(rank_dir)
    graph = report.graphs[0]
    wrong = graph.split("thunder_2")
    region = next(f for f in wrong.fusions if f.phase is Phase.FORWARD)
    assert region.executor == WRONG_FUSION and region.check.mismatches == 1 and wrong.check.mismatches == 1
    for piece, label in ((wrong, "minimal_repro_thunder"), (region, "minimal_repro_thunder")):
        minimized = piece.minimized
        assert minimized.ops_before >= 20 and 1 <= (minimized.ops_after or 0) <= 3 and _kept_sin(minimized), minimized
        assert minimized.verdict.startswith("RESULT MISMATCH") and minimized.final.startswith("RESULT MISMATCH")
        assert piece.files[label] == minimized.script and (rank_dir / minimized.script).is_file()
        assert (rank_dir / piece.files["minimal_inputs"]).is_file()
        assert minimized.trials >= 3 and minimized.seconds > 0
    # The pieces that check clean (a split, its regions, the wrong split's backward region) are left alone.
    clean = graph.split("thunder_0")
    assert clean.check.mismatches == 0 and clean.minimized is None
    others = [f for s in graph.splits for f in s.fusions if f is not region]
    assert others and all(f.check.mismatches == 0 and f.minimized is None for f in others)
    written = {name for m in (wrong.minimized, region.minimized)
               for name in (Path(m.script).name, f"{Path(m.script).stem}_inputs.pt")}
    assert {p.name for p in rank_dir.rglob("*minimal*")} == written
    summary = str(report)
    for path, piece in (("graph0/thunder_2", wrong), (f"graph0/thunder_2/{region.qualified_name}", region)):
        m = piece.minimized
        assert f"minimized {path}: {m.ops_before} ops -> {m.ops_after} ops" in summary
        assert f"script: {m.script}" in summary
    assert "<h3>Minimized</h3>" in render_html({0: report})
    assert backend.report().graphs[0].split("thunder_2").minimized == wrong.minimized
    # The minimal scripts stand on their own: a fresh interpreter with the executor registered, no thunderfx_debug.
    env = _fresh_interpreter_env(tmp_path, "wrong_fusions.wrong_fusion_executor")
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda piece: _minimal_run(rank_dir / piece.minimized.script, env), (wrong, region)))
    for run in runs:
        assert run.outcome == "MISMATCH", run.stdout[-3000:] + run.stderr[-3000:]
    # Where the executor is not registered, the minimal script says which is missing, and blames no backend.
    bare = {**os.environ, "PYTHONPATH": str(TESTS), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    run = _minimal_run(rank_dir / wrong.minimized.script, bare)
    assert run.outcome == "NOT_REBUILT", run.stdout[-3000:] + run.stderr[-3000:]
    assert f"the run's executor {WRONG_FUSION!r} is not registered here" in run.result_line
    assert "no claim about Thunder" in run.result_line and "Thunder raised" not in run.result_line


def test_the_command_minimizes_a_mismatch_script_and_refuses_one_that_passes(tmp_path, monkeypatch, capsys):
    backend = ReportingBackend(dump_dir=tmp_path / "dump", check="split", check_every=1, strict=True, repro="split",
                               executors=_thunder_executors(wrong_sin_executor()))
    rank_dir = _train_once(backend)
    graph = load_report(rank_dir).graphs[0]
    script = rank_dir / graph.split("thunder_2").files["repro_mismatch_thunder"]
    env = _fresh_interpreter_env(tmp_path, "wrong_executors.wrong_sin_executor")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the command's trials register the executor as users do

    assert main(["minimize", str(script), "--budget", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    found = re.match(r"minimized graph0/thunder_2: (\d+) ops -> (\d+) ops", lines[0])
    assert found and int(found[1]) >= 20 and 1 <= int(found[2]) <= 3, lines
    assert "torch.sin(" in lines[1] and lines[3].startswith("  the minimal script: RESULT MISMATCH"), lines
    minimal = script.with_name("graph0_thunder_2_minimal_repro_thunder.py")
    assert minimal.is_file() and minimal.with_name(f"{minimal.stem}_inputs.pt").is_file()
    header = minimal.read_text().split('"""')[1]
    assert f"from {script.name}: {found[1]} ops -> {found[2]} op" in header and "trials" in header
    run = _minimal_run(minimal, env)
    assert run.outcome == "MISMATCH", run.stdout[-3000:] + run.stderr[-3000:]

    # A script that passes is refused (its trials forked from this process, where the executor is registered: no
    # second server to start).
    monkeypatch.setattr(offline, "TrialRunner", lambda method="server": TrialRunner("fork"))
    passing = rank_dir / graph.split("thunder_0").files["repro_thunder"]
    assert main(["minimize", str(passing)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"thunderfx-debug minimize: {passing.name}: nothing minimized: its verdict is OK: it passes; minimize takes "
        "a script that says MISMATCH, CRASH or REPRODUCED")


def test_a_split_that_raised_in_the_run_is_minimized_to_the_ops_that_still_raise_it(tmp_path):
    """The failing split's script (written when Thunder failed on it in the run) says REPRODUCED; its cuts are kept
    only where they raise what the run raised (trials forked from this process, where the executor is
    registered)."""
    backend = ReportingBackend(dump_dir=tmp_path / "dump", on_error="fallback", strict=True,
                               executors=_thunder_executors(crashing_sin_executor()))
    rank_dir = _train_once(backend)
    split = load_report(rank_dir).graphs[0].split("thunder_2")
    assert "the test executor refuses sin" in split.error
    with TrialRunner("fork") as runner:
        reduction = offline.minimize_script(rank_dir / split.files["repro_thunder"], 120, runner=runner)
    assert reduction.ops_before >= 20 and 1 <= reduction.ops_after <= 3
    assert any("torch.sin(" in op for op in reduction.kept)
    reproduced = "RESULT REPRODUCED (exit 7): raised what the run raised: RuntimeError: the test executor refuses sin"
    assert reduction.verdict.startswith(reproduced) and reduction.final.startswith(reproduced), reduction
    assert reduction.script == rank_dir / "graph0" / "graph0_thunder_2" / "graph0_thunder_2_minimal_repro_thunder.py"


def test_a_failure_that_changes_between_identical_runs_is_said_random_and_not_shrunk(tmp_path, monkeypatch):
    monkeypatch.setenv("THUNDERFX_DEBUG_TEST_FLAKY", str(tmp_path / "processes"))
    backend = ReportingBackend(dump_dir=tmp_path / "dump", check="split", check_every=1, strict=True, minimize=True,
                               executors=_thunder_executors(flaky_sin_executor()))
    rank_dir = _train_once(backend)
    report = load_report(rank_dir)
    split = report.graphs[0].split("thunder_2")
    assert split.check.mismatches == 1  # wrong in the training process
    minimized = split.minimized
    assert minimized.script is None and minimized.ops_after is None and minimized.trials == 2
    assert "fails at random: identical runs of it said RESULT OK" in minimized.note and "MISMATCH" in minimized.note
    assert f"not minimized graph0/thunder_2: {minimized.note}" in str(report)
    assert not list(rank_dir.rglob("*minimal*"))


def test_a_region_handed_back_to_thunder_lines_up_with_its_function():
    """Thunder's one fusion region of a jitted function, its inputs and outputs in the region's order as positions
    among the function's: what an nvFuser region's minimal script is written from."""
    import thunder

    from thunderfx_debug.thunder.handback import single_fusion

    def piece(a, b):
        c = torch.tanh(b) * 2
        d = torch.sin(a) + c
        return d, c

    jitted = thunder.jit(piece, executors=[wrong_fusion_executor()])
    a, b = torch.randn(3), torch.randn(3)
    jitted(a, b)
    handed = single_fusion(jitted)
    assert handed.bsym.sym.name.startswith("WrongFusion")
    assert [(a, b)[i].shape for i in handed.input_positions] == [(3,), (3,)]
    assert sorted(handed.input_positions) == [0, 1] and sorted(handed.output_positions) == [0, 1]
    with pytest.raises(LookupError, match="fusion regions of the piece, not one"):
        plain = thunder.jit(piece)
        plain(a, b)
        single_fusion(plain)


def _small_region():
    """A region's torch function of 4 ops with a wrong sin, its trials through the tests' fusion executor."""
    from thunderfx_debug.minimize.shrink import full_values
    from thunderfx_debug.minimize.statements import PieceCode
    from thunderfx_debug.minimize.writing import PieceSpec, ThroughThunder

    wrong_fusion_executor()
    source = ("def nvFusion0(t0):\n  t1 = torch.tanh(t0)\n  t2 = torch.mul(t1, 2.0)\n  t3 = torch.sin(t2)\n"
              "  t4 = torch.add(t3, 1.0)\n  return (t4,)\n")
    code = PieceCode.parse(source, "nvFusion0")
    spec = PieceSpec(key="graph0/thunder_0/nvFusion0_forward", stem="graph0_thunder_0_nvFusion0_forward",
                     title="forward fusion region nvFusion0 (nvfuser)", file_kind="thunder",
                     strategy=ThroughThunder(WRONG_FUSION), prelude="import torch", backward=False, executor="nvfuser")
    return spec, code, full_values(code, {"torch": torch}, [torch.randn(4)], grad=False)


def test_an_nvfuser_region_whose_definition_cannot_be_had_keeps_its_thunder_script_and_says_why(tmp_path):
    """Without nvFuser here, the minimal region's definition cannot be asked for: the minimal script stays the one
    that hands the ops back to Thunder, named for it, and its note says why."""
    from thunderfx_debug.minimize.piece import minimize_piece

    spec, code, values = _small_region()
    with TrialRunner.in_this_process() as runner:
        reduction = minimize_piece(spec, code, values, runner, 120, tmp_path, "test")
    assert reduction.script.name == "graph0_thunder_0_nvFusion0_forward_minimal_repro_thunder.py"
    assert reduction.ops_after <= 2 and any("torch.sin(" in op for op in reduction.kept)
    assert "nvFuser's definition of the minimal region could not be had" in reduction.note
    assert reduction.final.startswith("RESULT MISMATCH")
    assert "Note: nvFuser's definition" in reduction.script.read_text()


def test_a_spent_budget_keeps_the_smallest_failing_piece_found_so_far_and_says_so(tmp_path):
    from thunderfx_debug.minimize.piece import minimize_piece

    spec, code, values = _small_region()
    with TrialRunner.in_this_process() as runner:
        reduction = minimize_piece(spec, code, values, runner, 0.001, tmp_path, "test")
    assert reduction.budget_spent and reduction.trials == 2  # the full piece's two runs, then no time for a cut
    assert reduction.ops_after == reduction.ops_before == 4 and reduction.final.startswith("RESULT MISMATCH")
    assert "stopped by its budget of 0.001 s" in reduction.script.read_text()


def test_a_piece_that_kills_its_process_is_minimized_by_the_signal_it_dies_of(tmp_path):
    """A trial that aborts (as a device assert does) is a verdict, not the end of the minimizer: the cuts that die
    of the same signal are kept."""
    from thunderfx_debug.minimize.piece import minimize_piece
    from thunderfx_debug.minimize.writing import ThroughThunder

    aborting_sin_executor()
    spec, code, values = _small_region()
    spec = dataclasses.replace(spec, strategy=ThroughThunder("thunderfx_debug_test_aborting_sin"), executor="")
    with TrialRunner.in_this_process() as runner:
        reduction = minimize_piece(spec, code, values, runner, 120, tmp_path, "test")
    assert reduction.verdict == reduction.final == "killed by signal 6 (SIGABRT)"
    assert reduction.ops_after == 1 and reduction.kept == ("t3 = torch.sin(t2)",)


def test_a_region_script_is_read_as_its_torch_function_with_the_helpers_it_needs(tmp_path):
    """What `minimize` reads of an inductor region's script (no run): the function's ops, the torch executor's
    helpers before it as what it needs, its own build, its main's arguments."""
    from thunderfx_debug.artifacts.repro import writers

    definitions = ("shallow_copy = lambda x: x\n\n\ndef TorchCompile0(t0, t1):\n  # t0: \"cpu f32[4]\"\n\n"
                   "  # model.py:3: h = x * y\n  t2 = torch.mul(t0, t1)  # t2: \"cpu f32[4]\"\n"
                   "  t3 = shallow_copy(t2)\n  del t2\n  t4 = torch.sin(t3)\n  return [t3, t4]\n")
    meta = InputMeta(kind="tensor", shape=(4,), stride=(1,), dtype="torch.float32", device="cpu")
    piece = writers.ReproSubject(key="graph0/thunder_0/TorchCompile0_forward", title="forward fusion region",
                                 description="-", definitions=definitions, callable_name="TorchCompile0",
                                 is_module=False, metas=(meta, meta), names=("t0", "t1"), backward=False)
    script = tmp_path / "graph0_thunder_0_TorchCompile0_forward_repro_inductor.py"
    script.write_text(writers.render(piece, writers.InductorRegion(), script.name, "test"))
    read = offline.read_script(script)
    assert [op.defines for op in read.code.ops] == [("t2",), ("t3",), ("t4",)] and read.code.outputs == ("t3", "t4")
    assert read.code.ops[0].comment == "# model.py:3: h = x * y" and read.code.return_style == "list"
    assert read.spec.prelude == "shallow_copy = lambda x: x" and read.spec.key == piece.key
    assert read.spec.stem == "graph0_thunder_0_TorchCompile0_forward" and read.spec.file_kind == "inductor"
    build = read.spec.strategy.build_body(piece)
    assert build == "return torch.no_grad()(torch.compile(TorchCompile0, fullgraph=True))"
    assert not read.spec.backward and not read.spec.needs_thunder and len(read.inputs) == 2


def test_the_minimize_settings_are_validated_and_a_minimized_record_reads_back():
    config = load_config(environ={"THUNDERFX_DEBUG_MINIMIZE": "1", "THUNDERFX_DEBUG_MINIMIZE_BUDGET": "30",
                                  "THUNDERFX_DEBUG_CHECK": "split"})
    assert (config.minimize, config.minimize_budget) == (True, 30.0)
    assert load_config().minimize_budget == 120.0 and not load_config().minimize
    with pytest.raises(ConfigError, match=r"THUNDERFX_DEBUG_MINIMIZE='maybe' is not valid \(allowed: 0, 1"):
        load_config(environ={"THUNDERFX_DEBUG_MINIMIZE": "maybe"})
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(ConfigError, match=rf"THUNDERFX_DEBUG_MINIMIZE_BUDGET='{bad}' is not valid \(allowed: a "
                                              r"number of seconds > 0"):
            load_config(environ={"THUNDERFX_DEBUG_MINIMIZE_BUDGET": bad})

    record = Minimized(24, 1, 2, 1, 1, 1, trials=12, seconds=9.5, script="graph0/x_minimal_repro_thunder.py",
                       verdict="RESULT MISMATCH (exit 1)", final="RESULT MISMATCH (exit 1)",
                       kept=("t3 = torch.sin(t2)",))
    split = SplitRecord(name="thunder_0", kind=SplitKind.THUNDER, minimized=record)
    assert SplitRecord.from_json(split.to_json(), "graph.json.splits[0]").minimized == record
    assert "minimized" not in SplitRecord(name="thunder_0", kind=SplitKind.THUNDER).to_json()
    damaged = {**split.to_json(), "minimized": {**record.to_json(), "trials": -1}}
    with pytest.raises(DumpError, match=r"graph.json.splits\[0\].minimized.trials: expected a count >= 0"):
        SplitRecord.from_json(damaged, "graph.json.splits[0]")
    # Dumps written before there was minimizing load as they did.
    for rank_dir in (dump_fixtures() / "normal", dump_fixtures() / "previous_format"):
        for directory in [rank_dir, *rank_dir.glob("rank*")]:
            if (directory / "manifest.json").is_file():
                report = load_report(directory)
                assert all(s.minimized is None and all(f.minimized is None for f in s.fusions)
                           for g in report.graphs for s in g.splits)


def test_the_command_says_in_one_line_what_it_cannot_minimize(tmp_path, capsys):
    assert main(["minimize", str(tmp_path / "missing.py")]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err
    other = tmp_path / "train.py"
    other.write_text("print('hello')\n")
    assert main(["minimize", str(other)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "thunderfx-debug minimize: train.py is not a script it can minimize: it has no `main(...)` call under "
        "`if __name__ == \"__main__\"`: not a thunderfx_debug repro script (minimize takes a script from a dump, or "
        "one written by minimize)")
    with pytest.raises(SystemExit) as exited:
        main(["minimize", str(other), "--budget", "0"])
    assert exited.value.code == 2 and "'0': give a number of seconds > 0" in capsys.readouterr().err
    assert main(["minimize", str(other), "--out", str(tmp_path / "nowhere" / "x.py")]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_piece_minimized_at_flush_without_saved_inputs_gets_them_rebuilt_from_its_metadata():
    """The minimizer at flush makes a mismatching piece's inputs from its recorded metadata where the call's values
    were not kept (the inputs the repro scripts make); a kind of input with no metadata is a clear error."""
    from thunderfx_debug.minimize import at_flush, flush_child
    from thunderfx_debug.records import InputKind

    metas = (InputMeta(InputKind.TENSOR, shape=(2, 3), stride=(1, 2), dtype="torch.float32", storage_size=6),
             InputMeta(InputKind.OTHER, value="a tokenizer"))
    inputs = flush_child.made_inputs(at_flush._inputs_of(None, metas[:1], ("x",)))
    assert len(inputs) == 1 and inputs[0].shape == (2, 3) and inputs[0].stride() == (1, 2)
    with pytest.raises(ValueError, match=r"input 1 \(a tokenizer\) cannot be rebuilt"):
        at_flush._inputs_of(None, metas, ("x", "y"))
