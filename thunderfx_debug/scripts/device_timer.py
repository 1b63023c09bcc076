"""The one CUDA-event timer of the package and of every repro script: marks on the current stream, read without
waiting unless asked, and device time of back-to-back calls queued behind a hold (a spin kernel), so that the events
time the kernels rather than the host's launches.

Used by the sampler's clock (`recording/timing.CudaClock`) and its hold (`recording/timing.DeviceHold`), by the
capture of input statistics (`recording/capture.observe`: a mark says when they are ready) and by flush-time triage
(`triage/judging.cuda_round`); the repro writer inlines this text into each script, whose `--benchmark` times device
work with it (see the package's docstring).

`cuda` arguments default to `torch.cuda`; tests pass a fake one, so the logic runs on machines without a GPU.
"""

import torch

#: How long a hold lasts, in ms, whatever the host's time for the work behind it. At least 1 ms: a hold sized from a
#: tiny host time would end before the host has queued the first kernels, and 1 ms is nothing to a sampled call or a
#: flush. At most 1 s: the host cannot run further ahead of the device than CUDA's launch queue (about a thousand
#: kernels) lets it, which takes it well under a second, so a longer hold only adds waiting; and a spin kernel of
#: seconds could trip the watchdog of a GPU that also drives a display.
HOLD_MIN_MS, HOLD_MAX_MS = 1.0, 1000.0
#: The hold in front of timed calls, over the host's time for them: room for the host to queue them all.
HOLD_OVER_HOST = 1.5


def mark(cuda=None, timing=True):
    """A CUDA event recorded now on the current stream (`timing`: one `elapsed_ms` can read); never waits."""
    cuda = cuda or torch.cuda
    event = cuda.Event(enable_timing=timing)
    event.record()
    return event


def elapsed_ms(start, end, wait):
    """Milliseconds from mark `start` to mark `end`; None where `end` is not complete yet and `wait` is False
    (with `wait`, waits for `end`: at flush or in a script, never on the training path)."""
    if not end.query():
        if not wait:
            return None
        end.synchronize()
    return start.elapsed_time(end)


def cycles_per_ms(cuda=None):
    """The current device's SM clock rate in kHz, the cycles of a spin kernel per millisecond (1.5 GHz where this
    torch does not report it)."""
    cuda = cuda or torch.cuda
    return float(getattr(cuda.get_device_properties(cuda.current_device()), "clock_rate", 0) or 1_500_000)


def hold_cycles(ms, per_ms):
    """The spin-kernel cycles of a hold of about `ms` milliseconds, kept within HOLD_MIN_MS and HOLD_MAX_MS."""
    return int(min(max(ms, HOLD_MIN_MS), HOLD_MAX_MS) * per_ms)


def held_device_ms(call, calls, host_ms, cuda=None):
    """Device milliseconds per call of `calls` back-to-back `call()`s, timed with CUDA events behind a hold of
    HOLD_OVER_HOST times their host time (`host_ms` per call), so that the host's launches stay ahead of the device.
    Waits for the device before the hold and for the last event."""
    cuda = cuda or torch.cuda
    cuda.synchronize()
    cuda._sleep(hold_cycles(HOLD_OVER_HOST * host_ms * calls, cycles_per_ms(cuda)))
    start = mark(cuda)
    for _ in range(calls):
        call()
    end = mark(cuda)
    return elapsed_ms(start, end, wait=True) / calls
