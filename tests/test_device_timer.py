"""One CUDA-event timer: `scripts/device_timer.py`, used by the sampler's clock and hold, the capture and flush-time
triage, and carried as text by every repro script, where it times as the package's does (also in a fresh interpreter
where thunderfx_debug cannot be imported). On CPU the timer runs against a fake `torch.cuda` that keeps a device clock
of its own (marks, spin kernels, work); on a GPU (`-m cuda`) it times a spin kernel of known length."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys

import pytest
import torch
import written_script

from thunderfx_debug.children.standalone import REFUSE_THUNDERFX_DEBUG
from thunderfx_debug.triage import judging as triage
from thunderfx_debug.records import Phase
from thunderfx_debug.recording.timing import CudaClock, DeviceHold
from thunderfx_debug.scripts import device_timer

#: The timer as a written repro script defines it, from its own text.
SCRIPT = written_script.namespace()


class FakeCuda:
    """The parts of `torch.cuda` the timer uses, on a device clock in ms: a spin kernel of `cycles` takes
    cycles / `khz` ms, `work(ms)` is a kernel of that length, an event records the clock where it is queued."""

    def __init__(self, khz: int = 1000, complete: bool = True):
        self.khz, self.complete, self.now, self.log = khz, complete, 0.0, []
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.timing, self.at = enable_timing, None

            def record(self):
                self.at = fake.now
                fake.log.append("mark")

            def query(self):
                return fake.complete

            def synchronize(self):
                fake.log.append("wait for the mark")

            def elapsed_time(self, end):
                assert self.timing and end.timing, "elapsed_time of an event made without enable_timing"
                return end.at - self.at

        self.Event = Event

    def synchronize(self):
        self.log.append("wait for the device")

    def _sleep(self, cycles: int):
        self.log.append(("hold", cycles))
        self.now += cycles / self.khz

    def work(self, ms: float):
        self.log.append("work")
        self.now += ms

    def current_device(self):
        return 0

    def get_device_properties(self, device):
        return type("Properties", (), {"clock_rate": self.khz})()


def test_a_written_script_times_with_the_timer_text_it_carries_where_the_package_cannot_be_imported(tmp_path):
    """No copy to hold equal: a script defines the timer from its own text, and run in a fresh interpreter where
    thunderfx_debug cannot be imported, that timer times a fake device as the package's does."""
    assert SCRIPT.held_device_ms.__code__.co_filename == written_script.FILE_NAME
    assert (SCRIPT.HOLD_MIN_MS, SCRIPT.HOLD_MAX_MS, SCRIPT.HOLD_OVER_HOST) == (
        device_timer.HOLD_MIN_MS, device_timer.HOLD_MAX_MS, device_timer.HOLD_OVER_HOST)
    script = written_script.write(tmp_path)
    program = ("import runpy, sys\n" + REFUSE_THUNDERFX_DEBUG + inspect.getsource(FakeCuda)
               + "script = runpy.run_path(sys.argv[1], run_name='written_script')\n"
               "assert not any(name.startswith('thunderfx_debug') for name in sys.modules)\n"
               "cuda = FakeCuda(khz=2000, complete=False)\n"
               "ms = script['held_device_ms'](lambda: cuda.work(2.5), calls=4, host_ms=10.0, cuda=cuda)\n"
               "print(repr((ms, cuda.log)))\n")
    done = subprocess.run([sys.executable, "-c", program, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cuda = FakeCuda(khz=2000, complete=False)
    ms = device_timer.held_device_ms(lambda: cuda.work(2.5), calls=4, host_ms=10.0, cuda=cuda)
    assert ast.literal_eval(done.stdout.strip().splitlines()[-1]) == (ms, cuda.log)


@pytest.mark.parametrize("timer", [device_timer, SCRIPT], ids=["package", "script"])
def test_held_calls_time_the_device_work_behind_a_hold_that_is_not_timed(timer):
    cuda = FakeCuda(khz=2000, complete=False)  # the end mark is still queued: the timer waits for it
    ms = timer.held_device_ms(lambda: cuda.work(2.5), calls=4, host_ms=10.0, cuda=cuda)
    assert ms == 2.5  # the 60 ms hold (1.5 x 4 calls x 10 ms) comes before the first mark
    assert cuda.log == ["wait for the device", ("hold", 120_000), "mark", "work", "work", "work", "work", "mark",
                        "wait for the mark"]


@pytest.mark.parametrize("timer", [device_timer, SCRIPT], ids=["package", "script"])
def test_a_hold_lasts_one_millisecond_to_one_second_whatever_the_host_time(timer):
    assert timer.hold_cycles(0.01, per_ms=1000) == 1_000
    assert timer.hold_cycles(50.0, per_ms=1000) == 50_000
    assert timer.hold_cycles(1e6, per_ms=1000) == 1_000_000
    cuda = FakeCuda(khz=1000)
    timer.held_device_ms(lambda: cuda.work(1.0), calls=9, host_ms=500.0, cuda=cuda)
    assert cuda.log[1] == ("hold", 1_000_000)


def test_marks_are_read_without_waiting_on_the_training_path():
    cuda = FakeCuda(complete=False)
    start = device_timer.mark(cuda)
    cuda.work(3.0)
    end = device_timer.mark(cuda)
    assert device_timer.elapsed_ms(start, end, wait=False) is None
    assert "wait for the mark" not in cuda.log and "wait for the device" not in cuda.log
    assert device_timer.elapsed_ms(start, end, wait=True) == 3.0
    assert cuda.log[-1] == "wait for the mark"


@pytest.fixture
def fake_torch_cuda(monkeypatch):
    """torch.cuda's timing functions replaced by a FakeCuda's, for code that calls torch.cuda itself."""
    cuda = FakeCuda(khz=1000)
    for name in ("Event", "synchronize", "_sleep", "current_device", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    return cuda


def test_the_sampler_clock_and_hold_and_triage_go_through_the_one_timer(fake_torch_cuda):
    cuda = fake_torch_cuda
    clock = CudaClock()
    start = clock.mark()
    cuda.work(4.0)
    assert clock.elapsed_ms(start, clock.mark(), wait=False) == 4.0

    # The sampler's hold sleeps 1.25x the previous phase's host time, within the timer's limits: 2 s here is 1 s.
    host_ns = iter([0, 1600 * 10**6, 1600 * 10**6])
    hold = DeviceHold.for_current_cuda_device()
    hold._counter = lambda: next(host_ns)
    hold.begin(Phase.FORWARD, call=1)
    hold.end(Phase.FORWARD)
    hold.begin(Phase.FORWARD, call=2)
    assert [entry for entry in cuda.log if entry[0] == "hold"] == [("hold", 10_000), ("hold", 1_000_000)]

    cuda.log.clear()
    assert triage.cuda_round(lambda: cuda.work(0.5), calls=3) == 0.5
    (hold_entry,) = [entry for entry in cuda.log if entry[0] == "hold"]
    assert hold_entry[1] >= 1_000  # at least a millisecond, however quick the host was
    assert cuda.log[cuda.log.index(hold_entry):] == [
        hold_entry, "mark", "work", "work", "work", "mark"]


@pytest.mark.cuda
@pytest.mark.parametrize("timer", [device_timer, SCRIPT], ids=["package", "script"])
def test_on_a_gpu_held_calls_measure_a_spin_kernels_device_time_not_its_launch(timer):
    cycles = int(2.0 * device_timer.cycles_per_ms())  # a 2 ms spin kernel at the reported clock rate
    ms = timer.held_device_ms(lambda: torch.cuda._sleep(cycles), calls=5, host_ms=0.05)
    # The launch takes microseconds of host time; the kernel about 2 ms (the SM clock may run below its rating).
    assert 1.0 < ms < 6.0, ms
