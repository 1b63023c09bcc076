"""`scripts/philox_draws.py`: Philox4x32-10 in torch integer ops against Random123's known answers and a plain-Python
Philox, the word-to-float conversion at its edges, and the element-to-counter mappings of nvFuser and of torch's CUDA
generator. On CUDA (marked): the draws equal nvFuser's `uniform_philox` (through Thunder) and `torch.rand` bit for
bit, and a dropout that Thunder runs with nvFuser equals `x * (u < 1 - p) / (1 - p)` with u drawn here from the
generator's state before the call, forward and backward.

    source .gpu/setup.sh && python -m pytest -m cuda tests/test_philox_draws.py -q -rs
"""

from __future__ import annotations

import random

import pytest
import torch

from thunderfx_debug.scripts.philox_draws import (
    _counter,
    _mulhilo32,
    nvfuser_uniform,
    philox4x32_10,
    torch_cuda_threads,
    torch_cuda_uniform,
    uniform_from_words,
)

# Random123 (github.com/DEShawResearch/random123 at 9545ff64, 2022-01-17): tests/kat_vectors lines 27-29, and
# tests/old_kat_vectors lines 98-148 every fifth ("the extensive Crush tests reported in the Random123 paper were all
# done with generators that satisfied these"): counter (4 words), key (2 words), expected (4 words).
KNOWN_ANSWERS = """
00000000 00000000 00000000 00000000  00000000 00000000  6627e8d5 e169c58d bc57ac4c 9b00dbd8
ffffffff ffffffff ffffffff ffffffff  ffffffff ffffffff  408f276d 41c83b0e a20bc7c6 6d5451fd
243f6a88 85a308d3 13198a2e 03707344  a4093822 299f31d0  d16cfe09 94fdcceb 5001e420 24126ea1
00000001 00000000 00000000 00000000  00000001 00000000  ac08141b dfc5ccbe 79c07a47 a7f66093
00000000 80000000 00000000 00000000  00000001 00000000  34a4d61d 340e4017 f6945830 e9f52b96
243f6a88 85a308d3 13198a2e 03707344  00000001 00000000  38527b8f fad9a48c 20e675c0 f2fea26a
00000000 00000000 00000001 00000000  00000000 00000001  7f6c13ff 114b2447 0550eced ea1fc805
00000000 00000000 80000000 00000000  00000000 00000001  d9da65af eced57ba c34d2661 91fe931f
452821e6 38d01377 be5466cf 34e90c6c  00000000 00000001  ac87a8c1 f240abdb add6c012 68a32a78
00000000 ffffffff 00000000 00000000  00000000 ffffffff  5f9c47aa 19861d86 ff2be81d 4c7db17e
00000000 00000000 00000000 80000000  00000000 ffffffff  2a460458 0a2709e5 47bc9115 0f96d8af
00000000 00000001 00000000 00000000  00000000 80000000  94f419f8 1116c316 99f2fa30 bc048ad6
00000000 00000000 ffffffff 00000000  00000000 80000000  601b5460 fe29678b 54510a02 c72ed094
a4093822 299f31d0 082efa98 ec4e6c89  00000000 80000000  aa74e81c c9ddb97b 2c2cd881 9390c78d
"""


def _known_answers():
    for line in KNOWN_ANSWERS.strip().splitlines():
        words = [int(w, 16) for w in line.split()]
        yield pytest.param(words[:4], words[4:6], words[6:], id=line.split()[0] + "-" + line.split()[4])


@pytest.mark.parametrize("counter,key,expected", list(_known_answers()))
def test_philox_gives_random123s_known_answers(counter, key, expected):
    assert [int(w) for w in philox4x32_10(counter, key)] == expected


def _python_philox(counter, key):
    """Philox4x32-10 in Python integers, in Random123's order (the key bumped before each round after the first),
    written apart from the module's."""
    c, k = list(counter), list(key)
    for i in range(10):
        if i:
            k = [(k[0] + 0x9E3779B9) % 2**32, (k[1] + 0xBB67AE85) % 2**32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 % 2**32, (p0 >> 32) ^ c[3] ^ k[1], p0 % 2**32]
    return c


def test_philox_over_tensors_of_counters_equals_philox_of_each_counter():
    rng = random.Random(58)
    counters = [[rng.getrandbits(32) for _ in range(4)] for _ in range(200)] + [[2**32 - 1] * 4, [0] * 4]
    key = (rng.getrandbits(32), rng.getrandbits(32))
    words = philox4x32_10([torch.tensor(column) for column in zip(*counters)], key)
    assert [[int(w[i]) for w in words] for i in range(len(counters))] == [_python_philox(c, key) for c in counters]


def test_mulhilo_splits_the_64_bit_product_exactly():
    rng = random.Random(4)
    words = [0, 1, 0xFFFF, 0x10000, 2**32 - 1] + [rng.getrandbits(32) for _ in range(1000)]
    for multiplier in (0xD2511F53, 0xCD9E8D57, 2**32 - 1):
        high, low = _mulhilo32(multiplier, torch.tensor(words))
        assert [(int(h) << 32) | int(lo) for h, lo in zip(high, low)] == [multiplier * w for w in words]


def test_the_counter_carries_the_offsets_low_word_into_its_high_word():
    low, high, sub_low, sub_high = _counter(2**32 - 1, torch.tensor([0, 1, 2]), torch.tensor([5, 2**32, 2**33 + 1]))
    assert low.tolist() == [2**32 - 1, 0, 1] and high.tolist() == [0, 1, 1]
    assert sub_low.tolist() == [5, 0, 1] and sub_high.tolist() == [0, 1, 2]


# ---- words to floats ------------------------------------------------------------------------------------------------

def _floats(words, dtype):
    return uniform_from_words(torch.tensor(words, dtype=torch.int64), dtype).tolist()


def test_a_word_becomes_a_float32_rounded_to_nearest_even_and_a_one_becomes_zero():
    # The word is rounded before the sum is: 2**24 + 1 is a tie that goes to the even 2**24, whose sum 2**-8 + 2**-33
    # rounds to 2**-8 (the sum of the word itself would round up). 2**32 - 129 rounds down to 2**32 - 256
    # (1 - 2**-24); 2**32 - 128 is a tie that goes to the even 2**32, which is 1.0 and so 0.0, as every word above it.
    assert _floats([0, 1, 2**24 + 1, 2**31, 2**32 - 129, 2**32 - 128, 2**32 - 1], torch.float32) == [
        2.0**-33, 3 * 2.0**-33, 2.0**-8, 0.5, 1 - 2.0**-24, 0.0, 0.0]


def test_a_word_becomes_a_half_or_bfloat16_from_its_float32_and_a_one_becomes_zero():
    # bfloat16 below 1 is spaced 2**-8: 1 - 2**-9 is a tie that goes to the even 1.0; half is spaced 2**-11
    bf16_tie, half_tie = 2**32 - 2**23, 2**32 - 2**20
    assert _floats([0, bf16_tie - 256, bf16_tie], torch.bfloat16) == [2.0**-33, 1 - 2.0**-8, 0.0]
    # 2**-33 is below half's smallest subnormal (2**-24): it rounds to 0
    assert _floats([0, half_tie - 256, half_tie], torch.float16) == [0.0, 1 - 2.0**-11, 0.0]


def test_a_pair_of_words_becomes_a_float64_of_53_bits_and_a_one_becomes_zero():
    # x ^ (y << 21): the pair (2**21 - 1, 2**32 - 1) is 2**53 - 1, whose value 1 - 2**-54 is a tie that goes to 1.0
    assert _floats([[0, 0], [0, 1], [2**21 - 1, 2**32 - 1]], torch.float64) == [2.0**-54, 2.0**-32 + 2.0**-54, 0.0]


def test_words_become_no_other_dtype():
    with pytest.raises(ValueError, match="int32"):
        uniform_from_words(torch.tensor([1]), torch.int32)


# ---- nvFuser's mapping ----------------------------------------------------------------------------------------------

def test_nvfuser_element_i_is_word_i_mod_4_of_the_call_at_subsequence_i_div_4():
    seed, offset = 2**40 + 3, 1001
    draws = nvfuser_uniform((37,), seed, offset).tolist()
    for i in (0, 1, 3, 4, 17, 36):
        word = _python_philox([offset, 0, i // 4, 0], [seed % 2**32, seed >> 32])[i % 4]
        assert draws[i] == _floats([word], torch.float32)[0], i


def test_nvfuser_float64_element_i_is_the_word_pair_i_mod_2_of_the_call_at_subsequence_i_div_2():
    draws = nvfuser_uniform((5,), 12345, 7, torch.float64).tolist()
    for i in range(5):
        words = _python_philox([7, 0, i // 2, 0], [12345, 0])
        assert draws[i] == _floats([words[2 * (i % 2): 2 * (i % 2) + 2]], torch.float64)[0], i


def test_nvfuser_draws_depend_on_the_elements_linear_index_not_the_shape():
    flat = nvfuser_uniform((455,), 12345, 7)
    assert torch.equal(nvfuser_uniform((7, 13, 5), 12345, 7), flat.reshape(7, 13, 5))
    assert torch.equal(nvfuser_uniform((10,), 12345, 7), flat[:10])
    assert nvfuser_uniform((0, 3), 12345, 7).shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfuser_half_draws_are_its_float32_draws_rounded(dtype):
    as_float = nvfuser_uniform((4, 512), 0, 7)
    rounded = as_float.to(dtype)
    assert torch.equal(nvfuser_uniform((4, 512), 0, 7, dtype), torch.where(rounded == 1, 0.0, rounded))


def test_a_seed_read_as_a_negative_int64_draws_as_its_64_bits():
    assert torch.equal(nvfuser_uniform((9,), -7, 3), nvfuser_uniform((9,), 2**64 - 7, 3))


def test_other_seeds_and_offsets_draw_other_numbers():
    base = nvfuser_uniform((64,), 0, 0)
    for seed, offset in ((1, 0), (0, 1), (2**32, 0), (0, 2**32)):
        assert (nvfuser_uniform((64,), seed, offset) != base).float().mean() > 0.9, (seed, offset)


def test_a_million_nvfuser_draws_are_uniform_and_keep_nine_tenths_below_point_nine():
    draws = nvfuser_uniform((1000, 1000), 5, 11)
    assert 0 <= draws.min() and draws.max() < 1
    counts = torch.histc(draws, bins=16, min=0, max=1)
    assert ((counts - 62500).abs() < 5 * 62500**0.5).all(), counts  # 5 sigma of each bin's count
    assert abs((draws < 0.9).float().mean().item() - 0.9) < 5 * (0.09 / 1e6) ** 0.5


# ---- torch's CUDA generator -----------------------------------------------------------------------------------------

H100_THREADS = dict(multiprocessors=132, max_threads_per_multiprocessor=2048)


def test_torch_launches_blocks_of_256_up_to_what_the_device_holds():
    assert torch_cuda_threads(3, **H100_THREADS) == 256
    assert torch_cuda_threads(1001, **H100_THREADS) == 1024
    assert torch_cuda_threads(2048 * 3071, **H100_THREADS) == 132 * 8 * 256


def test_torch_element_i_is_drawn_by_thread_i_mod_threads_a_stride_of_threads_per_word():
    threads = 256
    draws = torch_cuda_uniform((3000,), 9, 40, threads=threads).tolist()
    for i in (0, 1, 255, 256, 1023, 1024, 2999):
        step, word = divmod(i // threads, 4)
        expected = _python_philox([40 // 4 + step, 0, i % threads, 0], [9, 0])[word]
        assert draws[i] == _floats([expected], torch.float32)[0], i


def test_nvfuser_and_torch_draw_the_same_numbers_at_other_places():
    # nvFuser's element 4j is word 0 of subsequence j at the offset, as torch's element j while j < threads: so only
    # element 0 sits at the same place in both (as measured on an H100: for (3,) elements 1 and 2 differ, for (1001,)
    # one element in 1001 is equal, for seeds 0, 12345, 2**40 + 3 and nvFuser offsets 0, 7, 1001)
    for seed in (0, 12345, 2**40 + 3):
        for offset in (0, 7, 1001):
            ours = nvfuser_uniform((1001,), seed, offset)
            theirs = torch_cuda_uniform((1001,), seed, 4 * offset, threads=torch_cuda_threads(1001, **H100_THREADS))
            assert torch.equal(ours[::4], theirs[:251]), (seed, offset)
            assert (ours == theirs).nonzero().flatten().tolist() == [0], (seed, offset)


def test_torch_cuda_offsets_are_multiples_of_4():
    with pytest.raises(ValueError, match="multiples of 4"):
        torch_cuda_uniform((3,), 0, 7, threads=256)


# ---- on the device --------------------------------------------------------------------------------------------------

SHAPES = [(1,), (3,), (7, 13, 5), (4, 512, 768), (2048, 3071)]
HALF_AND_FLOAT = [torch.float32, torch.bfloat16, torch.float16]
SEEDS_AND_OFFSETS = [(0, 0), (12345, 7), (2**40 + 3, 1001)]


def _nvfuser_executor():
    from thunder.executors.nvfuserex import nvfuserex

    if nvfuserex is None:
        pytest.skip("Thunder finds no nvFuser here")
    return nvfuserex


@pytest.fixture(scope="module")
def nvfuser_draws():
    """Thunder's `uniform_philox` run by nvFuser alone: (shape, seed, offset, dtype) -> the draws."""
    import thunder
    import thunder.torch as ltorch

    jitted = {}

    def draws(shape, seed, offset, dtype):
        # one jitted function per dtype, the dtype a constant of it: Thunder's cache does not tell calls apart by a
        # dtype argument (a float64 call reran the float32 trace)
        if dtype not in jitted:
            jitted[dtype] = thunder.jit(
                lambda shape, seed, offset: ltorch.uniform_philox(shape, device="cuda", dtype=dtype, seed=seed,
                                                                  offset=offset),
                executors=[_nvfuser_executor()])
        out = jitted[dtype](shape, seed, offset)
        assert "uniform_philox" in str(thunder.last_traces(jitted[dtype])[-1])
        assert out.dtype == dtype, (out.dtype, dtype)
        return out

    return draws


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float64: torch.int64, torch.float32: torch.int32}.get(t.dtype, torch.int16))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF_AND_FLOAT, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_on_cuda_nvfuser_uniform_is_nvfusers_uniform_philox_bit_for_bit(nvfuser_draws, shape, dtype):
    for seed, offset in SEEDS_AND_OFFSETS:
        theirs = nvfuser_draws(shape, seed, offset, dtype)
        ours = nvfuser_uniform(shape, seed, offset, dtype, device="cuda")
        differ = (_bits(ours) != _bits(theirs)).sum().item()
        assert differ == 0, f"seed {seed}, offset {offset}: {differ} of {ours.numel()} differ"


@pytest.mark.cuda
def test_on_cuda_nvfuser_uniform_in_float64_and_from_a_negative_seed_is_nvfusers(nvfuser_draws):
    for shape, seed, offset, dtype in (((7, 13, 5), 12345, 7, torch.float64), ((4, 512, 768), -(2**62) - 11, 3,
                                                                                torch.float32)):
        theirs = nvfuser_draws(shape, seed, offset, dtype)
        assert torch.equal(_bits(nvfuser_uniform(shape, seed, offset, dtype, device="cuda")), _bits(theirs))


@pytest.mark.cuda
def test_on_cuda_the_draws_are_the_same_computed_on_cpu_and_on_cuda():
    for dtype in (*HALF_AND_FLOAT, torch.float64):
        on_cpu = nvfuser_uniform((4, 512, 768), 2**40 + 3, 1001, dtype)
        assert torch.equal(_bits(nvfuser_uniform((4, 512, 768), 2**40 + 3, 1001, dtype, "cuda").cpu()), _bits(on_cpu))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [*HALF_AND_FLOAT, torch.float64], ids=str)
def test_on_cuda_torch_cuda_uniform_is_torch_rand_bit_for_bit(dtype):
    properties = torch.cuda.get_device_properties(0)
    for shape in SHAPES:
        for seed, offset in SEEDS_AND_OFFSETS:
            numel = torch.Size(shape).numel()
            with torch.random.fork_rng(devices=[0]):
                torch.cuda.set_rng_state(torch.cat([torch.tensor([seed]).view(torch.uint8),
                                                    torch.tensor([4 * offset]).view(torch.uint8)]))
                theirs = torch.rand(shape, device="cuda", dtype=dtype)
            threads = torch_cuda_threads(numel, properties.multi_processor_count,
                                         properties.max_threads_per_multi_processor)
            ours = torch_cuda_uniform(shape, seed, 4 * offset, dtype, "cuda", threads=threads)
            assert torch.equal(_bits(ours), _bits(theirs)), (shape, seed, offset)


def _generator_state():
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    return generator.initial_seed(), generator.get_offset()


def _kept(x, seed, offset, p, k=0):
    """x * (u < 1 - p) * (1 / (1 - p)) with u drawn as nvFuser does at the k-th offset after the generator's state
    (Thunder takes one nvFuser offset per dropout); the comparison in float32, as Thunder computes half and bfloat16."""
    draws = nvfuser_uniform(x.shape, seed, offset // 4 + k, x.dtype, x.device)
    return x * (draws.float() < 1 - p) * (1 / (1 - p))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF_AND_FLOAT, ids=str)
@pytest.mark.parametrize("shape", [(7, 13, 5), (4, 512, 768), (2048, 3071)], ids=str)
def test_on_cuda_a_dropout_thunder_runs_with_nvfuser_is_x_times_the_mask_of_our_draws(shape, dtype):
    import thunder

    p = 0.1
    jitted = thunder.jit(lambda x: torch.nn.functional.dropout(x, p=p, training=True),
                         executors=[_nvfuser_executor()])
    torch.cuda.manual_seed(2**63 + 5)  # a seed Thunder reads as a negative int64
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    jitted(x)
    assert "uniform_philox" in str(thunder.last_traces(jitted)[-1])
    seed, offset = _generator_state()
    out = jitted(x)
    assert _generator_state() == (seed, offset + 4)
    expected = _kept(x.detach(), seed, offset, p)
    assert torch.equal(out, expected), f"{(out != expected).sum().item()} of {out.numel()} differ"
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.equal(x.grad, _kept(grad, seed, offset, p)), "the backward applies another mask"


@pytest.mark.cuda
def test_on_cuda_two_dropouts_in_one_call_take_consecutive_offsets_in_program_order_and_fused_ops_change_nothing():
    import thunder

    def two_dropouts(x, w, y):
        return torch.nn.functional.dropout(x * w, p=0.1), torch.nn.functional.dropout(y, p=0.25)

    jitted = thunder.jit(two_dropouts, executors=[_nvfuser_executor()])
    x, w, y = (torch.randn(4, 512, 768, device="cuda") for _ in range(3))
    jitted(x, w, y)
    seed, offset = _generator_state()
    first, second = jitted(x, w, y)
    assert _generator_state() == (seed, offset + 8)
    assert torch.equal(first, _kept(x * w, seed, offset, 0.1, k=0))
    assert torch.equal(second, _kept(y, seed, offset, 0.25, k=1))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_eager_draws_are_f_dropouts_and_a_reference_in_another_dtype_keeps_the_first_runs_mask(device):
    """An executor's own dropout ("eager") is F.dropout from the generator's state, bit for bit; the float64
    reference after it applies the mask the run's dtype kept, not a mask of its own (CUDA's dropout kernel draws
    otherwise for float64 than for bfloat16; here the generator is not even reset between the runs)."""
    from thunderfx_debug.scripts.philox_draws import DrawnAsRun

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(4, 512, 768, device=device, dtype=dtype)
    torch.manual_seed(7)
    expected = torch.nn.functional.dropout(x, p=0.1)
    dtypes, masks = [], []
    torch.manual_seed(7)
    with DrawnAsRun("eager", dtypes=dtypes, masks=masks):
        out = torch.nn.functional.dropout(x, p=0.1)
    assert torch.equal(out, expected) and dtypes == [dtype] and masks[0].dtype == torch.bool
    with DrawnAsRun("eager", dtypes=dtypes, masks=masks) as drawn:
        wide = torch.nn.functional.dropout(x.double(), 0.1, True)
    assert drawn.calls == 1
    assert torch.equal(wide != 0, (expected != 0) | ((x == 0) & masks[0]))
    assert torch.equal(wide, x.double() * masks[0] * (1 / (1 - 0.1)))
    with DrawnAsRun("eager", dtypes=dtypes, masks=masks):
        assert torch.equal(torch.nn.functional.dropout(x, 0.1, training=False), x)  # not in training: as it is
