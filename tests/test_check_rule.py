"""One judging rule for the correctness sentinel and the repro scripts, and its float64 yardstick: the rule is one
module (`scripts/judging_rule.py`) that the sentinel imports and every script carries as text, and a written script
judges by it where thunderfx_debug cannot be imported; the sentinel and a script give the same verdict on the same
numbers; `Float64Mode` widens every conversion to a floating dtype, so that roundings a piece asks for count as eager's
own noise. A RoPE-like region compiled by inductor is judged, and the verdict checked against a float64 computation
done outside the package."""

from __future__ import annotations

import math

import pytest
import torch
import written_script

from thunderfx_debug.artifacts.repro import script_template as template
from thunderfx_debug.children.standalone import run_script
from thunderfx_debug.recording import compare
from thunderfx_debug.scripts import judging_rule

#: The rule as a written repro script defines it, from its own text.
SCRIPT = written_script.namespace()


@pytest.mark.parametrize("factor, outcome", [(1.0, "OK"), (1 + 1e-3, "MISMATCH")], ids=["exact", "0.1% off"])
def test_a_written_script_judges_by_the_rule_it_carries_where_the_package_cannot_be_imported(tmp_path, factor,
                                                                                              outcome):
    """No copy to hold equal: a script defines the rule from its own text, and run in a fresh interpreter where
    thunderfx_debug cannot be imported, it judges a backend as the sentinel does."""
    assert SCRIPT.verdict.__code__.co_filename == written_script.FILE_NAME
    assert judging_rule.TOLERANCES == SCRIPT.TOLERANCES and judging_rule.NOISE_SLACK == SCRIPT.NOISE_SLACK
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64, torch.bool):
        assert judging_rule.tolerance(dtype) == SCRIPT.tolerance(dtype)
    run = run_script(written_script.write(tmp_path, written_script.Scaled(factor)))
    assert run.outcome == outcome, run.stdout + run.stderr[-2000:]
    x = torch.linspace(-1, 1, 64)
    (judged,) = compare.judge(["out 0"], [x * 2 * factor], [x * 2], lambda: [x.double() * 2])
    assert judged.mismatch == (outcome == "MISMATCH")


def _cases():
    """(actual, eager, float64) triples on which the two rules used to disagree, and some on which they agreed."""
    torch.manual_seed(0)
    gradient = torch.randn(256, dtype=torch.float64) * 1e-3  # a bf16 model's gradient: values ~1e-3
    eager = gradient.to(torch.bfloat16)
    yield "a bf16 gradient 30% off", (gradient * 1.3).to(torch.bfloat16), eager, gradient
    yield "a bf16 gradient within rounding", (gradient * (1 + 2 ** -9)).to(torch.bfloat16), eager, gradient
    values = torch.randn(4096, dtype=torch.float64)
    few_wrong = values.clone()
    few_wrong[:20] += 0.05  # a few elements corrupted: the maximum sees them, an RMS hardly does
    yield "a few float32 elements corrupted", few_wrong.float(), values.float(), values
    yield "float32 rounding", (values * (1 + 1e-7)).float(), values.float(), values
    rounded = values.to(torch.bfloat16).float()  # eager rounds to bf16 inside, the compiled piece does not
    yield "float32 outputs of a bf16 rounding skipped", values.float(), rounded, values
    yield "integers", torch.arange(5), torch.arange(5) + torch.tensor([0, 0, 1, 0, 0]), None


@pytest.mark.parametrize("case", list(_cases()), ids=lambda case: case[0])
def test_the_sentinel_and_a_script_give_one_verdict_on_the_same_numbers(case):
    _, actual, eager, float64 = case
    (judged,) = compare.judge(["value"], [actual], [eager], (lambda: [float64]) if float64 is not None else None)
    _, script_ratio = SCRIPT.judge(actual, eager, eager, float64)
    assert judged.mismatch == (script_ratio > 1)
    assert script_ratio == pytest.approx(judged.ratio, rel=1e-3) or math.isinf(judged.ratio) == math.isinf(script_ratio)


def test_the_rule_flags_what_it_must_and_passes_rounding():
    verdicts = {}
    for name, actual, eager, float64 in _cases():
        (judged,) = compare.judge([name], [actual], [eager], (lambda f=float64: [f]) if float64 is not None else None)
        verdicts[name] = judged.mismatch
    assert verdicts == {"a bf16 gradient 30% off": True, "a bf16 gradient within rounding": False,
                        "a few float32 elements corrupted": True, "float32 rounding": False,
                        "float32 outputs of a bf16 rounding skipped": False, "integers": True}


def test_a_value_that_is_zero_but_for_rounding_is_judged_against_the_pieces_precision(capsys):
    """As in BERT's backward fusion region on CPU: the gradient of a bias before a LayerNorm is 0 but for rounding
    (~1e-13 beside gradients ~0.4), and inductor's rounding of it is a few times eager's. That is noise either way;
    a bf16 gradient 30% off beside a larger one is still a mismatch."""
    torch.manual_seed(0)
    large = torch.randn(64, dtype=torch.float64) * 0.2
    zero_f64 = torch.zeros(32, dtype=torch.float64)
    eager_noise, compiled_noise = torch.randn(32) * 5e-14, torch.randn(32) * 2e-13
    actual, eager, float64 = [large.float(), compiled_noise], [large.float(), eager_noise], [large, zero_f64]
    judged = compare.judge(["large", "zero"], actual, eager, lambda: float64)
    assert [j.mismatch for j in judged] == [False, False] and judged[1].reference == "float64 eager"
    assert SCRIPT.compare("gradients", actual, eager, eager, float64)
    no_floor, _, _ = SCRIPT.verdict(judged[1].abs_error, 5e-14, 1e-4, 1e-4, own=float(compiled_noise.abs().max()),
                                    noise=float(eager_noise.abs().max()))
    assert no_floor > 1  # without the floor: a false mismatch
    gradient = torch.randn(256, dtype=torch.float64) * 1e-3
    wrong = [(large * 10).to(torch.bfloat16), (gradient * 1.3).to(torch.bfloat16)]
    eager = [(large * 10).to(torch.bfloat16), gradient.to(torch.bfloat16)]
    judged = compare.judge(["large", "small"], wrong, eager, lambda: [large * 10, gradient])
    assert [j.mismatch for j in judged] == [False, True]
    assert not SCRIPT.compare("gradients", wrong, eager, eager, [large * 10, gradient])


def test_a_value_below_one_rounding_unit_of_its_piece_is_noise_however_close_eager_came_to_float64():
    """As in BERT's forward fusion region on an AMD EPYC CPU: an output whose float64 value is ~1e-12 beside
    outputs ~0.2, where eager's float32 error was a third of that magnitude and inductor's twice it. Both are far
    below float32's precision at the piece's scale (~1e-8, computed here outside the package): no mismatch. A small
    value that eager computes well, 30 % off, is still one."""
    torch.manual_seed(0)
    large = torch.randn(64, dtype=torch.float64) * 0.2
    tiny = torch.randn(32, dtype=torch.float64) * 1e-12  # zero but for rounding, not exactly zero
    eager_tiny = (tiny + tiny.abs().max() * 0.3).float()  # a third of the value's size off float64
    compiled_tiny = (tiny + tiny.abs().max() * 2 * torch.randn(32, dtype=torch.float64)).float()
    assert tiny.abs().max() < torch.finfo(torch.float32).eps * large.abs().max()  # below one unit: noise
    actual, eager, float64 = [large.float(), compiled_tiny], [large.float(), eager_tiny], [large, tiny]
    judged = compare.judge(["large", "tiny"], actual, eager, lambda: float64)
    assert [j.mismatch for j in judged] == [False, False] and judged[1].reference == "float64 eager"
    assert SCRIPT.compare("outputs", actual, eager, eager, float64)
    error, noise = float((compiled_tiny.double() - tiny).abs().max()), float((eager_tiny.double() - tiny).abs().max())
    scale = float(eager_tiny.abs().max())
    assert 2 * noise < scale  # eager came closer than half the value's size, where the floor used to begin
    assert SCRIPT.verdict(error, scale, 1e-4, 1e-4, own=error, noise=noise)[0] > 1  # without the floor: a mismatch
    small = torch.randn(32, dtype=torch.float64) * 1e-3  # a small value float32 computes well: its own tolerance
    judged = compare.judge(["large", "small"], [large.float(), (small * 1.3).float()], [large.float(), small.float()],
                           lambda: [large, small])
    assert [j.mismatch for j in judged] == [False, True]


# ---- the float64 yardstick ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [judging_rule.Float64Mode, SCRIPT.Float64Mode], ids=["sentinel", "script"])
def test_float64_mode_widens_every_conversion_to_a_floating_dtype(mode):
    positions = torch.arange(8)[None, :]  # int64, as Hugging Face's rotary embedding gets them
    flags = torch.tensor([True, False])
    with mode():
        widened = [positions.float(), positions.half(), positions.bfloat16(), flags.float(),
                   positions.to(torch.float32), positions.to(dtype=torch.bfloat16), positions.type(torch.float16),
                   positions.type("torch.FloatTensor"), torch.zeros(2), torch.tensor([0.1]), torch.arange(3.0),
                   torch.full((2,), 0.5), torch.ones(2, dtype=torch.float16), torch.linspace(0, 1, 3)]
        with torch.autocast("cpu", dtype=torch.bfloat16):  # entered in the code: off under the mode
            product = torch.ones(2, 2, dtype=torch.float64) @ torch.ones(2, 2, dtype=torch.float64)
        integers = [positions.long(), torch.arange(3), positions.to(torch.int32)]
        # the failure on the H200: a float64 buffer times float32 positions
        inv_freq = torch.rand(4, dtype=torch.float64)[None, :, None].float()
        rotary = inv_freq @ positions.float()[:, None, :]
    assert [t.dtype for t in widened] == [torch.float64] * len(widened)
    assert torch.tensor([0.1]).double().item() != widened[9].item() == 0.1  # made as float64, not rounded first
    assert product.dtype is torch.float64
    assert [t.dtype for t in integers] == [torch.int64, torch.int64, torch.int32]
    assert rotary.dtype is torch.float64
    assert torch.zeros(2).dtype is torch.float32  # outside the mode, nothing changed


def test_the_float64_run_of_hugging_faces_rotary_embedding_is_float64_throughout():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=512))
    x = torch.randn(1, 16, 64, dtype=torch.bfloat16)
    with judging_rule.Float64Mode():
        cos, sin = rotary(judging_rule.to_float64([x])[0], torch.arange(16)[None, :])
    assert cos.dtype is sin.dtype is torch.float64
    exact = torch.arange(16, dtype=torch.float64)[:, None] * rotary.inv_freq.double()[None, :]
    assert torch.allclose(cos[0, :, :16], exact.cos(), atol=1e-12)


# ---- a RoPE region compiled by inductor, judged, and the verdict checked independently -------------------------------

def _rope(freqs, x):
    """Llama's rotary embedding as nvFuser fuses it on the H200 (graph0/thunder_2/nvFusion1_forward): cos and sin of
    float32 frequencies up to 511 rad, rounded to bf16 and returned as float32, and the rotation of x in bf16."""
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return cos.float(), sin.float(), x * cos + rotated * sin


def _rope_inputs():
    torch.manual_seed(0)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
    return [torch.arange(512)[:, None].float() * inv_freq[None, :], torch.randn(2, 512, 64, dtype=torch.bfloat16)]


def test_inductors_rope_region_is_judged_right_where_it_skips_a_bf16_rounding(capsys):
    """Inductor keeps cos and sin in float32 where the region rounds them to bf16 and back (it does not emulate
    precision casts by default), so its float32 outputs differ from eager's by up to half a bf16 ulp, ~20 times what
    float32's tolerance allows against eager. A float64 computation of the same values outside the package shows
    inductor's values are closer to the true ones than eager's: the tolerance was wrong, not inductor, wherever the
    yardstick kept the bf16 rounding (a float64 run on widened inputs only, as the scripts had: it then agrees with
    eager and measures no noise). With the rounding widened too (`Float64Mode`), eager's rounding is its noise and the
    verdict is OK; a region that computes cos wrongly is still a MISMATCH."""
    inputs = _rope_inputs()
    compiled = torch.compile(_rope, backend="inductor")
    outputs = [o.detach() for o in compiled(*inputs)]
    eager = _rope(*inputs)
    # independent: the exact values of the float32 frequencies' cosines, in float64, outside the package
    exact = torch.cat((inputs[0], inputs[0]), dim=-1).double().cos()
    inductor_error = float((outputs[0].double() - exact).abs().max())
    eager_error = float((eager[0].double() - exact).abs().max())
    assert inductor_error < 1e-6 < 1e-3 < eager_error <= 2 ** -9 + 1e-6  # float32's rounding; half a bf16 ulp
    error, scale = template._difference(outputs[0], eager[0])
    against_eager, _, _ = template.verdict(error, scale, *template.tolerance(torch.float32))
    assert against_eager > 9  # 9.8: what the H200's script said of this region ("9.8 of what is allowed")
    kept_rounding = _rope(inputs[0].double(), inputs[1])
    assert (kept_rounding[0] == eager[0]).double().mean() > 0.999  # that yardstick sees no noise in eager
    verdict = template.check(lambda *a: compiled(*a), lambda: _rope, inputs, None, False, backward=False)
    assert verdict.outcome is template.Outcome.OK, capsys.readouterr().out

    def wrong(freqs, x):  # cos off by a phase of 0.01: beyond any rounding
        cos, sin, rotated = _rope(freqs, x)
        return (torch.cos(torch.cat((freqs, freqs), dim=-1) + 0.01), sin, rotated)

    assert float((wrong(*inputs)[0].double() - exact).abs().max()) > 2 * eager_error
    verdict = template.check(wrong, lambda: _rope, inputs, None, False, backward=False)
    assert verdict.outcome is template.Outcome.MISMATCH
