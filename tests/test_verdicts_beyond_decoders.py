"""Verdicts on what dense decoders do not hold, from real Thunder runs on CPU (Thunder's torch.compile executor):

- a permutation one split hands the next (`inv[perm] = arange`, Hugging Face's MoE code) and an item assignment: the
  scripts take integer inputs from the run, and trace the split's code with its item assignment as Dynamo recorded it;
- a split that writes in place into an input that was no leaf in the run (`masked_fill_`): its backward is checked,
  and the gradient it gets wrong is wrong by an independent computation too (plain ThunderCompiler against float64);
- top-k picks among tied values (a router whose gate is zero): indices that pick other of tied values are judged by
  the values they pick, what they feed is not compared, and both are said; indices that pick other values mismatch;
- a fusion region that writes into a watched tensor as the graph asks (`copy_`, Thunder's form of an in-place op) is
  not a stray write; Dynamo code that assigns a name twice is cut by the minimizer in single-assignment form, and a
  script that cannot rebuild its piece is refused;
- on CUDA (skipped here): dropout regions' torch scripts with CUDA's philox offsets (on CPU in
  tests/test_repro_regions.py), and nvFuser's printed `topk`.

Every generated script runs in a fresh interpreter where thunderfx_debug cannot be imported (`run_script`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import harness_path  # noqa: F401  (benchmarks/ on sys.path)
from conftest import cpu_executors, sitecustomize_source
from inplace_division_gradient import Router  # the benchmark's, the yardstick of the gate's gradient
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.children.standalone import run_script
from thunderfx_debug.records import SplitKind
from thunderfx_debug.thunder import script_support

TESTS = Path(__file__).parent
SCRIPT_ENV = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}


class Permuting(nn.Module):
    """A sort whose permutation the next Thunder split inverts by an item assignment (as Hugging Face's MoE code
    inverts its expert sort), across a split at `torch.sinc` (inductor's), where the result is written in place."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        perm = torch.argsort(h[:, 0])
        g = torch.sinc(h)
        g.masked_fill_(g > 0.9, 0.0)  # into an input of the split after the sinc, an inductor output: no leaf
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())  # a random `perm` leaves `inv` holding whatever memory held
        return (g[perm][inv] * h).sum()


def _train(make_model, dump: Path | None, executors, steps: int = 2, **options):
    """`steps` forward and backward calls (no optimizer: a zeroed gate stays zero) of `make_model()`, made from seed
    0, compiled with ReportingBackend (strict: a failure of the reporting or of a check raises)."""
    torch.manual_seed(0)
    model = make_model()
    backend = ReportingBackend(dump_dir=dump, strict=True, executors=executors, **options)
    compiled = torch.compile(model, backend=backend)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        out = compiled(torch.randn(16, 8, generator=generator))
        (out[0] if isinstance(out, tuple) else out).backward()
    return backend


def _split_with(report, op: str):
    return next(s for g in report.graphs for s in g.splits
                if s.kind is SplitKind.THUNDER and any(op in o for o in s.ops))


def _fresh_interpreter_env(tmp_path: Path, *registrations: str) -> dict[str, str]:
    """A fresh interpreter that registers the test's executors at start (a sitecustomize), without thunderfx_debug."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "thunder_import.py").write_text(Path(script_support.__file__).read_text())
    (site / "sitecustomize.py").write_text(sitecustomize_source(
        "from thunder_import import import_thunder\nimport_thunder()\nimport wrong_executors\n"
        + "".join(f"wrong_executors.{r}()\n" for r in registrations)))
    return {**SCRIPT_ENV, "PYTHONPATH": os.pathsep.join([str(site), str(TESTS)])}


# ---- a permutation, an item assignment, an in-place write into an input that was no leaf ---------------------------


@pytest.fixture(scope="module")
def permuting(tmp_path_factory, one_thread_module):
    dump = tmp_path_factory.mktemp("permuting")
    torch._dynamo.reset()
    # strict: a failure of the checks (the backward's, the regions' lowering) raises here
    backend = _train(Permuting, dump, cpu_executors(), repro="split", check="fusion", check_every=1)
    rank_dir = backend.flush()
    torch._dynamo.reset()
    return load_report(rank_dir), rank_dir


@pytest.fixture(scope="module")
def one_thread_module():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_scripts_take_the_runs_permutation_and_trace_the_item_assignment_as_dynamo_recorded_it(permuting):
    report, rank_dir = permuting
    split = _split_with(report, "setitem")
    scripts = {kind: rank_dir / path for kind, path in split.files.items() if kind.startswith("repro_")}
    eager_text = scripts["repro_eager"].read_text()
    assert "run = load_inputs(INPUTS_FILE, __file__)[0]" in eager_text and "run[" in eager_text
    runs = {kind: run_script(path, env=SCRIPT_ENV, timeout_s=300) for kind, path in scripts.items()
            if kind in ("repro_eager", "repro_inductor")}
    # drawn within [0, 15], `perm` is no permutation and `inv` indexes with garbage (REFUSED); traced by
    # torch.fx.symbolic_trace, `inv[perm] = ...` raised "'Proxy' object does not support item assignment" (CRASH)
    assert {kind: run.outcome for kind, run in runs.items()} == {"repro_eager": "OK", "repro_inductor": "OK"}, \
        {kind: run.stdout[-2000:] + run.stderr[-2000:] for kind, run in runs.items()}


def test_a_split_writing_into_an_input_that_was_no_leaf_has_its_backward_checked_and_its_mismatch_is_true(permuting):
    report, _ = permuting
    check = _split_with(report, "masked_fill_").check
    # Its eager reference used to run on leaves, and masked_fill_ on a leaf that requires grad raised in every
    # checked backward ("a leaf Variable that requires grad is being used in an in-place operation").
    assert check.calls == 2 and not check.failed and check.failures == 0
    assert check.mismatches == 2 and check.worst_output.startswith("gradient of input")
    # Independent of the sentinel: Thunder's gradients of the whole model (plain ThunderCompiler) against float64
    # eager are off where eager's own are within float32 rounding.
    from thunderfx_debug import plain_thunder_compiler

    def gradients(dtype, backend=None):
        torch.manual_seed(0)
        model = Permuting().to(dtype)
        compiled = model if backend is None else torch.compile(model, backend=backend)
        compiled(torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to(dtype)).backward()
        return [p.grad.double() for p in model.parameters()]

    torch._dynamo.reset()
    wide, eager = gradients(torch.float64), gradients(torch.float32)
    thunder = gradients(torch.float32, plain_thunder_compiler(executors=cpu_executors()))
    torch._dynamo.reset()
    scale = max(float(w.abs().max()) for w in wide)
    assert max(float((e - w).abs().max()) for e, w in zip(eager, wide)) < 1e-5 * scale
    assert max(float((t - w).abs().max()) for t, w in zip(thunder, wide)) > 0.1 * scale


# ---- picks among tied values -----------------------------------------------------------------------------------------


def test_indices_that_pick_other_of_tied_values_are_no_mismatch_and_the_tie_is_said(tmp_path, one_thread):
    import wrong_executors

    executors = [wrong_executors.tie_breaking_topk_executor(), *cpu_executors()]
    backend = _train(lambda: Router(zero_gate=True), tmp_path, executors, repro="split", check="split", check_every=1)
    rank_dir = backend.flush()
    report = load_report(rank_dir)
    check = _split_with(report, "topk").check
    assert check.calls == 2 and check.mismatches == 0 and not check.failed
    said = " ".join(check.skipped)
    assert "depends on which of tied values topk picked" in said  # the loss: it mixes other experts
    assert "the forward picked otherwise than eager among tied values" in said  # so do the gradients
    script = rank_dir / _split_with(report, "topk").files["repro_thunder"]
    run = run_script(script, env=_fresh_interpreter_env(tmp_path, "tie_breaking_topk_executor"), timeout_s=300)
    assert run.outcome == "NOT_COMPARABLE" and "tied values" in run.result_line, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"its indices pick other of tied values \(topk\) at \d+ of 32 positions", run.stdout)


def test_scripts_judged_against_the_runs_own_outputs_say_where_the_run_picked_otherwise_among_ties(
        tmp_path, one_thread):
    """With the run's inputs and outputs kept (inputs=real), the scripts compare with what the run returned, which
    picked among ties as the run's backend did: the eager script (which picks as eager does) says the tie, not a
    MISMATCH; the Thunder script, run with the run's executor, picks as the run did, and its gradients, which follow
    other picks than eager's, are not compared."""
    import wrong_executors

    executors = [wrong_executors.tie_breaking_topk_executor(), *cpu_executors()]
    backend = _train(lambda: Router(zero_gate=True), tmp_path, executors, repro="split", inputs="real")
    rank_dir = backend.flush()
    split = _split_with(load_report(rank_dir), "topk")
    env = _fresh_interpreter_env(tmp_path, "tie_breaking_topk_executor")
    eager = run_script(rank_dir / split.files["repro_eager"], env=env, timeout_s=300)
    assert "forward outputs vs the run's" in eager.stdout, eager.stdout[-3000:] + eager.stderr[-2000:]
    assert eager.outcome == "NOT_COMPARABLE" and "tied values the run and eager picked" in eager.result_line, \
        eager.stdout[-3000:]
    assert re.search(r"its indices pick other of tied values \(topk\) at \d+ of 32 positions", eager.stdout)
    thunder = run_script(rank_dir / split.files["repro_thunder"], env=env, timeout_s=300)
    assert re.search(r"forward outputs vs the run's: largest error 0\b.*: OK", thunder.stdout), thunder.stdout[-3000:]
    assert thunder.outcome == "NOT_COMPARABLE", thunder.stdout[-3000:] + thunder.stderr[-2000:]
    assert "the forward picked otherwise than eager among tied values" in thunder.stdout


def test_indices_that_pick_other_values_are_a_mismatch(tmp_path, one_thread):
    import wrong_executors

    backend = _train(lambda: Router(zero_gate=False), None, [wrong_executors.wrong_topk_executor(), *cpu_executors()],
                     check="split", check_every=1)
    check = _split_with(backend.report(), "topk").check
    assert check.mismatches == 2 and check.worst_output.startswith("forward output")
    assert not any("tied" in reason for reason in check.skipped), check.skipped


def test_the_minimizer_reads_dynamo_code_that_assigns_a_name_twice(tmp_path, one_thread):
    import wrong_executors
    from thunderfx_debug.minimize.offline import read_script

    executors = [wrong_executors.wrong_topk_executor(), *cpu_executors()]
    backend = _train(lambda: Router(zero_gate=False), tmp_path, executors, repro="split", check="split", check_every=1)
    rank_dir = backend.flush()
    script = rank_dir / _split_with(load_report(rank_dir), "topk").files["repro_mismatch_thunder"]
    assert "top_values /= " in script.read_text()  # Dynamo's in-place op, as its code prints it
    piece = read_script(script)  # was NotAPiece: "DynamoModule assigns ['top_values'] more than once"
    assert any(op.text.startswith("top_values__1 = __import__('operator').itruediv(top_values,")
               for op in piece.code.ops)
    defined = [name for op in piece.code.ops for name in op.defines]
    assert len(defined) == len(set(defined))


def test_a_script_that_could_not_rebuild_its_piece_is_refused_by_the_minimizer():
    from thunderfx_debug.minimize.offline import _refusal
    from thunderfx_debug.minimize.verdict import read_run

    line = ("RESULT NOT REBUILT (exit 6): nvFuser's printed definition raised TypeError: topk(): incompatible "
            "function arguments; this script could not rebuild the piece as the run built it")
    refusal = _refusal(None, [read_run(6, line), read_run(6, line)])
    assert refusal is not None and "the backend never ran it" in refusal


# ---- the fusion-level check: the graph's own in-place writes ---------------------------------------------------------


def test_a_region_that_writes_into_its_input_as_the_graph_asks_is_no_stray_write():
    """Thunder turns an in-place op into `copy_` into the tensor, which a fusion runs without bumping its version
    counter: the region that does it writes the program's own values into a tensor an earlier region returned."""
    from thunderfx_debug.recording.check import CheckTally, EvidenceKeeper
    from thunderfx_debug.recording.region_check import RegionCheck
    from thunderfx_debug.settings.safety import ReportingFailures
    from thunderfx_debug.thunder.reference import RegionReference

    class References:
        def __init__(self, written):
            self.written = written

        def get(self, key):
            written = self.written if key == "nvFusion1_forward" else ()
            return RegionReference(key, lambda a: [a * 2, a + 1], (), written, ("t0", "t1"))

    def run(written):
        failures = ReportingFailures(strict=True)
        tallies: dict[str, CheckTally] = {}
        observer = RegionCheck("graph0/thunder_0", References(written), tallies, failures,
                               EvidenceKeeper(1.0, failures), CheckTally())
        x = torch.arange(4.0)
        observer.watch_inputs([("input 0 (x)", x)], written=set())
        observer.forward_call = 1
        observer.begin_trace("forward")
        observer.begin_region("nvFusion0_forward", x)
        first = (x * 2, x + 1)
        observer.end_region("nvFusion0_forward", *first)
        observer.begin_region("nvFusion1_forward", first[1])
        first[1].data.clamp_(max=2.0)  # as nvFuser runs Thunder's `copy_(clamp(t1), t1)`: no version counter moves
        observer.end_region("nvFusion1_forward", first[1] * 2, first[1] + 1)
        observer.end_trace("forward")
        return tallies["nvFusion0_forward"].record()

    assert run(written=(0,)).mismatches == 0
    assert run(written=()).mismatches == 1  # the same write, not the region's own: a stray write


def test_the_regions_of_a_real_trace_say_which_inputs_they_write():
    import thunder

    from thunderfx_debug.thunder.reference import build_reference

    def writes_into_its_first_input(a, b):
        a.add_(b)
        return a * 2

    jitted = thunder.jit(writes_into_its_first_input, executors=cpu_executors())
    jitted(torch.ones(4), torch.ones(4))
    regions = [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.is_fusion]
    assert regions
    written = [build_reference(r, f"{r.sym.name}_forward").written_inputs for r in regions]
    names = [[r.flat_args[i].name for i in w] for r, w in zip(regions, written)]
    assert names == [["a"]]


# ---- CUDA: dropout's philox regions and nvFuser's topk, on the zoo ---------------------------------------------------


@pytest.mark.cuda
def test_on_cuda_dropout_and_topk_regions_scripts_are_ok_or_not_comparable(tmp_path):
    """GPT-2 with dropout and a Mixtral whose router's top-2 ties (its gate zeroed), bf16, nvFuser: every fusion
    script says OK or NOT COMPARABLE (no REFUSED for philox offsets, no NOT REBUILT for nvFuser's printed topk),
    and the sentinel flags no tie."""
    import harness_path  # noqa: F401
    import harness

    from thunderfx_debug.commands import verify

    for name in ("gpt2-dropout", "mixtral"):
        torch._dynamo.reset()
        model, batch = harness.build(name, "tiny", "cuda", "bfloat16")
        if name == "mixtral":
            for layer in model.model.layers:
                torch.nn.init.zeros_(layer.mlp.gate.weight)
        backend = ReportingBackend(dump_dir=tmp_path / name, repro="fusion", check="fusion", check_every=1,
                                   strict=True)
        harness.train(model, batch, backend, steps=2)
        rank_dir = backend.flush()
        report = load_report(rank_dir)
        checks = [f.check for g in report.graphs for s in g.splits for f in s.fusions if f.check is not None]
        assert checks and not any(c.mismatches for c in checks), [c for c in checks if c.mismatches]
        scripts = verify.scripts_of({rank_dir: report}, tmp_path / name)
        # verify's long-lived workers, as a user runs them: one fresh interpreter per script, in turn, takes minutes.
        fusion_scripts = [s for s in scripts if s.kind.startswith("fusion_")]
        runs = verify.run(fusion_scripts, tmp_path / name / "verify", workers=8, devices=["0"], timeout_s=300,
                          env=SCRIPT_ENV)
        assert runs and all(r.outcome in ("OK", "NOT_COMPARABLE") for r in runs), \
            [(r.script.path, r.line) for r in runs if r.outcome not in ("OK", "NOT_COMPARABLE")]


def test_picks_among_values_computed_from_bfloat16_are_judged_at_bfloat16s_tolerance():
    """A router's float32 probabilities of bfloat16 logits: a backend that rounds a logit one bfloat16 step apart
    picks the other of two experts whose logits were one step apart. Its indices, the expert ids they give and
    the sort of those ids are no mismatch; indices that pick a far smaller probability are one."""
    from thunderfx_debug.recording.compare import judge
    from thunderfx_debug.scripts.judging_rule import Picks

    def router(logits):
        _, indices = logits.float().softmax(-1).topk(2, dim=-1)
        expert_ids, permutation = indices.reshape(-1).sort()
        return [indices, expert_ids, permutation]

    torch.manual_seed(0)
    logits = torch.randn(16, 4).to(torch.bfloat16)
    logits[0] = torch.tensor([2.0, 1.0, 0.9921875, -1.0])  # the 2nd and 3rd one bfloat16 step apart
    with Picks() as picks:
        eager = router(logits)
    apart = logits.clone()
    apart[0, 2] = 1.0078125  # one step up: now above the 2nd
    theirs = router(apart)
    assert not torch.equal(theirs[0], eager[0])
    labels = ["indices", "expert ids", "permutation"]
    judged = judge(labels, theirs, eager, None, picks)
    assert not any(j.mismatch for j in judged), [(j.label, j.ratio) for j in judged]
    assert "pick other of tied values (topk)" in judged[0].label
    assert "not compared" in judged[1].label and "not compared" in judged[2].label

    with Picks() as picks:
        eager = router(logits)
    far = router(torch.where(torch.arange(4) == 3, logits + 9.0, logits))  # expert 3 everywhere: not a tie
    assert judge(labels, far, eager, None, picks)[0].mismatch


def test_thunders_gradient_through_an_in_place_division_by_a_value_needing_grad_is_a_true_mismatch(one_thread):
    """Thunder 0.2.6 (CPU executors) differentiates `top /= top.sum()` (Mixtral's router renormalising its top-k
    probabilities in place) wrongly: the check flags the gate's gradient, and autograd in float64, eager and
    `thunder.jit` outside the tool agree that Thunder's is the one that is off."""
    import thunder

    backend = _train(lambda: Router(zero_gate=False), None, cpu_executors(), check="split", check_every=1)
    check = _split_with(backend.report(), "topk").check
    assert check.mismatches >= 1 and any("gate" in v for v in check.mismatched_values), check.to_json()

    def gate_gradient(dtype, jit=False):
        torch.manual_seed(0)
        model = Router(zero_gate=False).to(dtype)
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to(dtype)
        run = thunder.jit(model, executors=cpu_executors()) if jit else model
        run(x)[0].backward()
        return model.gate.weight.grad.double()

    wide, eager, by_thunder = gate_gradient(torch.float64), gate_gradient(torch.float32), gate_gradient(torch.float32, True)
    scale = float(wide.abs().max())
    assert float((eager - wide).abs().max()) < 1e-5 * scale
    assert float((by_thunder - wide).abs().max()) > 0.05 * scale
