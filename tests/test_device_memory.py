"""Nothing the tool does takes device memory a training may need (docs/memory.md): a check that cannot get its
memory is "not checked" and the training goes on as it was; the triage's children start ahead of the flush only
where the device has room beyond the training's high-water mark and the margin, are ended once it is gone, and none
outlives the flush; a child that runs out of device memory is its piece's verdict. CPU here, on real Thunder runs
where a run is needed; the CUDA tests (marked) run the memory-tight training itself against plain ThunderCompiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from conftest import ThreeSplits, cpu_executors
from thunderfx_debug import ReportingBackend
from thunderfx_debug.triage import child
from thunderfx_debug.triage.ahead import Ahead, AheadChild
from thunderfx_debug.records import SplitKind
from thunderfx_debug.recording import device_room
from thunderfx_debug.recording.check import OUT_OF_MEMORY
from thunderfx_debug.settings.safety import ReportingFailures

GiB = 2**30
HERE = Path(__file__).parent


def _train(backend, steps: int = 4, after_first=lambda backend: None) -> list[torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ThreeSplits()
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        loss = compiled(torch.randn(4, 8))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if step == 0:
            after_first(backend)
    return losses


def _out_of_memory(*args):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                 "79.19 GiB of which 1.06 GiB is free.")


def _no_memory_for_the_checks(backend) -> None:
    for runner in backend.recorder.graphs[0].split_gm.children():
        if getattr(runner, "check", None) is not None:
            runner.check.module = _out_of_memory


def test_a_check_without_device_memory_is_not_checked_is_no_failure_and_leaves_the_training_as_it_was(caplog):
    """The check's reference allocates and the device has nothing left (here: raising what CUDA's allocator
    raises): the call is "not checked" with why, no reporting failure is counted (strict mode does not raise), it is
    said once, and the losses are those of a run without the check."""
    plain = _train(ReportingBackend(executors=cpu_executors()))
    backend = ReportingBackend(check="split", check_every=1, strict=True, executors=cpu_executors())
    with caplog.at_level("WARNING", logger="thunderfx_debug"):
        checked = _train(backend, after_first=_no_memory_for_the_checks)
    assert torch.equal(torch.stack(plain), torch.stack(checked))
    checks = [s.check for s in backend.report().graphs[0].splits if s.check is not None]
    assert checks and backend.recorder.failures.total == 0
    for check in checks:
        reasons = [r for r in check.skipped if r.startswith(OUT_OF_MEMORY)]
        assert reasons and "Tried to allocate 2.00 GiB" in reasons[0] and not check.failed and not check.clean
    said = [r.getMessage() for r in caplog.records if "could not get the device memory" in r.getMessage()]
    assert len(said) == 1, said


def test_a_backward_check_whose_hook_had_no_device_memory_compares_nothing_and_says_only_that(monkeypatch):
    """A hook of the gradient check that could not get device memory leaves the capture incomplete: that call's
    gradients are not compared (a half-captured gradient would be a false mismatch), its reason is the memory, and
    nothing else is said of it (not "the backward did not run all of the split's nodes")."""
    from thunderfx_debug.recording import split_check

    def no_memory(grads, before):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 MiB.")

    monkeypatch.setattr(split_check, "_total", no_memory)
    backend = ReportingBackend(check="split", check_every=1, strict=True, executors=cpu_executors())
    _train(backend, steps=2)
    checks = [s.check for s in backend.report().graphs[0].splits if s.check is not None]
    assert checks and all(c.mismatches == 0 and not c.failed and c.compared for c in checks)  # forwards compared
    for check in checks:
        assert any(r.startswith(OUT_OF_MEMORY + " while noting the gradients passed on") for r in check.skipped)
        assert not any("did not run all of the split's autograd nodes" in r for r in check.skipped), check.skipped


class _Recorder:
    """The little of a `Recorder` the compiles ahead read: graphs with splits that ran, on CUDA device 0."""

    def __init__(self, splits: int):
        self.failures = ReportingFailures(strict=True)
        observed = (types.SimpleNamespace(device="cuda:0"),)
        self.graphs = [types.SimpleNamespace(name="graph0", splits=[
            types.SimpleNamespace(name=f"thunder_{i}", split=types.SimpleNamespace(kind=SplitKind.THUNDER), calls=3,
                                  error=None, captured=types.SimpleNamespace(observed=observed), first=None)
            for i in range(splits)])]


def _reading(free_gib: float, reserved_gib: float = 40, peak_gib: float = 48) -> device_room.DeviceReading:
    return device_room.DeviceReading(total=80 * GiB, free=int(free_gib * GiB), reserved=int(reserved_gib * GiB),
                                     peak_reserved=int(peak_gib * GiB))


def _ahead(reading, slots: int = 2, margin: float = 25.0):
    started = []
    ahead = Ahead(_Recorder(3), lambda: slots, lambda *a: None, lambda key: False, margin,
                               read=lambda device: reading[0])
    ahead._stop.set()  # the test drives it, not its thread
    ahead._start = lambda key, state, split, cap: started.append((key, cap))
    return ahead, started


def test_children_ahead_start_only_where_the_device_has_room_beyond_the_training_and_the_margin():
    reading = [_reading(free_gib=30)]  # 22 GiB beyond the training's high-water mark, 20 of them the margin
    ahead, started = _ahead(reading)
    with ahead:
        ahead._start_ready()
    assert started == []  # 2 GiB for two children: below a child's least
    reading[0] = _reading(free_gib=40)  # 32 beyond it, 12 of room: 6 a child, 1 of it its context
    with ahead:
        ahead._start_ready()
    assert started == [("graph0/thunder_0", 5 * GiB), ("graph0/thunder_1", 5 * GiB)]
    ahead, started = _ahead([_reading(free_gib=79, reserved_gib=0, peak_gib=0)], margin=100)
    with ahead:
        ahead._start_ready()
    assert started == []  # THUNDERFX_DEBUG_DEVICE_MARGIN=100: nothing before the flush


def test_children_ahead_are_ended_once_the_training_grows_into_the_margin():
    reading = [_reading(free_gib=40)]
    ahead, _ = _ahead(reading)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"thunderfx_debug_test_{os.getpid()}" / "ahead_x"
    folder.mkdir(parents=True, exist_ok=True)
    ahead._children["graph0/thunder_0"] = AheadChild((None, None), folder, sleeper, folder / "log", 0)
    with ahead:
        ahead._start_ready()
    assert sleeper.poll() is None and ahead.children  # room left: it goes on
    reading[0] = _reading(free_gib=20, reserved_gib=44, peak_gib=52)  # the training grew: 12 GiB beyond it
    with ahead:
        ahead._start_ready()
    deadline = time.monotonic() + 10
    while sleeper.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeper.poll() is not None and not ahead.children and not folder.parent.exists()


def test_a_piece_whose_process_ran_out_of_device_memory_says_so_and_what_it_was_doing():
    from thunderfx_debug.triage.judging import NotJudged

    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB.")
    verdict = child.out_of_memory(error, "timing the split")
    assert verdict.startswith(child.OUT_OF_MEMORY + " in its process of its own while timing the split")
    assert "Tried to allocate 3.00 GiB" in verdict and "the training" in verdict
    try:
        raise NotJudged("inductor failed on the split") from error
    except NotJudged as wrapped:
        assert child.out_of_memory(wrapped, "inductor's first call").startswith(child.OUT_OF_MEMORY)
    assert child.out_of_memory(RuntimeError("shapes differ"), "timing the split") is None
    assert device_room.is_out_of_memory(RuntimeError("CUDA error: out of memory"))


# ---- CUDA -----------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
def test_what_a_check_allocates_goes_back_to_the_device_when_its_work_returns():
    """The check's pool lives as long as one entry: the process's reserved memory after a check that allocated
    256 MiB is what it was before (its stream's library workspaces, made once, aside)."""
    from thunderfx_debug.recording.isolation import CheckIsolation

    isolation = CheckIsolation()
    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    with isolation.entered([x]):  # the stream and its workspaces, once
        pass
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    with isolation.entered([x]):
        big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
        leaf = x.detach().requires_grad_()
        (grad,) = torch.autograd.grad((leaf @ leaf).sin().sum(), [leaf])  # on autograd's device thread too
        assert torch.cuda.memory_reserved() >= before + 256 * 2**20
        del big, grad
    assert torch.cuda.memory_reserved() == before


@pytest.mark.cuda
@pytest.mark.slow
def test_a_memory_tight_training_with_every_feature_on_trains_to_the_end_as_plain_does(tmp_path):
    """benchmarks/device_memory.py tight: a tiny Hugging Face Llama under plain ThunderCompiler, then the same with every
    feature on, each in a process of its own whose free device memory is only a little above plain's peak, and a late
    step that allocates most of that margin: both train every step, bit for bit alike under deterministic
    algorithms, and the flush judges every Thunder split or says why not."""
    out = tmp_path / "tight.json"
    done = subprocess.run([sys.executable, str(HERE.parent / "benchmarks" / "device_memory.py"), "tight", "--size",
                           "tiny", "--steps", "12", "--headroom-gib", "1", "--dump", str(tmp_path / "dump"),
                           "--json", str(out)], capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-6000:])
    figures = json.loads(out.read_text())["results"]["figures"]
    plain, every = figures["runs"]["plain"], figures["runs"]["every feature"]
    assert plain["steps_done"] == every["steps_done"] == figures["steps"]
    assert every["losses"] == plain["losses"] and every["parameters_equal_plain"]
    assert every["splits"] and all(s["judged"] or s["why_not"] for s in every["splits"]), every["splits"]
