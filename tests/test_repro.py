"""Repro scripts from a real ThunderFX run on CPU (Thunder's torch.compile executor gives TorchCompileN regions):
every script a dump lists exists, imports nothing of thunderfx_debug, and runs to "RESULT OK" with metadata inputs
and with the run's real values (fusion regions included); a split that Thunder fails on gets its repro written
before the exception propagates, and its script says REPRODUCED; the template's pieces (inputs, verdicts, nvFuser's
input binding) on their own.

Running ~30 scripts as fresh interpreters costs ~10 s each here, mostly importing torch and Thunder, so the scripts
run in children forked from one interpreter that imported torch and Thunder once and then made thunderfx_debug
unimportable (each child runs one script as __main__ in its own directory, as `python script.py` would). Fresh
interpreters run the benchmark script and the failing piece's repro here, and every script of the model zoo in
tests/test_zoo.py.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import cpu_executors, tiny_gpt, train
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.artifacts.repro import script_template as template
from thunderfx_debug.artifacts.repro.inputs import in_nvfuser_layouts, nvfuser_declared_inputs
from thunderfx_debug.children.standalone import REFUSE_THUNDERFX_DEBUG, run_script
from thunderfx_debug.settings.config import Inputs
from thunderfx_debug.records import InputMeta

SCRIPT_ENV = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # no pool of inductor compile workers per script

FORK_RUNNER = r"""
import json, os, runpy, sys, traceback
import torch, torch._dynamo, torch._inductor.compile_fx
from thunderfx_debug.thunder.script_support import import_thunder
import_thunder()  # once for every child, with the workaround the scripts themselves carry
for name in [m for m in sys.modules if m == "thunderfx_debug" or m.startswith("thunderfx_debug.")]:
    del sys.modules[name]
""" + REFUSE_THUNDERFX_DEBUG + r"""
results, running = {}, {}
def run(path):
    os.chdir(os.path.dirname(path)); sys.argv = [path]
    code = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc(); code = 1
    sys.stdout.flush(); sys.stderr.flush(); os._exit(code)
def reap():
    pid, status = os.wait(); results[running.pop(pid)] = os.waitstatus_to_exitcode(status)
for path in sys.argv[1:]:
    while len(running) >= 2:
        reap()
    with open(path + ".log", "w") as log:
        pid = os.fork()
        if pid == 0:
            os.dup2(log.fileno(), 1); os.dup2(log.fileno(), 2); run(path)
    running[pid] = path
while running:
    reap()
print(json.dumps(results))
"""


def _expected_scripts(rank_dir: Path) -> dict[str, Path]:
    """label@owner -> path of every script the report of `rank_dir` should list, from its graphs/splits/fusions."""
    report = load_report(rank_dir)
    expected = {}
    for graph in report.graphs:
        for kind in ("eager", "thunder", "torchcompile"):
            expected[f"{graph.name}:repro_{kind}"] = graph.files.get(f"repro_{kind}")
        for split in graph.splits:
            kinds = ("eager", "thunder", "inductor") if split.kind.value == "thunder" else ("eager", "inductor")
            for kind in kinds:
                expected[f"{graph.name}/{split.name}:repro_{kind}"] = split.files.get(f"repro_{kind}")
            for fusion in split.fusions:
                kinds = ("nvfuser", "inductor") if fusion.executor == "nvfuser" else ("inductor",)
                for kind in kinds:
                    key = f"{graph.name}/{split.name}/{fusion.name}_{fusion.phase.value}:repro_{kind}"
                    expected[key] = fusion.files.get(f"repro_{kind}")
    return {key: (rank_dir / path if path else None) for key, path in expected.items()}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """One training run (1 layer, an inductor split from torch.sinc), dumped twice: real inputs, then metadata."""
    root = tmp_path_factory.mktemp("repro")
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("THUNDERFX_DEBUG_")]:
            patch.delenv(name)
        torch._dynamo.reset()
        model, config = tiny_gpt(graph_break=False)
        backend = ReportingBackend(
            dump_dir=root / "real", repro="all", inputs="real", executors=cpu_executors(), strict=True
        )
        train(torch.compile(model, backend=backend), model, config, steps=2)
        real = backend.flush()
        backend.config = dataclasses.replace(backend.config, inputs=Inputs.META, dump_dir=root / "meta")
        meta = backend.flush()
        torch._dynamo.reset()
    return {"real": real, "meta": meta}


def test_every_piece_has_its_scripts_and_real_inputs(dumps):
    for mode, rank_dir in dumps.items():
        expected = _expected_scripts(rank_dir)
        assert len(expected) >= 15, expected  # 1 graph, 3 splits (one inductor), 4 TorchCompile regions
        missing = [key for key, path in expected.items() if path is None or not path.is_file()]
        assert not missing, (mode, missing)
        report = load_report(rank_dir)
        assert any(f.executor == "torchcompile" for s in report.graphs[0].splits for f in s.fusions)
    # With real inputs, each graph, split and fusion region has its saved values, and its scripts load them.
    real_inputs = sorted(p.relative_to(dumps["real"]).as_posix() for p in dumps["real"].rglob("*.pt"))
    regions = [f"graph0/graph0_{s}/fusions/inputs/graph0_{s}_TorchCompile{i}_{phase}_inputs.pt"
               for s in ("thunder_0", "thunder_2") for i, phase in ((0, "forward"), (1, "backward"))]
    assert real_inputs == sorted(
        ["graph0/inputs/graph0_inputs.pt", *regions]
        + [f"graph0/graph0_{s}/inputs/graph0_{s}_inputs.pt" for s in ("thunder_0", "inductor_1", "thunder_2")]
    )
    saved = torch.load(dumps["real"] / "graph0/inputs/graph0_inputs.pt", weights_only=True)
    assert saved["format"] == 2 and saved["outputs"] is not None and len(saved["inputs"]) > 10
    thunder_script = dumps["real"] / "graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py"
    assert "INPUTS_FILE = 'inputs/graph0_thunder_0_inputs.pt'" in thunder_script.read_text()
    # With metadata, the floating-point inputs are drawn and the integer ones (the tokens, the targets) are the run's.
    meta_script = (dumps["meta"] / "graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py").read_text()
    assert "run = load_inputs(INPUTS_FILE, __file__)[0]" in meta_script and "tensor([" in meta_script
    assert "return load_inputs(INPUTS_FILE, __file__)[0]" not in meta_script
    # The run's executors, by name (Thunder 0.2.6's own writer drops them).
    assert "executors(['torchcompile', 'sdpa', 'torchcompile_xentropy'])" in thunder_script.read_text()


def _imported_modules(source: str) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def test_scripts_import_only_torch_thunder_and_the_standard_library(dumps):
    allowed = {"torch", "thunder", "nvfuser", "nvfuser_direct", "math", "builtins", "operator"} | sys.stdlib_module_names
    for rank_dir in dumps.values():
        for script in _expected_scripts(rank_dir).values():
            text = script.read_text()
            imported = _imported_modules(text)
            assert "thunderfx_debug" not in imported and imported <= allowed, (script.name, imported - allowed)
            # Fusion scripts inline the helpers of Thunder's torch executor their region calls: no Thunder import.
            if "/fusions/" in str(script):
                assert "thunder" not in imported and "import_thunder()" not in text, script.name


def _one_of_each_kind(scripts: dict[str, Path]) -> list[Path]:
    """The first script of each level (graph, split, fusion region) and kind (repro_eager, repro_thunder, ...)."""
    chosen: dict[tuple[int, str], Path] = {}
    for key, path in sorted(scripts.items()):
        owner, _, kind = key.partition(":")
        chosen.setdefault((owner.count("/"), kind), path)
    return list(chosen.values())


def test_every_script_runs_and_checks_itself(dumps):
    # Every script of the dump with real inputs; of the metadata dump, one of each level and kind (tests/test_zoo.py
    # runs every script of three zoo models' metadata dumps).
    scripts = sorted(str(p) for p in [*_expected_scripts(dumps["real"]).values(),
                                      *_one_of_each_kind(_expected_scripts(dumps["meta"]))])
    done = subprocess.run(
        [sys.executable, "-c", FORK_RUNNER, *scripts], env=SCRIPT_ENV, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(results) == scripts
    failed = {path: Path(path + ".log").read_text()[-2000:] for path, code in results.items() if code != 0}
    assert not failed, failed
    logs = {path: Path(path + ".log").read_text() for path in scripts}
    assert all("RESULT OK (exit 0)" in log for log in logs.values())
    # thunder and inductor scripts compared themselves (with the run's outputs where real inputs were saved),
    # fusion regions included.
    log = logs[str(dumps["real"] / "graph0/graph0_thunder_2/graph0_thunder_2_repro_thunder.py")]
    assert "forward outputs vs the run's" in log and "gradients vs eager" in log, log
    region = logs[str(dumps["real"] / "graph0/graph0_thunder_0/fusions/graph0_thunder_0_TorchCompile0_forward_repro_inductor.py")]
    assert "forward outputs vs the run's" in region, region


def test_benchmark_writes_the_figures_as_json(dumps, tmp_path):
    script = dumps["real"] / "graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py"
    out = tmp_path / "figures.json"
    done = run_script(script, ["--benchmark", "--json", str(out), "--min-run-time", "0.05"], env=SCRIPT_ENV)
    assert done.outcome == "OK" and done.returncode == 0, done.stdout + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["script"] == script.name and figures["outcome"] == "OK"
    assert figures["piece"] == "graph0/thunder_0" and figures["executor"] == "thunder"
    assert figures["forward_ms"] > 0 and figures["backward_ms"] is not None and figures["backward_ms"] >= 0


def _unfold_sum(x):
    # Thunder 0.2.6 registers Tensor.unfold's automatic torch fallback with the meta of torch.nn.functional.unfold
    # (im2col), which refuses a 2-D input: ThunderFX keeps the op in a thunder split, and the split fails on its
    # first call. Eager PyTorch computes it.
    return x.unfold(1, 2, 1).sum() * 2


@pytest.mark.parametrize("on_error", ["raise", "fallback"])
def test_a_failing_split_gets_its_repro_before_the_error_propagates(tmp_path, on_error):
    backend = ReportingBackend(dump_dir=tmp_path, on_error=on_error, inputs="real", strict=True)  # repro: none
    compiled = torch.compile(_unfold_sum, backend=backend)
    # Seeded: inductor sums in another order than eager, and an unseeded sum near zero fell outside allclose's rtol.
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    if on_error == "raise":
        with pytest.raises(NotImplementedError, match="unfold"):
            compiled(x)
    else:
        for _ in range(3):  # training goes on, with inductor
            assert torch.allclose(compiled(x), _unfold_sum(x))
    graph = load_report(tmp_path).graphs[0]
    assert graph.error and "unfold" in graph.error
    assert graph.fallback is (on_error == "fallback")
    split = graph.splits[0]
    assert split.error is not None and set(split.files) >= {"repro_eager", "repro_thunder", "repro_inductor"}
    assert not graph.files  # only the failing piece: THUNDERFX_DEBUG_REPRO is none
    if on_error == "fallback":
        return
    # The thunder script reproduces the failure from the saved inputs, and says it is the run's.
    rank_dir = tmp_path / "rank0"
    thunder = run_script(rank_dir / split.files["repro_thunder"], env=SCRIPT_ENV)
    assert thunder.outcome == "REPRODUCED" and thunder.returncode == 7, thunder.stdout + thunder.stderr[-2000:]
    assert "automatic registration for unfold" in thunder.stderr and "what the run raised" in thunder.result_line
    assert "INPUTS_FILE" in (rank_dir / split.files["repro_eager"]).read_text()


class RoutesWithIds(torch.nn.Module):
    """A router's shape in miniature: a projection, and beside it outputs that need no gradient in eager (the cosine
    and sine of a buffer, a float made from integer ids) and that Thunder returns marked as requiring one. The graph
    break makes them outputs of the first graph's Thunder split."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("angles", torch.linspace(0.0, 3.0, 8))

    def forward(self, x, ids):
        cos, h, weights, sin = self.angles.cos(), self.proj(x), ids.float() * 0.5, self.angles.sin()
        torch._dynamo.graph_break()
        return (h * cos + sin).sum() + (h.sum(-1) * weights).sum()


def test_a_splits_script_differentiates_the_outputs_eager_does_each_with_its_own_cotangent(tmp_path):
    """Thunder returns more outputs marked as requiring a gradient than eager does; its split's script gives every
    side the outputs eager differentiates, each the same seeded cotangent, and so finds Thunder's gradients right,
    as the in-run check does (handed out by position over each side's own outputs, Thunder's gradients answered
    other cotangents than eager's, and the script said MISMATCH)."""
    import thunder

    model = RoutesWithIds()
    x, ids = torch.randn(4, 8), torch.tensor([0, 3, 1, 2])
    compiled = thunder.jit(lambda x, ids: (model.angles.cos(), model.proj(x), ids.float() * 0.5))
    eager_outputs, thunder_outputs = (model.angles.cos(), model.proj(x), ids.float() * 0.5), compiled(x, ids)
    assert [o.requires_grad for o in eager_outputs] == [False, True, False]
    assert [o.requires_grad for o in thunder_outputs] == [True, True, True]  # what the script must not pair blindly
    backend = ReportingBackend(dump_dir=tmp_path, repro="split", check="split", check_every=1, strict=True)
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):
        compiled(x, ids).backward()
    report = load_report(backend.flush())
    split = report.graphs[0].split("thunder_0")
    assert split.check.compared and not split.check.mismatched  # the in-run check: Thunder is right
    scripts = {kind: run_script(tmp_path / "rank0" / split.files[f"repro_{kind}"], env=SCRIPT_ENV)
               for kind in ("thunder", "inductor")}
    for kind, done in scripts.items():
        assert done.outcome == "OK", (kind, done.stdout + done.stderr[-2000:])
        assert "gradients vs eager: largest error" in done.stdout


def test_inputs_over_the_cap_fall_back_to_metadata_and_say_so(tmp_path):
    backend = ReportingBackend(dump_dir=tmp_path, repro="split", inputs="real", inputs_max_mb=0, strict=True)
    torch.compile(lambda x: (x * 2).sin(), backend=backend)(torch.randn(8))
    rank_dir = backend.flush()
    assert not list(rank_dir.rglob("*.pt"))
    script = (rank_dir / "graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py").read_text()
    assert "over THUNDERFX_DEBUG_INPUTS_MAX_MB" in script and "tensor([8], 'float32'" in script


@pytest.mark.parametrize("later_work_writes_the_buffer", [False, True])
def test_a_script_fails_when_what_its_piece_returned_is_overwritten_afterwards(later_work_writes_the_buffer, capsys):
    """The H200's nvFuser build wrote into memory it did not own, so a region's returned values changed while eager
    ran. Here the piece returns a view of a buffer that later work (the eager run) overwrites: the returned values
    still match eager, and the check must fail anyway, saying which value changed."""
    buffer = torch.empty(4)

    def piece(x):
        buffer.copy_(x * 2)
        return buffer, x + 1

    def reference(x):
        if later_work_writes_the_buffer:
            buffer.zero_()
        return x * 2, x + 1

    status = template.main(piece="graph0/piece", executor="test", backend="the backend", build=lambda: piece,
                           eager=lambda: reference, make_inputs=lambda: [torch.arange(4.0)], backward=False, argv=[],
                           script="piece_repro.py")
    printed = capsys.readouterr().out
    assert "forward outputs vs eager: largest error 0;" in printed and ": OK" in printed
    assert status == (1 if later_work_writes_the_buffer else 0)
    assert ("values [0] changed after the piece returned them" in printed) is later_work_writes_the_buffer, printed
    assert ("RESULT MISMATCH (exit 1)" in printed) is later_work_writes_the_buffer


@pytest.mark.cuda
def test_nvfuser_regions_get_nvfuser_and_inductor_scripts_that_run(tmp_path):
    torch._dynamo.reset()
    model, config = tiny_gpt(device="cuda", graph_break=False, sinc_gate=False)
    backend = ReportingBackend(dump_dir=tmp_path, repro="fusion", inputs="meta", strict=True)  # Thunder's defaults
    train(torch.compile(model, backend=backend), model, config, steps=2, device="cuda")
    rank_dir = backend.flush()
    expected = {k: p for k, p in _expected_scripts(rank_dir).items() if "nvFusion" in k}
    assert any(k.endswith("repro_nvfuser") for k in expected) and all(p and p.is_file() for p in expected.values())
    # CUDA cannot be used in children forked after it was initialised: these run as fresh interpreters, several at
    # once (each spends most of its time importing torch on the host).
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda script: run_script(script, env=SCRIPT_ENV), sorted(expected.values())))
    failed = {r.script: r.stdout[-1000:] + r.stderr[-2000:] for r in results if r.outcome != "OK"}
    assert not failed, failed
