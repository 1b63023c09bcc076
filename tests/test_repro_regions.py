"""Fusion regions as their scripts rebuild them: a dropout region's philox seed and offset (numbers Thunder knows at
run time) reach philox_rand as the tensors it takes; a backward region fed gradients laid out transposed (as an
attention kernel outside the regions returns them) gets inputs with the run's strides in its script, which then
passes (`thunderfx-debug verify`).
"""

from __future__ import annotations

import json
import types

import pytest
import torch

from conftest import cpu_executors


def _dropout_region(device: str = "cuda:0", executor: str = "torchcompile", dtype: str = "float32",
                    shape: tuple[int, ...] = (4, 8)):
    """A region as Thunder's rematerialisation leaves a dropout on CUDA: `uniform_philox` whose seed and offset are
    region inputs (IntegerProxy, known at run time), and the mask applied. Built on Thunder's own prims; the region's
    symbol names its executor (a TorchCompile region's, or an nvFusion region's)."""
    import thunder.torch as ltorch
    from thunder.core import devices, dtypes, prims
    from thunder.core.proxies import IntegerProxy, TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    trace = TraceCtx()
    with tracectx(trace):
        x = TensorProxy("x", shape=shape, device=devices.Device(device), dtype=getattr(dtypes, dtype))
        seed, offset = IntegerProxy("i194", value=None), IntegerProxy("i195", value=None)
        draws = prims.uniform_philox(shape, 0.0, 1.0, device=devices.Device(device), dtype=getattr(dtypes, dtype),
                                     seed=seed, offset=offset)
        kept = prims.lt(draws, 0.9)
        y = ltorch.mul(ltorch.mul(x, kept), 1 / 0.9)
    sym = types.SimpleNamespace(executor=types.SimpleNamespace(name=executor), name="nvFusion0", is_fusion=True)
    return types.SimpleNamespace(flat_args=[seed, offset, x], flat_outs=[y], subsymbols=list(trace.bound_symbols),
                                 sym=sym)


def _lowered(region, draws: str = "nvfuser"):
    from thunderfx_debug.thunder.scripts import region_torch_function

    source, ctx = region_torch_function(region, "nvFusion0", draws=draws)
    namespace = dict(ctx)
    exec(compile(source, "<region>", "exec"), namespace)
    return source, namespace["nvFusion0"]


def test_a_dropout_regions_philox_seed_and_offset_reach_philox_rand_as_tensors(monkeypatch):
    """On the H200 every script of a dropout region said REFUSED: "rngprims::philox_rand() Expected a value of type
    'Tensor' for argument 'seed' but instead found type 'int'". The region is called with the seed and offset as the
    run passed them (ints); philox_rand cannot run on CPU, so it is called under FakeTensorMode (its schema and meta
    kernel) and swapped for a recorder (the values it gets). The offset reaches it as CUDA's generator counts it: 4
    times Thunder's, which is nvFuser's (on the H200, Thunder's own, 8, said "offset must be a multiple of 4")."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    source, region = _lowered(_dropout_region())
    assert "philox_rand" in source
    with FakeTensorMode():
        (out,) = region(1234, 8, torch.empty(4, 8, device="cuda:0"))
    assert out.shape == (4, 8)
    calls = []

    def recorder(shape, *, seed, offset, stride, device, dtype):
        calls.append((seed, offset, device))
        return torch.full(tuple(shape), 0.5, dtype=dtype), torch.tensor(4)

    monkeypatch.setattr(torch.ops.rngprims, "philox_rand", recorder)
    x = torch.randn(4, 8)
    (out,) = region(1234, 8, x)
    ((seed, offset, device),) = calls
    assert isinstance(seed, torch.Tensor) and isinstance(offset, torch.Tensor)
    assert (seed.dtype, seed.device, seed.item(), offset.dtype, offset.device, offset.item()) == (
        torch.int64, torch.device("cpu"), 1234, torch.int64, torch.device("cpu"), 4 * 8)
    assert device == torch.device("cuda:0")
    torch.testing.assert_close(out, x / 0.9)


def test_an_nvfusion_regions_dropout_is_lowered_to_nvfusers_draws_which_run_on_any_device():
    """nvFuser draws `uniform_philox` otherwise than philox_rand (tests/test_philox_draws.py): an nvFusion region's
    torch code draws with `nvfuser_uniform` from the seed and offset it is called with (nvFuser's offset, as
    Thunder passes it), on the device of its inputs, and its random ops count as reproduced."""
    from thunderfx_debug.scripts.philox_draws import nvfuser_uniform
    from thunderfx_debug.thunder.scripts import region_random_ops

    region_bsym = _dropout_region("cpu", executor="nvfuser")
    source, region = _lowered(region_bsym)
    assert "nvfuser_uniform(" in source and "philox_rand" not in source
    x = torch.randn(4, 8)
    (out,) = region(-(2**62) - 11, 7, x)
    drawn = nvfuser_uniform((4, 8), -(2**62) - 11, 7)
    assert torch.equal(out, x * (drawn < 0.9) * (1 / 0.9))
    assert region_random_ops(region_bsym) == ("uniform_philox",)
    assert region_random_ops(region_bsym, unreproduced=True) == ()
    assert region_random_ops(_dropout_region("cpu"), unreproduced=True) == ("uniform_philox",)


def test_an_nvfusion_regions_bfloat16_mask_compares_its_draws_in_float32_as_nvfuser_does():
    """On the H100 every dropout region of GPT-2 and T5 in bfloat16 was a MISMATCH, in the sentinel and in its
    scripts: nvFuser keeps a draw of 0.8984375 (bfloat16's nearest to 0.9) where `u < 0.9`, comparing in float32;
    torch's `lt` casts 0.9 to bfloat16 first and drops it. The reference compares as nvFuser does."""
    from thunderfx_debug.scripts.philox_draws import nvfuser_uniform

    shape, bf16_point_nine = (64, 64), torch.tensor(0.9, dtype=torch.bfloat16)
    seed, offset = 5, next(o for o in range(100)
                           if (nvfuser_uniform(shape, 5, o, torch.bfloat16) == bf16_point_nine).any())
    drawn = nvfuser_uniform(shape, seed, offset, torch.bfloat16)
    on_the_edge = drawn == bf16_point_nine
    assert not torch.lt(drawn, 0.9)[on_the_edge].any()  # torch's own comparison drops them
    source, region = _lowered(_dropout_region("cpu", executor="nvfuser", dtype="bfloat16", shape=shape))
    assert "compared_in_float32(" in source
    x = torch.ones(shape, dtype=torch.bfloat16)
    (out,) = region(seed, offset, x)
    assert (out[on_the_edge] != 0).all()
    assert torch.equal(out, x * (drawn.float() < 0.9) * (1 / 0.9))


def test_an_nvfusion_regions_inductor_script_draws_nvfusers_numbers_through_an_op_torch_compile_leaves_as_it_is(
        tmp_path):
    """The inductor script of a dropout region compares it too: its function draws through the custom op that
    `define_nvfuser_uniform_op` defines, which torch.compile (fullgraph) calls as it is; compiled, it computes what
    the eager reference computes, in a fresh interpreter without the package."""
    from thunderfx_debug.artifacts.repro.writers import context_assignments, inlined_source
    from thunderfx_debug.artifacts.repro import script_template
    from thunderfx_debug.thunder.scripts import region_helpers, region_torch_function

    region = _dropout_region("cpu", executor="nvfuser", dtype="bfloat16", shape=(64, 64))
    source, ctx = region_torch_function(region, "nvFusion0", draws="nvfuser_opaque")
    assert "nvfuser_uniform_opaque(" in source
    lines, needs_thunder = context_assignments(source, ctx, region_helpers(ctx))
    assert not needs_thunder and not any("thunderfx_debug" in line for line in lines), lines
    check = ("define_nvfuser_uniform_op()\n"
             "x = torch.randn(64, 64, dtype=torch.bfloat16)\n"
             "compiled = torch.compile(nvFusion0, fullgraph=True)(5, 7, x)[0]\n"
             "reference = x * (nvfuser_uniform((64, 64), 5, 7, torch.bfloat16).float() < 0.9) * (1 / 0.9)\n"
             "print(bool(torch.equal(nvFusion0(5, 7, x)[0], reference)), bool(torch.equal(compiled, reference)))\n")
    script = tmp_path / "region.py"
    script.write_text("import sys\nsys.modules['thunderfx_debug'] = None\n" + inlined_source(script_template)
                      + "\n".join(lines) + "\n" + source + "\n" + check)
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"})
    assert done.stdout.strip().endswith("True True"), done.stdout[-2000:] + done.stderr[-3000:]


def test_an_nvfusion_regions_script_carries_nvfusers_draws_and_needs_nothing_of_thunderfx_debug(tmp_path):
    """The names the lowered code uses, written for a script: `nvfuser_uniform` is the one the script carries
    (inlined from scripts/philox_draws.py), not an import of the package."""
    from thunderfx_debug.artifacts.repro.writers import context_assignments, inlined_source
    from thunderfx_debug.artifacts.repro import script_template
    from thunderfx_debug.thunder.scripts import region_helpers, region_torch_function

    source, ctx = region_torch_function(_dropout_region("cpu", executor="nvfuser"), "nvFusion0")
    lines, needs_thunder = context_assignments(source, ctx, region_helpers(ctx))
    assert not any("thunderfx_debug" in line for line in lines), lines
    assert "def nvfuser_uniform(" in inlined_source(script_template)
    script = tmp_path / "region.py"
    check = ("x = torch.ones(4, 8)\n"
             "print(bool(torch.equal(nvFusion0(3, 5, x)[0], x * (nvfuser_uniform((4, 8), 3, 5) < 0.9) / 0.9)))\n")
    script.write_text("import sys\nsys.modules['thunderfx_debug'] = None\n" + inlined_source(script_template)
                      + "\n".join(lines) + "\n" + source + "\n" + check)
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().endswith("True"), done.stderr[-3000:]


@pytest.mark.cuda
def test_a_dropout_regions_lowering_draws_what_philox_rand_draws_on_cuda():
    """On CUDA the lowered region runs: its draws are philox_rand's for the run's seed and offset, i.e. torch.rand
    after the CUDA generator was set to that state (philox_rand's definition), the offset as the generator counts it
    (4 times Thunder's, nvFuser's count; Thunder's 7 as it is raised "offset must be a multiple of 4")."""
    _, region = _lowered(_dropout_region())
    x = torch.ones(4, 8, device="cuda")
    (out,) = region(1234, 7, x)
    with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
        state = torch.cat([torch.tensor([1234]).view(torch.uint8), torch.tensor([4 * 7]).view(torch.uint8)])
        torch.cuda.set_rng_state(state)
        draws = torch.rand(4, 8, device="cuda")
    torch.testing.assert_close(out, (draws < 0.9).float() / 0.9)


def _sdpa_like_executor():
    """A Thunder executor running attention outside the fusion regions, as Thunder's sdpa executor does on CUDA:
    forward and backward as ops of their own, the gradients laid out as [B, S, H, D] and seen as [B, H, S, D] (the
    layout of efficient attention's outputs, the transposed input of GPT-2's attention backward region)."""
    import thunder
    import thunder.torch as ltorch
    from thunder.core.transforms import get_grad, put_grads
    from thunder.extend import OperatorExecutor, get_executor, register_executor

    name = "test_cpu_sdpa_like"
    if get_executor(name) is not None:
        return get_executor(name)
    executor = register_executor(OperatorExecutor(name))

    def transposed(t):
        b, h, s, d = t.shape
        return torch.empty(b, s, h, d, dtype=t.dtype).transpose(1, 2).copy_(t)

    def backward(g, q, k, v):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            grads = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v), (q, k, v), g)
        return tuple(transposed(t) for t in grads)

    fwd = executor.register_operator(
        "sdpa_like_fwd", meta=lambda q, k, v: thunder.TensorProxy(like=q),
        fn=lambda q, k, v: transposed(torch.nn.functional.scaled_dot_product_attention(q, k, v)))
    bwd = executor.register_operator(
        "sdpa_like_bwd", fn=backward,
        meta=lambda g, q, k, v: tuple(thunder.TensorProxy(like=t) for t in (q, k, v)))

    def plain(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
        return attn_mask is None and dropout_p == 0.0 and not is_causal and scale is None

    def grad(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
        out = fwd(q, k, v)
        put_grads((q, k, v), bwd(get_grad(out), q, k, v))
        return out

    executor.register_implementation(ltorch.scaled_dot_product_attention, checker=plain,
                                     execution_transform=lambda q, k, v, *a, **kw: fwd(q, k, v), grad_transform=grad)
    return executor


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(12, 36)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = (t.view(batch, seq, 3, 4).transpose(1, 2) for t in self.qkv(x).split(12, dim=2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return (y.transpose(1, 2).reshape(batch, seq, 12) * 2).sum()


def test_a_backward_region_fed_transposed_gradients_is_rebuilt_with_the_runs_strides(tmp_path, capsys):
    from thunderfx_debug import ReportingBackend, load_report
    from thunderfx_debug.commands.cli import main

    backend = ReportingBackend(dump_dir=tmp_path, repro="fusion", strict=True,
                               executors=[_sdpa_like_executor(), *cpu_executors()])
    compiled = torch.compile(_Attention(), backend=backend)
    for _ in range(2):
        compiled(torch.randn(2, 8, 12)).backward()
    rank_dir = backend.flush()
    (split,) = load_report(rank_dir).graphs[0].splits
    fed = [f for f in split.fusions if f.phase.value == "backward" and len(f.input_meta) == 4]
    (region,) = fed  # takes the three gradients of the attention op and the layer's input
    script = (rank_dir / region.files["repro_inductor"]).read_text()
    # [2, 3, 8, 4] allocated as [2, 8, 3, 4]: the run's strides, exactly.
    assert script.count("tensor([2, 3, 8, 4], 'float32', stride=[96, 4, 12, 1],") == 3, script[-1500:]
    status = main(["verify", str(tmp_path), "--only", "*fusions*", "--no-progress"])
    capsys.readouterr()
    verdicts = {e["path"].rsplit("/", 1)[-1]: e["verdict"] for e in json.loads((tmp_path / "verify.json").read_text())["scripts"]}
    assert status == 0 and len(verdicts) == len(split.fusions) and set(verdicts.values()) == {"OK"}, verdicts


#: nvFuser's printed definition of the T5 encoder's first region on the H100 (its relative-position buckets; lines of
#: `graph0_thunder_2_nvFusion0_forward_repro_nvfuser.py`, the zoo's T5 at realistic size): the constants as nvFuser's
#: printer writes them, with 6 significant digits.
T5_BUCKETS_PRINTED = """\
        tv54 = fd.ops.cast(tv51, dtype=DataType.Float)
        c240 = fd.ops.reciprocal(8.00000)
        tv55 = fd.ops.mul(tv54, c240)
        tv59 = fd.ops.log(tv55)
        c280 = fd.ops.reciprocal(2.77259)
        tv61 = fd.ops.mul(tv59, c280)
        tv64 = fd.ops.mul(tv61, 8.00000)
        tv57 = fd.ops.mul(tv46, 1.11111)
"""


def _t5_buckets(relative_position, p=0.1):
    """Hugging Face T5's bidirectional bucket of a relative position, its large branch (max_exact 8, max_distance
    128, 32 buckets), beside a dropout: the ops of the region above."""
    import math

    n = relative_position.abs()
    large = 8 + (torch.log(n.float() / 8) / math.log(128 / 8) * (16 - 8)).to(torch.long)
    return large, torch.nn.functional.dropout(n.float(), p)


def test_an_nvfuser_definitions_float_constants_are_written_as_the_runs_trace_has_them():
    """On the H100, the T5 region's nvFuser script said MISMATCH (an int64 output off by one) where the run's
    sentinel had found the region right: nvFuser's printer wrote log(16) as 2.77259, and `log(n / 8) / log(16) * 8`
    truncated to an integer then falls short of the exact -6, -4 and -2 (n = 1, 2, 4). The script's definition takes
    the constants of the region's trace instead."""
    import thunder

    from thunderfx_debug.thunder.scripts import region_floats, with_exact_floats

    jitted = thunder.jit(_t5_buckets, executors=cpu_executors())
    jitted(torch.arange(-20, 20))
    regions = [b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.is_fusion]
    exact = set().union(*(region_floats(region) for region in regions))
    assert {2.772588722239781, 1 / 0.9} <= exact
    restored = with_exact_floats(T5_BUCKETS_PRINTED, exact)
    assert "fd.ops.reciprocal(2.772588722239781)" in restored and "fd.ops.mul(tv46, 1.1111111111111112)" in restored
    assert "fd.ops.reciprocal(8.00000)" in restored and "fd.ops.mul(tv61, 8.00000)" in restored  # exact as printed
    assert restored.splitlines()[0] == (
        "# float constants as the run's trace has them (nvFuser's printer writes 6 significant digits): "
        "2.77259 -> 2.772588722239781, 1.11111 -> 1.1111111111111112")

    # What the printed constant does in float32, as the region computes: the buckets of 1, 2 and 4 move by one.
    n = torch.arange(1, 9).float()

    def buckets(log16):
        return (8 + (torch.log(n * (1 / 8.0)) * torch.tensor(1 / log16) * 8.0).to(torch.long)).tolist()

    assert buckets(2.772588722239781) == [2, 4, 6, 6, 7, 8, 8, 8]
    assert buckets(2.77259) == [3, 5, 6, 7, 7, 8, 8, 8]
