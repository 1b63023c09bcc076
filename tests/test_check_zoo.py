"""The correctness sentinel on Hugging Face models of the zoo (benchmarks/harness.py, tiny, CPU), with real Thunder runs:
its float64 reference runs on the FX graphs of the decoder splits in bf16 in float64 throughout (Llama, GPT-NeoX), and
training with every call checked at `fusion` is bit-identical to training with the check off (Llama in bf16 with every
value sent to the float64 round, GPT-2 and BERT in float32), while the check compares something.

Each training here is a compile of a Hugging Face model (20 to 40 s on a CI's 2 cores), so each model is trained
where it proves something the others do not: Phi3's conversions (RMSNorm's `.to(float32)`, the rotary's `.float()`
of position ids and its concatenation with the part it passes through) are Llama's and GPT-NeoX's, so Phi3 (trained
here until the suite had to fit CI's 15 minutes) is left out."""

from __future__ import annotations

import harness_path  # noqa: F401  (benchmarks/ on sys.path)
import harness
import pytest
import torch
from torch.utils._pytree import tree_leaves

from thunderfx_debug import ReportingBackend
from thunderfx_debug.records import SplitKind
from thunderfx_debug.recording import compare, region_check, split_check

STEPS = 3


def _train(name: str, dtype: str, **options):
    torch._dynamo.reset()
    model, batch = harness.build(name, "tiny", "cpu", dtype)
    backend = ReportingBackend(strict=True, **harness.thunder_options("cpu"), **options)
    losses = harness.train(model, batch, backend, steps=STEPS)
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()], backend


def _beyond_eager(judge):
    """The sentinel's `judge` with Thunder's side moved beyond its tolerance (a copy: the run's values are not
    touched), so that every floating-point value goes to the float64 round: on CPU, bf16 Thunder and eager often
    agree exactly, and the float64 reference would never run."""

    def judged(labels, actual, eager, float64=None, *rest, **options):
        moved = [a + (a.detach().abs().amax() + 1) * 0.5 if isinstance(a, torch.Tensor) and a.is_floating_point()
                 and a.numel() else a for a in actual]
        return judge(labels, moved, eager, float64, *rest, **options)

    return judged


def _strict(mode, narrow: list[str]):
    """`mode` (Float64Mode) that also notes every op given float64 and lower-precision floating-point tensors
    together (a matmul of the two raises "expected scalar type Double but found Float"; an elementwise op
    promotes, but computes from the rounded operand): in a float64 run there must be none."""

    class Strict(mode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            dtypes = {t.dtype for t in tree_leaves((args, kwargs or {}))
                      if isinstance(t, torch.Tensor) and t.is_floating_point()}
            if torch.float64 in dtypes and len(dtypes) > 1 and len(narrow) < 20:
                narrow.append(f"{getattr(func, '__name__', func)} got {sorted(map(str, dtypes))}")
            return super().__torch_function__(func, types, args, kwargs)

    return Strict


def _checks(report):
    splits = [s.check for g in report.graphs for s in g.splits if s.kind is SplitKind.THUNDER]
    regions = [f.check for g in report.graphs for s in g.splits for f in s.fusions]
    return splits, regions


def _assert_unchanged(plain, checked):
    (plain_losses, plain_params), (losses, params) = plain, checked
    assert torch.equal(plain_losses, losses)
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))


@pytest.mark.parametrize("name, bit_identity", [("llama", True), ("gptneox", False)])
def test_the_float64_reference_runs_on_the_decoder_splits_in_bf16(name, bit_identity, monkeypatch, one_thread):
    """Hugging Face's rotary embedding takes `.float()` of int64 position ids inside the decoder split; the float64
    run of that split and of its fusion regions, forward and backward, must be float64 throughout (on the H200 it
    raised "expected scalar type Double but found Float" in the backward's float64 run). Every value is sent to
    the float64 round; on Llama, the training stays as unchecked. GPT-NeoX brings conversions of its own (LayerNorm
    where Llama has RMSNorm, a rotary on a quarter of each head concatenated with the rest) for the float64 run;
    that the check leaves training bit-identical is the same copy-before-use on every model, held on Llama here
    and on GPT-2 and BERT below, so GPT-NeoX is not trained a second time without the check."""
    torch.manual_seed(0)
    plain = _train(name, "bfloat16")[:2] if bit_identity else None
    monkeypatch.setattr(split_check, "judge", _beyond_eager(compare.judge))
    monkeypatch.setattr(region_check, "judge", _beyond_eager(compare.judge))
    narrow: list[str] = []
    monkeypatch.setattr(split_check, "Float64Mode", _strict(split_check.Float64Mode, narrow))
    monkeypatch.setattr(region_check, "Float64Mode", _strict(region_check.Float64Mode, narrow))
    torch.manual_seed(0)
    losses, params, backend = _train(name, "bfloat16", check="fusion", check_every=1)
    splits, regions = _checks(backend.report())
    assert backend.recorder.failures.total == 0
    assert not narrow  # position ids' .float() left in float32 gave "mul got ['torch.float32', 'torch.float64']"
    assert splits and all(c.calls == STEPS and c.reference == "float64 eager" and not c.failures for c in splits)
    decoder = max(splits, key=lambda c: c.compared)
    assert any(label.startswith("gradient of") for label in decoder.mismatched_values)  # the backward's round ran
    assert regions and all(c.reference == "float64 eager" for c in regions if c.compared)
    if bit_identity:
        _assert_unchanged(plain, (losses, params))


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_training_with_every_call_checked_is_bit_identical_to_training_unchecked(name, one_thread):
    """(Llama in bf16: above.)"""
    torch.manual_seed(0)
    plain = _train(name, "float32")[:2]
    torch.manual_seed(0)
    losses, params, backend = _train(name, "float32", check="fusion", check_every=1)
    _assert_unchanged(plain, (losses, params))
    splits, regions = _checks(backend.report())
    assert splits and all(c.calls == STEPS and c.compared and not c.mismatches and not c.failures for c in splits)
    assert sum(c.verified_gradients for c in splits) > 0  # gradients were compared, their capture proved
    assert regions and all(c.compared and not c.mismatches for c in regions)
