"""Flush-time triage of Hugging Face decoders (benchmarks/harness.py's zoo at its tiny size) on CPU, with Thunder's
torch.compile executor: every Thunder split gets a verdict, the decoder split (the one holding nearly every op) first,
and at `fusion` its regions too."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

import thunderfx_debug
from thunderfx_debug import load_report
from thunderfx_debug.triage import piece_inputs
from thunderfx_debug.triage.jobs import PieceInputs
from thunderfx_debug.artifacts.repro import inputs as repro_inputs
from thunderfx_debug.records import InputKind

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import harness  # noqa: E402


def _trained(dump_dir, name: str, dtype: str, attention_mask: bool, level: str):
    model, batch = harness.build(name, "tiny", dtype=dtype)
    if not attention_mask:
        batch.pop("attention_mask")
    # The second call sampled, so that the run measures what each split holds (`recording.memory`) too.
    backend = thunderfx_debug.ReportingBackend(dump_dir, triage=level, flush_every=0, strict=True, timing_warmup=1,
                                               **harness.thunder_options("cpu"))
    harness.train(model, batch, backend, steps=2)
    return backend, model  # the model alive, as in a training script that flushes: the triage reads its weights


def _thunder_splits(report):
    return {f"{g.name}/{s.name}": s for g in report.graphs for s in g.splits if s.kind.value == "thunder"}


def _judged(triage) -> bool:
    return (triage is not None and triage.error is None and triage.rounds > 0
            and triage.ratio_low <= triage.ratio <= triage.ratio_high)


def test_the_llama_decoder_split_and_its_regions_are_judged_on_inputs_placed_as_the_run_placed_them(tmp_path,
                                                                                                   one_thread):
    """Llama called as `model(input_ids=..., labels=...)`, as a new user calls it: its decoder split receives the
    position ids and an expanded view of them, one storage, and Thunder's cache checks which plain tensors of a call
    share a storage (`alias_tensor_indices`). Inputs rebuilt each on a storage of its own made Thunder compile the
    split again, and the triage said "not judged"; placed as the run placed them, Thunder's prologue accepts them."""
    backend, _model = _trained(tmp_path, "llama", "float32", attention_mask=False, level="fusion")
    from thunderfx_debug.thunder import counterparts

    snapshot = backend.recorder.snapshot(wait=True)[0]
    decoder = max((s for s in snapshot.splits if s.state.split.kind.value == "thunder"),
                  key=lambda s: len(s.state.split.ops))
    metas = repro_inputs.split_metas(snapshot, decoder)
    shared = [(i, m.alias_of) for i, m in enumerate(metas) if m.alias_of is not None]
    assert shared, "the decoder split's inputs share no storage: this test no longer holds the case it is about"
    # The root cause, held: each input on a storage of its own is refused by Thunder's prologue for its alias check.
    apart = piece_inputs.rebuilt_inputs(metas, decoder.state.split.input_names)
    apart = piece_inputs.placed_as_in_the_run(apart, [dataclasses.replace(m, alias_of=None) for m in metas])
    refusal = counterparts.refusal(decoder.state.split.compiled, apart)
    assert refusal is not None and "alias_tensor_indices" in refusal
    handed = piece_inputs.run_tensors(decoder.state.captured, metas)  # what the training process hands its child
    placed, _ = piece_inputs.made_inputs(PieceInputs(metas, decoder.state.split.input_names), handed)
    assert counterparts.refusal(decoder.state.split.compiled, placed) is None
    assert all(placed[i].untyped_storage().data_ptr() == placed[root].untyped_storage().data_ptr()
               for i, root in shared)

    misses = counterparts.cache_misses(decoder.state.split.compiled)
    report = load_report(backend.flush())
    assert counterparts.cache_misses(decoder.state.split.compiled) == misses  # Thunder compiled nothing again
    splits = _thunder_splits(report)
    assert len(splits) >= 2 and all(_judged(s.triage) for s in splits.values()), {
        k: s.triage.error for k, s in splits.items()}
    decoder_record = splits[f"graph0/{decoder.state.name}"]
    assert decoder_record.triage.inputs.startswith("meta, the run's tensors for")
    regions = [f for f in decoder_record.fusions if f.triage is not None]
    assert regions and len(regions) == len(decoder_record.fusions) and all(_judged(f.triage) for f in regions)
    triage_md = (tmp_path / "rank0" / "triage.md").read_text()
    assert "not judged" not in triage_md

    # What each split holds, measured in the triage's child for Thunder as the run measured it, and for inductor
    for split in splits.values():
        assert split.memory.calls == 1 and split.memory.saved_bytes is not None
        assert split.triage.thunder_memory.saved_bytes == split.memory.saved_bytes  # same inputs, same code
        assert split.triage.inductor_memory.saved_bytes is not None
    assert decoder_record.triage.inductor_memory.saved_bytes > 0
    from thunderfx_debug.render import memory as render_memory

    gaps = {g.path: g for g in render_memory.triage_gaps(report)}
    assert set(gaps) == set(splits)
    gap = gaps[f"graph0/{decoder.state.name}"]
    assert gap.saved_gap == decoder_record.memory.saved_bytes - decoder_record.triage.inductor_memory.saved_bytes
    assert gap.holds_more == (gap.saved_gap > 0)
    assert "## Memory: ThunderFX against inductor" in triage_md


@pytest.mark.parametrize("name", ["gptneox"])
def test_every_thunder_split_of_another_decoder_family_is_judged(tmp_path, one_thread, name):
    backend, _model = _trained(tmp_path, name, "float32", attention_mask=True, level="split")
    splits = _thunder_splits(load_report(backend.flush()))
    assert splits and all(_judged(s.triage) for s in splits.values()), {k: s.triage.error for k, s in splits.items()}
    decoder = max(splits.values(), key=lambda s: len(s.ops))
    assert decoder.triage.clock.value == "host" and decoder.triage.compile_s > 0 and decoder.triage.timing_s > 0


def test_an_input_that_viewed_a_parameter_is_a_view_of_the_parameter_s_copy_again():
    """An input that was a view of a parameter (a transposed weight passed as an input of its own) becomes a view of
    the parameter made for the child again, with the parameter's values, and the parameter stays a parameter."""
    from thunderfx_debug.records import InputMeta

    weight = torch.nn.Parameter(torch.randn(3, 4))
    metas = [InputMeta(InputKind.TENSOR, shape=(3, 4), stride=(4, 1), dtype="torch.float32", device="cpu",
                       requires_grad=True, storage_size=12, parameter=True),
             InputMeta(InputKind.TENSOR, shape=(4, 3), stride=(1, 4), dtype="torch.float32", device="cpu",
                       storage_size=12, alias_of=0)]
    values = piece_inputs.placed_as_in_the_run([weight, torch.zeros(12).as_strided((4, 3), (1, 4))], metas)
    assert isinstance(values[0], torch.nn.Parameter) and values[0].requires_grad
    assert values[0].untyped_storage().data_ptr() == values[1].untyped_storage().data_ptr()
    assert torch.equal(values[1], weight.detach().t()) and torch.equal(values[0], weight)


