"""Shared fixtures: real Thunder runs on CPU (fusions from Thunder's torch.compile executor), CUDA tests marked."""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

import thunderfx_debug  # noqa: F401  (installs the version workarounds before thunder is imported)

CUDA = torch.cuda.is_available()

# One inductor cache for the suite and every process it starts. The test processes share inductor's default one;
# children that benchmarks/zoo.py, `verify` and the CLI start put theirs under the dump unless this is set, and on a
# fresh CI machine each such cache compiled every C++ kernel (and the precompiled header) again. A hit returns the
# code a miss would compile, so no test proves less; test_triage_flushes sets a cold one where it needs one.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())


#: The files that took longest on a loaded 2-core CPU machine (about 70-400 s each; `--durations`), longest first.
#: `pytest -n 2 --dist loadfile` gives each worker whole files; handed out first, they leave the short files for the
#: end, where they even out the two workers. xdist's own order (most tests first) handed out the zoo's one-test files
#: last, and one worker ran them while the other waited. An order only; every other file follows, as collected.
SLOWEST_FILES = ("test_check_zoo.py", "test_benchmarks.py", "test_triage_decoders.py", "test_repro.py",
                 "test_triage_isolation.py", "test_provenance.py", "test_html_browser.py", "test_zoo.py",
                 "test_zoo_t5.py", "test_zoo_moe.py", "test_exactness.py", "test_triage_flushes.py", "test_cli.py",
                 "test_memory.py", "test_safety.py", "test_timing_share.py", "test_run_failures.py",
                 "test_distributed.py", "test_triage.py", "test_check.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: hand out files in collection order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip_cuda)
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    """Each test starts with Dynamo's caches empty and no THUNDERFX_DEBUG_* variable from the outside."""
    for name in list(os.environ):
        if name.startswith("THUNDERFX_DEBUG_"):
            monkeypatch.delenv(name)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def one_thread():
    """One intra-op thread: two identical CPU runs can differ in the last bits with several (reduction order varies
    with thread scheduling, with or without thunderfx_debug), and on a shared 2-core machine an OpenMP team whose
    other thread is preempted stalls calls by tens of ms at random, which would drown any ratio."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cpu_executors():
    """Thunder's default executors fuse nothing on CPU; its torch.compile executor does (TorchCompileN regions)."""
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    return [torch_compile_ex, *thunder.get_default_executors()]


def cpu_executors_apart_at_matmuls():
    """Thunder's torch.compile executor leaving linear and matmul to Thunder's torch executor, as nvFuser's regions
    leave them to cuBLAS on a GPU: regions end at every matmul, so that each layer of a model gets regions of its own
    (with `cpu_executors`, one region holds a whole split) and the matmuls are op groups. Registered once, by name."""
    import thunder
    import thunder.torch as ltorch
    from thunder.core import prims
    from thunder.executors.torch_compile import TorchCompileExecutor
    from thunder.executors.torchex import ex as torch_ex
    from thunder.extend import ImplInfo, get_executor, register_executor

    name = "thunderfx_debug_test_torchcompile_apart_at_matmuls"
    executor = get_executor(name)
    if executor is None:
        executor = TorchCompileExecutor(name)
        register_executor(executor)
        matmuls = {ltorch.linear.id, prims.linear.id, ltorch.matmul.id, prims.matmul.id}
        executor._implmap = {op: ImplInfo() for op in torch_ex.implmap if op not in matmuls}
    return [executor, *thunder.get_default_executors()]


class ThreeSplits(torch.nn.Module):
    """thunder_0 (matmul, relu), inductor_1 (torch.sinc: Thunder has no sinc of its own), thunder_2 (matmul, sin)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8) / 3)
        self.v = torch.nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x):
        h = torch.sinc(torch.relu(x @ self.w) + 1)
        return (torch.sin(h @ self.v) * 2).sum()


def tiny_gpt(seed: int = 0, device: str = "cpu", **overrides):
    from thunderfx_debug.commands.models import GPT, GPTConfig

    torch.manual_seed(seed)
    options = dict(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32, graph_break=True, sinc_gate=True)
    options.update(overrides)
    config = GPTConfig(**options)
    return GPT(config).to(device), config


def train(compiled, model, config, steps: int, device: str = "cpu", batch_size: int = 4):
    """Runs `steps` AdamW steps; returns the losses (as tensors, read after training: no sync in the loop)."""
    from thunderfx_debug.commands.models import synthetic_batches

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = synthetic_batches(config, batch_size=batch_size, device=device)
    losses = []
    for _ in range(steps):
        tokens, targets = next(batches)
        loss = compiled(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses)


def failing_every_other_trace(marker):
    """A `Clock.marker` (unbound) whose every other recording trace raises on its third mark, as a CUDA error
    recording an event would: for the tests of what a failed mark does to a trace and to the training."""
    traces = itertools.count(1)

    def failing_marker(clock):
        mark, fails = marker(clock), next(traces) % 2 == 1
        marks = itertools.count(1)

        def mark_or_fail():
            if fails and next(marks) == 3:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return mark()

        return mark_or_fail

    return failing_marker


def sitecustomize_source(body: str) -> str:
    """A `sitecustomize.py` that runs `body` (registering a test's executors in a fresh interpreter, as a user's own
    executor is registered by the code that defines it) in every interpreter but inductor's dlopen probes: on CPU,
    inductor's first compile in a process checks each vector ISA in a child `python -c "...cdll.LoadLibrary(...)"`
    whose PYTHONPATH is the parent's sys.path, so this file runs there too, and a body that imports Thunder made
    each of the ~10 probes cost 3 s (30 s of every such script run)."""
    indented = "".join(f"    {line}\n" for line in body.splitlines())
    return f'import sys\nif "cdll.LoadLibrary" not in " ".join(sys.orig_argv):\n{indented}'


@functools.cache
def dump_fixtures() -> Path:
    """A copy of tests/fixtures (dumps from real CPU runs, made by make_fixtures.py) that loads as dumps.

    The dumps are checked in with `manifest.fixture.json` instead of `manifest.json`, so that no committed file looks
    like the index of a real dump; the copy gets the real name back. Made once per test session."""
    copy = Path(tempfile.mkdtemp(prefix="thunderfx_debug_fixtures_")) / "fixtures"
    shutil.copytree(Path(__file__).parent / "fixtures", copy, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "make_fixtures.py"))
    for manifest in copy.rglob("manifest.fixture.json"):
        manifest.rename(manifest.with_name("manifest.json"))
    atexit.register(shutil.rmtree, copy.parent, ignore_errors=True)
    return copy
