"""Fusion regions as their scripts rebuild them: a dropout region's philox seed and offset (numbers Thunder knows at
run time) reach philox_rand as the tensors it takes.
"""

from __future__ import annotations

import types

import pytest
import torch

from conftest import cpu_executors


def _dropout_region(device: str = "cuda:0"):
    """A region as Thunder's rematerialisation leaves a dropout on CUDA: `uniform_philox` whose seed and offset are
    region inputs (IntegerProxy, known at run time), and the mask applied. Built on Thunder's own prims."""
    import thunder.torch as ltorch
    from thunder.core import devices, dtypes, prims
    from thunder.core.proxies import IntegerProxy, TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    trace = TraceCtx()
    with tracectx(trace):
        x = TensorProxy("x", shape=(4, 8), device=devices.Device(device), dtype=dtypes.float32)
        seed, offset = IntegerProxy("i194", value=None), IntegerProxy("i195", value=None)
        draws = prims.uniform_philox((4, 8), 0.0, 1.0, device=devices.Device(device), dtype=dtypes.float32,
                                     seed=seed, offset=offset)
        kept = ltorch.lt(draws, 0.9)
        y = ltorch.mul(ltorch.mul(x, kept), 1 / 0.9)
    return types.SimpleNamespace(flat_args=[seed, offset, x], flat_outs=[y], subsymbols=list(trace.bound_symbols))


def _lowered(region):
    from thunderfx_debug.thunder.scripts import region_torch_function

    source, ctx = region_torch_function(region, "nvFusion0")
    namespace = dict(ctx)
    exec(compile(source, "<region>", "exec"), namespace)
    return source, namespace["nvFusion0"]


def test_a_dropout_regions_philox_seed_and_offset_reach_philox_rand_as_tensors(monkeypatch):
    """On the H200 every script of a dropout region said REFUSED: "rngprims::philox_rand() Expected a value of type
    'Tensor' for argument 'seed' but instead found type 'int'". The region is called with the seed and offset as the
    run passed them (ints); philox_rand cannot run on CPU, so it is called under FakeTensorMode (its schema and meta
    kernel) and swapped for a recorder (the values it gets)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    source, region = _lowered(_dropout_region())
    assert "philox_rand" in source
    with FakeTensorMode():
        (out,) = region(1234, 8, torch.empty(4, 8, device="cuda:0"))
    assert out.shape == (4, 8)
    calls = []

    def recorder(shape, *, seed, offset, stride, device, dtype):
        calls.append((seed, offset, device))
        return torch.full(tuple(shape), 0.5, dtype=dtype), torch.tensor(4)

    monkeypatch.setattr(torch.ops.rngprims, "philox_rand", recorder)
    x = torch.randn(4, 8)
    (out,) = region(1234, 8, x)
    ((seed, offset, device),) = calls
    assert isinstance(seed, torch.Tensor) and isinstance(offset, torch.Tensor)
    assert (seed.dtype, seed.device, seed.item(), offset.dtype, offset.device, offset.item()) == (
        torch.int64, torch.device("cpu"), 1234, torch.int64, torch.device("cpu"), 8)
    assert device == torch.device("cuda:0")
    torch.testing.assert_close(out, x / 0.9)


@pytest.mark.cuda
def test_a_dropout_regions_lowering_draws_what_philox_rand_draws_on_cuda():
    """On CUDA the lowered region runs: its draws are philox_rand's for the run's seed and offset, i.e. torch.rand
    after the CUDA generator was set to that state (philox_rand's definition)."""
    _, region = _lowered(_dropout_region())
    x = torch.ones(4, 8, device="cuda")
    (out,) = region(1234, 8, x)
    with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
        state = torch.cat([torch.tensor([1234]).view(torch.uint8), torch.tensor([8]).view(torch.uint8)])
        torch.cuda.set_rng_state(state)
        draws = torch.rand(4, 8, device="cuda")
    torch.testing.assert_close(out, (draws < 0.9).float() / 0.9)
