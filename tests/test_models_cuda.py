"""Real models on CUDA with nvFuser (run on the H200 machine): a 12-layer GPT-style model and a Hugging Face Llama
train under ReportingBackend with the dump, all repro scripts and fusion-level timing on.

    source .gpu/setup.sh && python -m pytest -m cuda tests/test_models_cuda.py -q

The plain ThunderCompiler reference trains in a subprocess next to the test's own run (on the same GPU), because
the 12-layer GPT takes more than 200 s to compile under Thunder 0.2.6 on the H200, and two compiles one after the
other would not fit a 10-minute run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

STEPS = 50


def _train(model, compiled, batches, loss_fn, steps=STEPS):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(steps):
        loss = loss_fn(compiled, next(batches))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses).float().cpu()


# The model has 12 layers. On the H200 machine (torch 2.11, Thunder 0.2.6, nvFuser built for torch 2.10),
# nvFuser breaks it under plain ThunderCompiler too: the kernel of the GPT's first fusion writes its iota output out
# of bounds (benchmarks/RESULTS.md, "Known issue"). With PyTorch's default CUDA allocator the 12-layer GPT dies of an
# illegal memory access in its first steps; at 2 layers it trains but loss tensors read ~1e-38 or 0 at some steps.
# TEST_GPT_LAYERS=2 runs there without the crash.
GPT_LAYERS = int(os.environ.get("TEST_GPT_LAYERS", "12"))


def _gpt():
    import dataclasses

    from thunderfx_debug.commands.models import GPT, GPT_12_LAYER, synthetic_batches

    config = dataclasses.replace(GPT_12_LAYER, n_layer=GPT_LAYERS)
    torch.manual_seed(0)
    model = GPT(config).to("cuda", torch.bfloat16)
    return model, synthetic_batches(config, batch_size=8, device="cuda"), lambda m, b: m(*b)


def _llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            yield torch.randint(0, config.vocab_size, (4, 512), generator=generator).cuda()

    return model, batches(), lambda m, tokens: m(input_ids=tokens, labels=tokens).loss


def _reporting(tmp_path):
    from thunderfx_debug import ReportingBackend

    return ReportingBackend(dump_dir=tmp_path, repro="all", timing="fusion", timing_every=10, timing_warmup=3)


def _plain():
    from thunderfx_debug import plain_thunder_compiler

    return plain_thunder_compiler()


def _run_scripts(paths: list[Path]) -> list[tuple[Path, int, str]]:
    def run(path):
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600,
                              cwd=path.parent, env={**os.environ, "THUNDERFX_DEBUG_DIR": ""})
        # The verdict lines are on stdout and a traceback ends stderr: keep both, not the tail of the two together.
        return path, proc.returncode, f"{proc.stdout[-3000:]}\n--- stderr:\n{proc.stderr[-3000:]}"

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 8)) as pool:
        return list(pool.map(run, paths))


def _check_report(backend, dump: Path):
    report = backend.report()
    fusions = [f for g in report.graphs for s in g.splits for f in s.fusions]
    forward = [f for f in fusions if f.name.startswith("nvFusion") and f.phase.value == "forward"]
    backward = [f for f in fusions if f.name.startswith("nvFusion") and f.phase.value == "backward"]
    assert forward and backward, [f.name for f in fusions]
    assert all(f.timing is not None and f.timing.count > 0 for f in forward + backward)
    assert not report.meta.get("reporting_failures"), report.meta["reporting_failures"]
    scripts = sorted(dump.rglob("*_repro_nvfuser.py"))
    assert len(scripts) == len(forward) + len(backward)
    failed = [(p.name, rc, out) for p, rc, out in _run_scripts(scripts) if rc != 0]
    if failed:  # pytest.fail keeps the whole text; an assert's repr would cut it in the middle
        pytest.fail(f"{len(failed)} of {len(scripts)} nvFuser repro scripts failed; the first ones:\n" + "\n\n".join(
            f"{name} (exit {rc}):\n{out}" for name, rc, out in failed[:3]), pytrace=False)
    return report


class _PlainReference:
    """Trains `model` (a name in MODELS) under plain ThunderCompiler in a subprocess (this file run as a script);
    `losses()` waits for it and returns its losses, or None with its output when it failed."""

    def __init__(self, model: str, tmp_path: Path):
        self.out, self.log = tmp_path / f"plain_{model}.pt", tmp_path / f"plain_{model}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, model, str(self.out)], stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, "THUNDERFX_DEBUG_DIR": ""})

    def losses(self, timeout: float = 600) -> tuple[torch.Tensor | None, str]:
        self.proc.wait(timeout=timeout)
        output = self.log.read_text()[-4000:]
        if self.proc.returncode != 0:
            return None, output
        return torch.load(self.out, weights_only=True), output


@pytest.fixture
def plain_reference(tmp_path):
    """Starts `_PlainReference`s; kills any still running when the test ends (a failed test does not wait)."""
    started = []

    def start(model: str) -> _PlainReference:
        started.append(_PlainReference(model, tmp_path))
        return started[-1]

    yield start
    for reference in started:
        if reference.proc.poll() is None:
            reference.proc.kill()
            reference.proc.wait()


ILLEGAL_ADDRESS = "illegal memory access"


def test_gpt_under_reporting_backend_matches_thunderfx(tmp_path, plain_reference):
    reference = plain_reference("gpt")
    model, batches, loss_fn = _gpt()
    backend = _reporting(tmp_path)
    try:
        losses = _train(model, torch.compile(model, backend=backend), batches, loss_fn)
    except Exception as error:
        plain, output = reference.losses()
        if ILLEGAL_ADDRESS in str(error) and plain is None and ILLEGAL_ADDRESS in output:
            # Seen on the H200 with nvFuser 0.2.36.dev20260301 (a torch-2.10 build on torch 2.11) from 4 layers on,
            # which overwrites memory it does not own: plain ThunderCompiler dies in the same way, so the backend is
            # not the cause (benchmarks/RESULTS.md). The dump must still be written, and load.
            rank_dir = backend.flush()
            from thunderfx_debug import load_report

            assert rank_dir is not None and load_report(rank_dir).graphs
            pytest.xfail(f"nvFuser crashes under plain ThunderCompiler too: {str(error)[:200]}")
        raise
    plain, output = reference.losses()
    assert plain is not None, output
    # The forward of step 1 has no nondeterministic kernel in it: bit-identical. Later steps go through backward
    # kernels with atomics (attention, embedding), whose order differs from run to run in plain ThunderFX too.
    assert losses[0] == plain[0]
    known = None
    stray = _stray_iota_writes(losses, plain)
    if bool((plain.abs() < 1e-30).any()):
        # The same nvFuser writes its GPT's `iota` out of bounds at 2 layers too: some losses of plain ThunderCompiler's
        # own run read 0 or ~1e-38 (benchmarks/RESULTS.md, "Known issue"), so there is nothing to compare with. A
        # corrupted loss of the backend's run alone still fails below.
        known = f"plain ThunderCompiler's own losses are corrupted by nvFuser: {plain.tolist()}"
    elif stray:
        # Seen on the H200 at 2 layers (benchmarks/RESULTS.md, "Known issue"): plain's losses clean, and the backend's
        # bit-equal to them but where a loss tensor, kept on the device until the end, was written over afterwards
        # with nvFuser's stray int64 iota values. Where the stray writes land depends on where the allocator put what.
        known = f"nvFuser's out-of-bounds iota writes overwrote the stored losses of steps {stray}"
    else:
        # Both lists in the message: a loss of 0 in the backend's run alone reads differently from a drift of both.
        torch.testing.assert_close(losses, plain, rtol=2e-2, atol=0, msg=lambda message: (
            f"{message}\nReportingBackend: {losses.tolist()}\nplain ThunderCompiler: {plain.tolist()}"))
        assert losses[-1] < losses[0]
    # The dump is checked whatever nvFuser did to the losses: a known fault excuses the losses, not the report.
    backend.flush()
    _check_report(backend, tmp_path / "rank0")
    if known is not None:
        pytest.xfail(known)


def _stray_iota_writes(losses: torch.Tensor, plain: torch.Tensor) -> list[int]:
    """The steps whose loss differs from plain's only by having been overwritten with an int64 iota's bytes: each
    such loss reads, as bfloat16, a small multiple of 64 in its bits (0, 5.9e-39, 1.2e-38...: the iota's values 0,
    64, 128... at 512-byte spacing), and every other loss equals plain's bit for bit. Empty where anything else
    differs (a real deviation fails the comparison)."""
    bits = losses.to(torch.bfloat16).view(torch.int16).int()
    differ = (losses != plain).nonzero().flatten().tolist()
    if not differ or not all(0 <= bits[i] < 4096 and bits[i] % 64 == 0 for i in differ):
        return []
    return differ


def test_hf_llama_trains_under_reporting_backend(tmp_path, plain_reference):
    pytest.importorskip("transformers")
    reference = plain_reference("llama")
    model, batches, loss_fn = _llama()
    backend = _reporting(tmp_path)
    losses = _train(model, torch.compile(model, backend=backend), batches, loss_fn)
    plain, output = reference.losses()
    if plain is None:  # Thunder 0.2.6's eager inductor-fallback compile (lightning-thunder#2689)
        assert "AssertionError" in output and "stride" in output, output
    assert torch.isfinite(losses).all() and losses[-1] < losses[0]
    if plain is not None:
        torch.testing.assert_close(losses, plain, rtol=2e-2, atol=0)
    backend.flush()
    report = _check_report(backend, tmp_path / "rank0")
    inductor = [s for g in report.graphs for s in g.splits if s.kind.value == "inductor"]
    assert inductor, "the Llama graph is expected to have inductor splits"
    assert all(s.reasons for s in inductor), [(s.name, s.ops) for s in inductor]


MODELS = {"gpt": _gpt, "llama": _llama}

if __name__ == "__main__":  # the plain ThunderCompiler reference of a test (see _PlainReference)
    import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported)

    model, batches, loss_fn = MODELS[sys.argv[1]]()
    torch.save(_train(model, torch.compile(model, backend=_plain()), batches, loss_fn), sys.argv[2])
