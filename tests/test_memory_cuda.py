"""Memory on CUDA (`recording.memory`): a sampled step's peaks against `torch.cuda.max_memory_allocated` of the same
step, the peak the user reads left as it was, and no synchronisation on a sampled step either.

Run on a GPU machine: `python -m pytest tests/test_memory_cuda.py -q -m cuda`.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_gpt

pytestmark = pytest.mark.cuda

EVERY, WARMUP = 3, 1
SAMPLED = (2, 5)  # the graph calls sampled in 6 steps
MIB = 1 << 20


def _steps(sync_error_on_sampled: bool = False, big_mib: int = 0):
    """Six steps of a tiny GPT (two graphs) under ReportingBackend, the optimizer's outside what is read: per step,
    what `max_memory_allocated` rose to above what was allocated before the step's forward and backward (reset before
    each), and whether the user's peak reading survived the step (`big_mib` allocated and freed after the reset)."""
    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.commands.models import synthetic_batches

    torch._dynamo.reset()
    model, config = tiny_gpt(seed=0, device="cuda", n_layer=2, n_embd=64, block_size=64)
    backend = ReportingBackend(strict=True, timing_every=EVERY, timing_warmup=WARMUP)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = synthetic_batches(config, batch_size=8, device="cuda")
    rises, kept = [], []
    for call in range(1, 7):
        tokens, targets = next(batches)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        if big_mib:
            big = torch.empty(big_mib * MIB, dtype=torch.uint8, device="cuda")
            del big
        if sync_error_on_sampled and call in SAMPLED:
            torch.cuda.set_sync_debug_mode("error")
        try:
            loss = compiled(tokens, targets)
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        rises.append(torch.cuda.max_memory_allocated() - before)
        kept.append(torch.cuda.max_memory_allocated() - before >= big_mib * MIB)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return backend.report(), rises, kept


def test_a_sampled_steps_peak_is_what_max_memory_allocated_reads_for_it():
    report, rises, _ = _steps()
    step = report.step_memory
    assert step.peak_calls == len(SAMPLED) and step.peak_bytes > 0
    most = max(rises[c - 1] for c in SAMPLED)
    # Requested bytes against allocator blocks (rounded up to 512 B, a large block up to 1 MiB above its request),
    # and the step's window opens at the first graph's call, after the inputs were made: within 5% and 2 MiB.
    assert abs(step.peak_bytes - most) <= 0.05 * most + 2 * MIB, (step.peak_bytes, most)
    for graph in report.graphs:
        assert graph.memory.peak_calls == len(SAMPLED)
        assert 0 < graph.memory.peak_bytes <= step.peak_bytes + MIB
        for split in graph.splits:
            if split.memory.peak_forward_bytes is not None:
                assert split.memory.peak_forward_bytes <= graph.memory.peak_forward_bytes + MIB


def test_the_users_peak_reading_is_left_as_it_was():
    _, _, kept = _steps(big_mib=256)
    assert all(kept), kept  # a reset inside a sampled step would have dropped the 256 MiB peak before it


def test_a_sampled_step_measures_memory_without_synchronising_the_device():
    report, _, _ = _steps(sync_error_on_sampled=True)
    assert report.step_memory.peak_calls == len(SAMPLED)
    assert all(g.memory.saved_bytes > 0 for g in report.graphs)
