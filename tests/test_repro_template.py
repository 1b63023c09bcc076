"""The pieces of every repro script on their own, without a training run: the inputs a script builds (exact layouts,
values drawn like the run's), the verdict it gives for each kind of failure, nvFuser's input binding, and the
capture of a call's inputs that the scripts are written from."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import sys
import types

import pytest
import torch

from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.artifacts.repro import script_template as template
from thunderfx_debug.artifacts.repro import writers
from thunderfx_debug.records import InputKind, InputMeta
from thunderfx_debug.recording import capture
from thunderfx_debug.thunder import script_support


def _module_imports(module) -> set[str]:
    """The top-level packages a module imports at module level."""
    tree = ast.parse(open(module.__file__).read())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_embedded_templates_import_nothing_of_the_package():
    # The template imports the package's bottom layer, whose text a script carries in place of the import.
    assert _module_imports(template) <= {"torch", "thunderfx_debug"} | sys.stdlib_module_names
    written = ast.parse(writers.inlined_source(template))
    imported = {alias.name for node in ast.walk(written) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(written) if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in imported} <= {"torch"} | sys.stdlib_module_names
    # script_support is also imported by `import thunderfx_debug`, which must not import torch.
    assert _module_imports(script_support) <= sys.stdlib_module_names


def test_a_template_may_carry_only_the_bottom_layer_imported_by_name(tmp_path, monkeypatch):
    """What the writer inlines: the text of each module of `thunderfx_debug/scripts/` the template imports, once, in
    place of the import, under a line naming the file, the version and the file's SHA-256; any other import of the
    package is refused, as a script could not run it."""
    import hashlib
    import importlib

    from thunderfx_debug.scripts import device_timer, judging_rule

    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "carries": '"""A template."""\nimport math\n'
                   "from thunderfx_debug.scripts.device_timer import mark\n"
                   "from thunderfx_debug.scripts.judging_rule import (tolerance,\n    verdict)\n"
                   "from thunderfx_debug.scripts.device_timer import hold_cycles\nSEED = 0\n",
        "other_layer": "from thunderfx_debug.records import InputMeta\n",
        "deferred": "def f():\n    from thunderfx_debug.scripts.device_timer import mark\n",
        "renamed": "from thunderfx_debug.scripts.device_timer import mark as event\n",
    }
    for name, source in cases.items():
        (tmp_path / f"template_{name}.py").write_text(source)
    written = writers.inlined_source(importlib.import_module("template_carries"))
    assert written.count("# ==== thunderfx_debug/scripts/device_timer.py, inlined from thunderfx-debug ") == 1
    assert written.count("# ==== end of thunderfx_debug/scripts/judging_rule.py ====") == 1
    assert "A template" not in written and "from thunderfx_debug" not in written
    assert written.startswith("import math\n# ==== thunderfx_debug/scripts/device_timer.py,")
    assert written.rstrip().endswith("SEED = 0")
    for module in (device_timer, judging_rule):
        digest = hashlib.sha256(open(module.__file__, "rb").read()).hexdigest()[:16]
        assert f"(sha256 of the file {digest})" in written
        assert inspect.getsource(module.verdict if module is judging_rule else module.held_device_ms) in written
    for name, why in (("other_layer", "imports thunderfx_debug.records"), ("deferred", "imports thunderfx_debug.scripts"),
                      ("renamed", "imports thunderfx_debug.scripts")):
        with pytest.raises(ValueError, match=why):
            writers.inlined_source(importlib.import_module(f"template_{name}"))


def test_tensor_rebuilds_the_runs_layout_exactly():
    torch.manual_seed(0)
    cos = template.tensor([4, 16, 8], "float32", stride=[0, 8, 1], storage=128, low=-1.0, high=1.0)  # expanded
    assert cos.stride() == (0, 8, 1) and cos.untyped_storage().nbytes() == 128 * 4
    assert torch.equal(cos[0], cos[3])
    view = template.tensor([2, 3], "float16", stride=[1, 2], offset=5, storage=20)
    assert (view.stride(), view.storage_offset(), view.untyped_storage().nbytes()) == ((1, 2), 5, 40)


def test_tensor_draws_values_like_the_runs():
    torch.manual_seed(0)
    labels = template.tensor([64, 64], "int64", low=1, high=127, sentinel=(-100, 0.25))
    ignored = (labels == -100).float().mean().item()
    assert 0.2 < ignored < 0.3 and labels[labels != -100].min() >= 1 and labels.max() <= 127
    assert template.tensor([5], "bool", fraction_true=1.0).all()
    assert not template.tensor([5], "bool", fraction_true=0.0).any()
    mask = template.tensor([1000], "int64", low=0, high=1, fraction_true=0.9)
    assert set(mask.tolist()) <= {0, 1} and mask.float().mean() > 0.8
    assert template.tensor([], "float32", value=2.5).item() == 2.5
    weights = template.tensor([100], "float32", low=0.5, high=0.75)
    assert 0.5 <= weights.min() and weights.max() <= 0.75


def test_inputs_code_written_from_metadata_builds_those_inputs():
    """The writer's `make_inputs()` body, run against the template: layouts as recorded, indices within bounds."""
    metas = (
        InputMeta(kind="tensor", shape=(2, 16), stride=(16, 1), dtype="torch.int64", device="cpu", min_value=-100,
                  max_value=127, nonnegative_min=4, sentinel=-100, sentinel_fraction=0.0625, storage_size=32),
        InputMeta(kind="tensor", shape=(2, 1, 16, 16), stride=(0, 16, 16, 1), dtype="torch.float32", device="cpu",
                  storage_size=256, min_value=-3.0, max_value=3.0),
        InputMeta(kind="tensor", shape=(32,), stride=(1,), dtype="torch.int64", device="cpu", index_bound=7),
        InputMeta(kind="tensor", shape=(), stride=(), dtype="torch.bool", device="cpu", true_fraction=1.0, value=True),
        InputMeta(kind="int", value=1234567), InputMeta(kind="int", value=None), InputMeta(kind="dtype", value="torch.bfloat16"),
        InputMeta(kind="device", value="cpu"), InputMeta(kind="none"),
    )
    code = repro_inputs.make_inputs_code(metas, ("labels", "cos", "index", "flag", "seed", "offset"))
    namespace = dict(vars(template))
    exec("def make_inputs():\n" + "\n".join("    " + line for line in code.splitlines()), namespace)
    torch.manual_seed(0)
    labels, cos, index, flag, seed, offset, dtype, device, none = namespace["make_inputs"]()
    assert labels.min() >= -100 and labels[labels >= 0].min() >= 4 and labels.max() <= 127
    assert cos.stride() == (0, 16, 16, 1) and -3 <= cos.min() and cos.max() <= 3
    assert 0 <= index.min() and index.max() < 7
    assert flag.dim() == 0 and flag.item() is True
    assert (seed, offset, dtype, device, none) == (1234567, 0, torch.bfloat16, torch.device("cpu"), None)
    assert "# offset: the run's value was not recorded" in code


def test_saved_inputs_come_back_with_their_layouts_dtypes_and_devices(tmp_path):
    base = torch.arange(40.0)
    strided = base[3:].as_strided((4, 3), (1, 4), 5)  # offset, transposed, inside a larger storage
    expanded = torch.arange(3.0).expand(4, 3)
    captured = capture.observe([strided, expanded, 7, torch.float16, torch.device("cpu")])
    capture._add_inputs(captured, [strided, expanded, 7, torch.float16, torch.device("cpu")], max_mb=1)
    (tmp_path / "inputs.pt").write_bytes(repro_inputs.saved_file(captured))
    loaded, outputs = template.load_inputs("inputs.pt", tmp_path / "script.py")
    again, number, dtype, device = loaded[1], loaded[2], loaded[3], loaded[4]
    assert torch.equal(loaded[0], strided) and loaded[0].stride() == (1, 4) and loaded[0].storage_offset() == 5
    assert loaded[0].untyped_storage().nbytes() == base.untyped_storage().nbytes()
    assert torch.equal(again, expanded) and again.stride() == (0, 1)
    assert (number, dtype, device, outputs) == (7, torch.float16, torch.device("cpu"), None)


def test_a_call_is_captured_as_the_run_made_it():
    labels = torch.randint(0, 50, (4, 8))
    labels[0, :2] = -100
    mask = torch.ones(4, 8, dtype=torch.long)
    mask[1, -1] = 0
    rotary = torch.randn(1, 8, 4).expand(3, 8, 4)
    captured = capture.observe([labels, mask, rotary, torch.tensor(True), 42, None, torch.float32])
    metas = captured.metas(wait=True)
    assert (metas[0].sentinel, metas[0].sentinel_fraction, metas[0].nonnegative_min) == (-100, 2 / 32, labels[labels >= 0].min())
    assert metas[1].true_fraction == 31 / 32
    assert metas[2].stride == (0, 4, 1) and metas[2].expanded_dims == (0,) and metas[2].storage_size == 32
    assert (metas[3].value, metas[3].true_fraction) == (True, 1.0)
    assert [(m.kind, m.value) for m in metas[4:]] == [(InputKind.INT, 42), (InputKind.NONE, None),
                                                     (InputKind.DTYPE, "torch.float32")]
    # The records round-trip through the dump's JSON, and a record of an older dump (without these fields) loads.
    assert all(InputMeta.from_json(m.to_json(), "m") == m for m in metas)
    old = {"kind": "tensor", "shape": [2], "stride": [1], "dtype": "torch.float32", "min_value": 0.0, "max_value": 1.0}
    assert InputMeta.from_json(old, "old").storage_size is None


def _main(capsys, build, eager, inputs, **options):
    options.setdefault("backward", False)
    status = template.main(piece="p", executor="test", backend="the backend", build=build, eager=eager,
                           make_inputs=lambda: inputs, argv=[], script="p_repro.py", **options)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("RESULT")]
    return status, lines[-1]


def test_each_kind_of_failure_has_its_exit_status_and_says_so_in_one_line(capsys):
    x = torch.arange(6.0)
    eager = lambda: (lambda t: t * 2)  # noqa: E731
    assert _main(capsys, lambda: (lambda t: t * 2), eager, [x])[0] == 0
    status, line = _main(capsys, lambda: (lambda t: t * 2 + 1), eager, [x])
    assert status == 1 and line.startswith("RESULT MISMATCH (exit 1)") and "worth reporting upstream" in line

    def raises(t):
        raise RuntimeError("the backend fell over")

    status, line = _main(capsys, lambda: raises, eager, [x])
    assert status == 4 and line.startswith("RESULT CRASH (exit 4)") and "fell over" in line
    # Eager refuses the inputs too: they are not valid inputs of the piece, a bug of the rebuild.
    status, line = _main(capsys, lambda: raises, lambda: raises, [x])
    assert status == 3 and line.startswith("RESULT REFUSED (exit 3)") and "input rebuild" in line
    status, line = _main(capsys, lambda: (lambda t: t), eager, [x], refusal=lambda inputs: "input 0 is wrong")
    assert status == 3 and "input 0 is wrong" in line


def test_gradients_flow_back_from_an_input_the_piece_returns_as_it_is(capsys):
    """Eager `dropout(x, 0.0, training=True)` returns x itself (ATen's dropout with p=0), inductor's compiled module a
    tensor of its own autograd node: the input returned as it is carries a gradient back to x all the same (GPT-2's
    embedding-dropout split; the script used to leave it out of eager's backward and said MISMATCH by the incoming
    gradient, 3.73, on CPU and on the H200)."""
    x = torch.randn(6)
    eager = lambda: (lambda t: (t * 2, torch.nn.functional.dropout(t, 0.0, True)))  # noqa: E731
    compiled = lambda: (lambda t: (t * 2, t.clone()))  # noqa: E731
    assert _main(capsys, compiled, eager, [x.requires_grad_()], backward=True)[0] == 0


def test_random_pieces_are_compared_only_where_they_draw_the_same_numbers(capsys):
    x = torch.zeros(1000)
    dropout = lambda: (lambda t: torch.nn.functional.dropout(t + 1, 0.5, True))  # noqa: E731
    other_draw = lambda: (lambda t: (t + 1) * (torch.rand_like(t) < 0.5) * 2)  # noqa: E731
    status, line = _main(capsys, dropout, dropout, [x], random_ops=("dropout",))
    assert status == 0 and "same random numbers as eager" in line
    status, line = _main(capsys, other_draw, dropout, [x], random_ops=("dropout",))
    assert status == 5 and line.startswith("RESULT NOT COMPARABLE (exit 5)") and "dropout" in line


def test_nvfuser_definitions_are_read_and_their_bindings_checked():
    # As nvFuser writes it for a region whose input 0 was the rotary table expanded over the batch (H200).
    definition = (
        "T0 = fd.define_tensor(shape=[4, 16, 8], contiguity=[None, True, True], dtype=DataType.Float, is_cpu=False, "
        "stride_order=[2, 1, 0])\n"
        "S1 = fd.define_scalar(None, dtype=DataType.Int)\n"
        "S2 = fd.define_scalar(2.0, dtype=DataType.Double)\n"
        "T3 = fd.define_tensor(shape=[8, 3], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False, "
        "stride_order=[0, 1])\n"
    )
    declared = repro_inputs.nvfuser_declared_inputs(definition)
    assert [d["kind"] for d in declared] == ["tensor", "scalar", "tensor"]  # the constant 2.0 is no input
    device = "meta"  # stands for the GPU: the definition says is_cpu=False
    dense = torch.randn(4, 16, 8, device=device)
    expanded = torch.randn(1, 16, 8, device=device).expand(4, 16, 8)
    transposed = torch.randn(3, 8, dtype=torch.bfloat16, device=device).t()
    assert template.nvfuser_refusal([expanded, 3, transposed], declared) is None
    assert "is_cpu=False" in template.nvfuser_refusal([torch.zeros(4, 16, 8), 3, transposed], declared)
    assert "dim 0 is expanded" in template.nvfuser_refusal([dense, 3, transposed], declared)
    assert "scalar" in template.nvfuser_refusal([expanded, None, transposed], declared)
    assert "2 inputs" in template.nvfuser_refusal([expanded, 3], declared)
    # A region whose call was not captured takes the layouts the definition declares (stride 0 where expanded).
    metas = (InputMeta(kind="tensor", shape=(4, 16, 8), stride=(128, 8, 1), dtype="torch.float32"),
             InputMeta(kind="int", value=3),
             InputMeta(kind="tensor", shape=(8, 3), stride=(3, 1), dtype="torch.bfloat16"))
    laid_out, relaid = repro_inputs.in_nvfuser_layouts(metas, declared)
    assert [m.stride for m in laid_out] == [(0, 8, 1), (), (1, 8)] and relaid == []
    captured = dataclasses.replace(metas[0], stride=(0, 8, 1), storage_size=128)
    assert repro_inputs.in_nvfuser_layouts((captured, *metas[1:]), declared)[0][0] is captured  # the run's own layout
    assert repro_inputs.in_nvfuser_layouts(metas[:1], declared) == (metas[:1], [])  # does not match: unchanged


# nvFuser's definition of a region whose input came transposed (a [4, 12, 512, 64] attention gradient of GPT-2 laid
# out as [4, 512, 12, 64], H200), and its binding of a tensor rebuilt contiguous: "Found 32768 vs 64".
ATTENTION_INPUT = {"kind": "tensor", "shape": [4, 12, 512, 64], "contiguity": [True, True, True, True],
                   "stride_order": [3, 1, 2, 0], "dtype": "BFloat16", "is_cpu": False}


def test_a_layout_nvfusers_definition_does_not_bind_is_refused_with_the_strides_it_wants():
    transposed = torch.empty(4, 512, 12, 64, dtype=torch.bfloat16, device="meta").transpose(1, 2)
    contiguous = torch.empty(4, 12, 512, 64, dtype=torch.bfloat16, device="meta")
    assert transposed.stride() == (393216, 64, 768, 1)
    assert template.nvfuser_refusal([transposed], [ATTENTION_INPUT]) is None
    why = template.nvfuser_refusal([contiguous], [ATTENTION_INPUT])
    assert "binds strides like (393216, 64, 768, 1): dim 1 has stride 32768, it must be 64" in why, why
    # The other way round: a definition of a contiguous input refuses the transposed tensor (at dim 2).
    dense = dict(ATTENTION_INPUT, stride_order=[])
    assert "dim 2 has stride 768, it must be 64" in template.nvfuser_refusal([transposed], [dense])
    assert template.nvfuser_refusal([contiguous], [dense]) is None
    # Contiguity False: any larger stride; a size-1 dim: any stride.
    gap = {"kind": "tensor", "shape": [3, 1, 4], "contiguity": [False, None, True], "stride_order": [],
           "dtype": "Float", "is_cpu": False}
    assert template.nvfuser_refusal([torch.empty(3, 1, 8, device="meta")[..., :4]], [gap]) is None


def test_a_script_refuses_inputs_its_nvfuser_definition_would_not_bind_before_binding_them(capsys):
    bound = []

    def build():
        return lambda *inputs: bound.append(inputs) or [inputs[0] * 2]

    status, line = _main(capsys, build, lambda: lambda x: [x * 2],
                         [torch.randn(4, 12, 512, 64, dtype=torch.bfloat16)],
                         refusal=lambda inputs: template.nvfuser_refusal(inputs, [dict(ATTENTION_INPUT, is_cpu=True)]))
    assert status == 3 and line.startswith("RESULT REFUSED (exit 3): Refused: input 0 [4, 12, 512, 64]: strides "), line
    assert "dim 1 has stride 32768, it must be 64" in line and not bound


def test_saved_inputs_are_copied_into_the_layout_of_nvfusers_definition():
    contiguous = torch.randn(2, 3, 8, 4)
    (moved,) = template.nvfuser_layouts([contiguous], [dict(ATTENTION_INPUT, shape=[2, 3, 8, 4])])
    assert moved.stride() == (96, 4, 12, 1) and torch.equal(moved, contiguous)
    expanded = {"kind": "tensor", "shape": [4, 16, 8], "contiguity": [None, True, True], "stride_order": [2, 1, 0]}
    dense = torch.randn(4, 16, 8)
    assert template.nvfuser_layouts([dense], [expanded])[0] is dense  # cannot be expanded: nvfuser_refusal says so


def test_the_helpers_of_thunders_torch_executor_are_written_out_where_they_stand_alone():
    from thunderfx_debug.thunder.scripts import helper_code

    code = helper_code("torch_pad_prim_impl", script_support.torch_executor_fn("torch_pad_prim_impl"))
    namespace: dict = {}
    exec(code, namespace)
    padded = namespace["torch_pad_prim_impl"](torch.ones(2), 0.0, [(1, 2, 0)])
    assert padded.tolist() == [0.0, 1.0, 1.0, 0.0, 0.0]
    assert helper_code("x", lambda y: _module_imports(y)) is None  # a free name that is no module or constant
    assert helper_code("x", lambda y: sys.maxsize) == "import sys\nx = lambda y: sys.maxsize"
    assert helper_code("reshape", torch.reshape) == "reshape = torch.reshape"


FAKE_NVFUSER = '''
"""A stand-in for nvfuser_direct on a machine without a GPU: a definition's execute binds its tensor inputs as
nvFuser does (stride 0 where a dim is declared expanded, each contiguous dim's stride as the dims inside it make, in
stride order) and doubles its first input."""
class DataType:
    Float, Int, Double, Bool, BFloat16 = "Float", "Int", "Double", "Bool", "BFloat16"
class FusionDefinition:
    declared = []
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    def define_tensor(self, **kwargs):
        FusionDefinition.declared.append(kwargs)
    def define_scalar(self, *args, **kwargs):
        pass
    def execute(self, inputs, device=None):
        import os
        tensors = [x for x in inputs if hasattr(x, "stride")]
        for i, (x, declared) in enumerate(zip(tensors, FusionDefinition.declared)):
            rank = x.dim()
            order = declared.get("stride_order") or list(range(rank - 1, -1, -1))
            outer_first = sorted(range(rank), key=lambda d: order[d], reverse=True)
            expected = 1
            for dim, contiguous in reversed(list(zip(outer_first, declared["contiguity"]))):
                if contiguous is None:
                    if x.shape[dim] != 1 and x.stride(dim) != 0:
                        raise RuntimeError(f"T{i} has expanded extent but stride {x.stride(dim)}")
                    continue
                if contiguous and x.stride(dim) != expected:
                    raise RuntimeError(f"Expected (stride)==(expected_stride_if_contiguous) . Found {x.stride(dim)} "
                                       f"vs {expected}. T{i}'s stride mismatch with contiguity info")
                expected = x.stride(dim) * x.shape[dim]
        return [inputs[0] * (3 if os.environ.get("FAKE_NVFUSER_WRONG") else 2)]
'''

DEFINITION = """# CUDA devices:
#  0: a stand-in
import torch
from nvfuser_direct import FusionDefinition, DataType
def nvfuser_fusion(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[4, 16, 8], contiguity=[None, True, True], dtype=DataType.Float, is_cpu=True, stride_order=[2, 1, 0])
    S1 = fd.define_scalar(None, dtype=DataType.Int)
with FusionDefinition() as fd:
    nvfuser_fusion(fd)
"""

# A region of GPT-2's attention backward as nvFuser compiled it on the H200: its input came transposed.
ATTENTION_DEFINITION = DEFINITION.replace(
    "T0 = fd.define_tensor(shape=[4, 16, 8], contiguity=[None, True, True], dtype=DataType.Float, is_cpu=True, "
    "stride_order=[2, 1, 0])",
    "T0 = fd.define_tensor(shape=[2, 3, 8, 4], contiguity=[True, True, True, True], dtype=DataType.Float, "
    "is_cpu=True, stride_order=[3, 1, 2, 0])")


@pytest.mark.parametrize("case", ["captured", "from_definition", "wrong_values", "relaid", "relaid_real", "refused"])
def test_an_nvfuser_script_checks_binds_and_judges_its_region(tmp_path, case):
    """The nvFuser script's own plumbing, with a stand-in nvFuser that binds as nvFuser does: its definition is built,
    the inputs (the rotary table, expanded over the batch in the run, or a transposed attention input; the philox
    seed) laid out as it declares and checked against it, executed, and compared with the region's torch code."""
    from thunderfx_debug.artifacts.repro import writers
    from thunderfx_debug.children.standalone import run_script
    from thunderfx_debug.recording.capture import InputCapture
    from thunderfx_debug.settings.safety import ReportingFailures

    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "nvfuser_direct.py").write_text(FAKE_NVFUSER)
    definition = DEFINITION
    table = InputMeta(kind="tensor", shape=(4, 16, 8), stride=(0, 8, 1), storage_size=128, dtype="torch.float32",
                      device="cpu", min_value=-1.0, max_value=1.0)
    if case == "from_definition":  # not captured: the layout comes from the definition
        table = dataclasses.replace(table, stride=(128, 8, 1), storage_size=None)
    if case.startswith("relaid"):  # captured contiguous by the region's first call; the definition is of a
        definition = ATTENTION_DEFINITION  # later, transposed call
        table = dataclasses.replace(table, shape=(2, 3, 8, 4), stride=(96, 32, 4, 1), storage_size=192)
    seed = InputMeta(kind="int", value=1234)
    piece = writers.ReproSubject(
        key="graph0/thunder_0/nvFusion0_forward", title="forward fusion region nvFusion0 (nvfuser)", description="-",
        definitions="def nvFusion0(cos, seed):\n    return (cos * 2,)", callable_name="nvFusion0", is_module=False,
        metas=(table, seed), names=("cos", "seed"), backward=False)
    if case in ("relaid_real", "refused"):  # the run's values saved: dense where the definition expands (refused)
        state = types.SimpleNamespace(name="nvFusion0_forward", captured=None)
        InputCapture(real=True, max_mb=1, failures=ReportingFailures(strict=True)).inputs(
            state, [torch.randn(*table.shape), 1234])
        piece.captured, piece.inputs_path = state.captured, "graph0/graph0_thunder_0/fusions/inputs/in.pt"
        (tmp_path / "inputs").mkdir()
        (tmp_path / "inputs" / "in.pt").write_bytes(repro_inputs.saved_file(state.captured))
    path = "graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion0_forward_repro_nvfuser.py"
    script = tmp_path / "graph0_thunder_0_nvFusion0_forward_repro_nvfuser.py"
    script.write_text(writers.render(piece, writers.NvFuserRegion(definition), path, "test"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake"), "FAKE_NVFUSER_WRONG": "1" if case == "wrong_values" else ""}
    run = run_script(script, env=env)
    expected = {"captured": "OK", "from_definition": "OK", "wrong_values": "MISMATCH", "relaid": "OK",
                "relaid_real": "OK", "refused": "REFUSED"}[case]
    assert run.outcome == expected, run.stdout + run.stderr[-2000:]
    if case == "relaid":  # the script rebuilds the layout of the definition it runs, and says why
        text = script.read_text()
        assert "tensor([2, 3, 8, 4], 'float32', stride=[96, 4, 12, 1]," in text
        assert "cos: laid out as nvFuser's definition declares" in " ".join(text.split())
    if case == "relaid_real":
        assert "input 0: copied from strides (96, 32, 4, 1) into (96, 4, 12, 1)" in run.stdout
    if case == "refused":
        assert "dim 0 is expanded in nvFuser's definition" in run.result_line
