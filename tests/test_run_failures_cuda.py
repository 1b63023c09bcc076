"""On CUDA with nvFuser: a Whisper-style encoder-decoder (Hugging Face's WhisperForConditionalGeneration at a realistic
size: 4 + 4 layers, d_model 768, bf16, Thunder's default executors, dropout 0.1) fails in training under plain
ThunderCompiler with lightning-thunder 0.2.6's `assert len(flat_output) == len(is_differentiable_outputs)`
(thunder/executors/torch_autograd.py). Under ReportingBackend the training raises the same; the dump names the split
that raised, and that split's Thunder script raises the same AssertionError on its own (RESULT REPRODUCED) where
thunderfx_debug cannot be imported; the failing graph's other scripts are neither REFUSED nor CRASH.

    source .gpu/setup.sh && python -m pytest -m cuda tests/test_run_failures_cuda.py -q

Plain ThunderCompiler trains in a subprocess (this file run as a script) beside the test's own run, on the same GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

#: The labels' length of each step: a length that changes makes Dynamo compile the loss's graph again with dynamic
#: shapes, as a run over sentences of different lengths does (a split of ThunderFX can then return a torch.Size,
#: which is what trips Thunder 0.2.6's assertion in the CPU test of tests/test_run_failures.py).
LABEL_LENGTHS = (64, 64, 48, 56, 40, 64)


def _whisper():
    import transformers

    config = transformers.WhisperConfig(
        vocab_size=51865, num_mel_bins=80, d_model=768, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
        max_source_positions=1500, max_target_positions=448, dropout=0.1, pad_token_id=50257,
        decoder_start_token_id=50258)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).to("cuda", torch.bfloat16).train()
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 80, 3000, generator=generator).to("cuda", torch.bfloat16),
                torch.randint(0, 50000, (2, length), generator=generator).cuda()) for length in LABEL_LENGTHS]
    return model, batches


def _train(backend) -> tuple[int, BaseException | None]:
    """Trains the Whisper model until a step raises: (steps done, the exception or None)."""
    model, batches = _whisper()
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, (features, labels) in enumerate(batches):
        try:
            compiled(input_features=features, labels=labels).loss.backward()
        except Exception as error:  # noqa: BLE001  (what the run raises is the subject)
            return step, error
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return len(batches), None


def _plain_run(out: str) -> None:
    """This file as a script: trains under plain ThunderCompiler and writes what happened to `out` (JSON)."""
    from thunderfx_debug import plain_thunder_compiler

    steps, error = _train(plain_thunder_compiler())
    Path(out).write_text(json.dumps({"steps": steps, "type": type(error).__name__ if error else None,
                                     "message": str(error) if error else None}))


def test_whisper_fails_as_under_plain_thunderfx_and_its_failing_split_script_reproduces_it(tmp_path):
    pytest.importorskip("transformers")
    from thunderfx_debug import ReportingBackend, load_report
    from thunderfx_debug.children.standalone import run_script

    out, log = tmp_path / "plain.json", tmp_path / "plain.log"
    with open(log, "w") as stream:
        plain = subprocess.Popen([sys.executable, __file__, str(out)], stdout=stream, stderr=subprocess.STDOUT,
                                 env={**os.environ, "THUNDERFX_DEBUG_DIR": ""})
    try:
        backend = ReportingBackend(dump_dir=tmp_path / "dump", repro="split", strict=True)
        steps, error = _train(backend)
        plain.wait(timeout=600)
    finally:
        if plain.poll() is None:
            plain.kill()
    assert plain.returncode == 0, log.read_text()[-4000:]
    expected = json.loads(out.read_text())
    assert expected["type"] == "AssertionError", f"plain ThunderCompiler: {expected}"
    assert error is not None, f"plain ThunderCompiler raised {expected}; ReportingBackend trained {steps} steps"
    assert (steps, type(error).__name__, str(error)) == (expected["steps"], expected["type"], expected["message"])

    rank_dir = tmp_path / "dump" / "rank0"
    report = load_report(rank_dir)
    failed = [graph for graph in report.graphs if graph.failure is not None]
    assert len(failed) == 1, [g.name for g in failed]
    graph, failure = failed[0], failed[0].failure
    assert failure.type == "AssertionError" and failure.raised_at.startswith("thunder/executors/torch_autograd.py:")
    assert failure.raised_code == "assert len(flat_output) == len(is_differentiable_outputs)"
    assert str(report).splitlines()[0].startswith(f"FAILED: {failure.piece} raised AssertionError")
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "THUNDERFX_DEBUG_DIR": ""}
    run = run_script(rank_dir / failure.script, env=env)
    assert run.outcome == "REPRODUCED", f"{run.result_line}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"

    # The failing graph's other scripts: none REFUSED or CRASH (an input rebuild of ours), whatever else they say.
    others = [rank_dir / path for split in graph.splits for label, path in split.files.items()
              if label.startswith("repro_") and rank_dir / path != rank_dir / failure.script]
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda path: run_script(path, env=env), others))
    bad = [(run.script, run.result_line or run.stderr[-1500:]) for run in runs
           if run.outcome in ("REFUSED", "CRASH", "NO_RESULT", "KILLED", "TIMEOUT")]
    assert not bad, "\n\n".join(f"{script}: {said}" for script, said in bad)
    for piece in failure.not_run:
        split = graph.split(piece.split("/")[-1])
        assert "It never ran in the run" in (rank_dir / split.files["repro_eager"]).read_text()


if __name__ == "__main__":
    import thunderfx_debug  # noqa: F401  (before thunder: the workarounds the installed versions need)

    _plain_run(sys.argv[1])
