"""The uniform numbers a CUDA run drew, drawn again in torch integer ops on any device: nvFuser's (`nvfuser_uniform`,
what a dropout region draws from Thunder's `uniform_philox`) and torch's CUDA generator's (`torch_cuda_uniform`, what
`torch.rand` and `rngprims.philox_rand` draw). Both are Philox4x32-10 (Random123; `philox4x32_10`) keyed by the seed,
with the offset in the counter's low 64 bits and a subsequence in its high 64 bits, and both turn a 32-bit word into a
float the same way (`uniform_from_words`); they differ in which counter, subsequence and word each element takes, so
the same seed and offset give other numbers (element 0 alone agrees): a reference for an nvFuser region must draw
nvFuser's way.

Read from nvFuser at commit 3925c6fd (2026-02-20, the commit that set python/version.txt to 0.2.36; these files are
unchanged up to 81c4b22f, 2026-04-03):
- runtime/random_numbers.cu: `philox(seed, subsequence, offset)`, counter = {offset lo, offset hi, subsequence lo,
  subsequence hi}, key = {seed lo, seed hi}; `raw_uniform_float(x) = (float)x * 2**-32 + 2**-33` with 1.0 mapped to 0
  (`uniformf`); half and bfloat16 round that float (cvt.rn, runtime/casts.cu) and map 1 to 0 (`uniform_half`,
  `uniform_bfloat`); double takes two words, `x ^ (y << 21)`, as 53 bits (`uniform`).
- csrc/device_lower/pass/rng.cpp (`RNGInserter::handle`): subsequence = linear index / multiple, component = linear
  index % multiple, where multiple is 4, or 2 for double (csrc/ir/internal_nodes.h, `RNGOp::getPhiloxMultiple`), and
  the linear index is the element's row-major index in the RNG op's output (csrc/device_lower/pass/index.cpp,
  `Index::getLinearLogicalIndex`); the op's offset goes into `philox` as it is. Thunder's offset is already nvFuser's
  unit, a quarter of PyTorch's (thunder/executors/torchex.py `_get_and_update_rng_state_impl`; nvFuser's
  "Note [Divide offset by 4]", csrc/rng.cpp).
- csrc/ops/arith.cpp `uniform`: bounds 0 and 1 give the plain `rng_uniform` (dropout's case, the only one here).
Read from PyTorch (aten/src/ATen/native/cuda/DistributionTemplates.h, `distribution_elementwise_grid_stride_kernel`,
`calc_execution_policy`, `uniform_kernel`): each thread `curand_init(seed, thread, offset)` draws 4 words per step
(2 doubles), element `thread + blockDim * gridDim * (unroll * step + word)`.
"""

import math

import torch

_WORD = 0xFFFFFFFF
_PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_PHILOX_KEY_BUMPS = (0x9E3779B9, 0xBB67AE85)
_PHILOX_ROUNDS = 10


def _mulhilo32(multiplier: int, word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The high and low 32 bits of `multiplier * word` (both below 2**32). The product needs 64 bits, past int64: the
    word is split into 16-bit halves, whose products (below 2**48) int64 holds exactly."""
    low_product = (word & 0xFFFF) * multiplier
    high_product = (word >> 16) * multiplier
    low_sum = low_product + ((high_product & 0xFFFF) << 16)
    return (high_product >> 16) + (low_sum >> 32), low_sum & _WORD


def philox4x32_10(counter, key) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 (Salmon et al., SC'11; Random123's `philox4x32_10`, nvFuser's `philox`, cuRAND's
    `curand_Philox4x32_10`): four 32-bit counter words and two key words in, four words out, each an int64 tensor
    in [0, 2**32). Counter words are tensors or ints (broadcast together), key words ints.

    >>> [f"{int(w):08x}" for w in philox4x32_10((0, 0, 0, 0), (0, 0))]
    ['6627e8d5', 'e169c58d', 'bc57ac4c', '9b00dbd8']
    """
    words = [torch.as_tensor(w, dtype=torch.int64) for w in counter]
    device = next((w.device for w in words if w.ndim), words[0].device)
    c0, c1, c2, c3 = torch.broadcast_tensors(*(w.to(device) for w in words))
    k0, k1 = (int(k) & _WORD for k in key)
    for round_ in range(_PHILOX_ROUNDS):
        if round_:
            k0, k1 = (k0 + _PHILOX_KEY_BUMPS[0]) & _WORD, (k1 + _PHILOX_KEY_BUMPS[1]) & _WORD
        high0, low0 = _mulhilo32(_PHILOX_MULTIPLIERS[0], c0)
        high1, low1 = _mulhilo32(_PHILOX_MULTIPLIERS[1], c2)
        c0, c1, c2, c3 = high1 ^ c1 ^ k0, low1, high0 ^ c3 ^ k1, low0
    return c0, c1, c2, c3


def uniform_from_words(words: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uniform numbers in [0, 1) from 32-bit words (int64 tensor in [0, 2**32)), as nvFuser's `uniformf`,
    `uniform_half`, `uniform_bfloat` and cuRAND's `curand_uniform` with torch's `uniform_kernel` make them: the word
    rounded to float, times 2**-32, plus 2**-33, a 1.0 taken as 0. For float64 the words come in pairs, (x, y) along
    a last dimension of 2 that the result drops, `x ^ (y << 21)` as 53 bits (`uniform`, `_curand_uniform_double_hq`).

    The CUDA code computes `(float)x * scale + scale / 2`, contracted to a fused multiply-add or not: the product is
    exact (scale is a power of two), so either way the result is the sum rounded once. Here the sum is exact in
    float64 and rounded once to float32; float32 to half and bfloat16 round to nearest even, as cvt.rn does.

    >>> uniform_from_words(torch.tensor([0, 2**31, 2**32 - 129, 2**32 - 128]), torch.float32).tolist()
    [1.1641532182693481e-10, 0.5, 0.9999999403953552, 0.0]
    """
    if dtype == torch.float64:
        bits53 = words[..., 0] ^ (words[..., 1] << 21)
        values = bits53.to(torch.float64) * 2.0**-53 + 2.0**-54
        return torch.where(values == 1.0, 0.0, values)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"uniform draws are float64, float32, float16 or bfloat16, not {dtype}")
    word_as_float = words.to(torch.float64).to(torch.float32)  # int64 -> float64 is exact below 2**53
    values = (word_as_float.to(torch.float64) * 2.0**-32 + 2.0**-33).to(torch.float32).to(dtype)
    return torch.where(values == 1.0, 0.0, values)


def _counter(offset: int, steps: torch.Tensor | int, subsequences: torch.Tensor | int) -> tuple:
    """Philox's counter words for `offset + steps` (64 bits) and the subsequences (64 bits)."""
    low = torch.as_tensor(steps, dtype=torch.int64) + (offset & _WORD)
    high = (offset >> 32) + (low >> 32)  # the carry of the low word: what cuRAND's 128-bit increment does
    subsequences = torch.as_tensor(subsequences, dtype=torch.int64)
    return low & _WORD, high & _WORD, subsequences & _WORD, (subsequences >> 32) & _WORD


def _key(seed: int) -> tuple[int, int]:
    seed &= 2**64 - 1  # a seed read as int64 (Thunder's `view(torch.int64)`) is the same 64 bits
    return seed & _WORD, seed >> 32


def _elements_per_call(dtype: torch.dtype) -> int:
    """Elements per Philox call: 4 of one word each, or 2 of two words each for float64."""
    return 2 if dtype == torch.float64 else 4


def _uniform_per_component(words: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(calls, 4) words -> (calls, elements per call) uniform numbers, component by component."""
    return uniform_from_words(words.reshape(len(words), -1, 2) if dtype == torch.float64 else words, dtype)


def nvfuser_uniform(shape, seed: int, offset: int, dtype: torch.dtype = torch.float32,
                    device="cpu") -> torch.Tensor:
    """What nvFuser's `uniform(0, 1, shape, rng_seed=seed, rng_offset=offset, dtype)` draws (Thunder's
    `uniform_philox(shape, seed=seed, offset=offset)` in an nvFusion region), bit for bit, on any device. `offset`
    is in nvFuser's (and Thunder's) unit, a quarter of the CUDA generator's: `gen.get_offset() // 4` before the call.

    Element i (row-major) is component i % 4 of `philox(counter = (offset, i // 4), key = seed)` (for float64,
    words 2(i % 2) and 2(i % 2) + 1 of `philox(counter = (offset, i // 2))`).

    A reference's draw, never compiled: inductor spends minutes on ten Philox rounds of int64 ops (the scripts that
    compile a region's torch code draw with torch's philox_rand instead, as Thunder's torch.compile executor does).

    >>> nvfuser_uniform((2, 3), seed=0, offset=0).shape
    torch.Size([2, 3])
    """
    # outside any torch function mode: a float64 reference (`judging_rule.Float64Mode`) must draw the run's numbers
    with torch._C.DisableTorchFunction():
        numel = math.prod(shape)
        calls = torch.arange(-(-numel // _elements_per_call(dtype)), dtype=torch.int64, device=device)
        words = torch.stack(philox4x32_10(_counter(int(offset), 0, calls), _key(int(seed))), dim=-1)
        return _uniform_per_component(words, dtype).reshape(-1)[:numel].reshape(tuple(shape))


#: `nvfuser_uniform` as a torch.library custom op (`define_nvfuser_uniform_op`): its namespace and name.
NVFUSER_UNIFORM_OP = ("thunderfx_debug_repro", "nvfuser_uniform")


def _nvfuser_uniform_packet():
    namespace, name = NVFUSER_UNIFORM_OP
    return getattr(getattr(torch.ops, namespace), name)


def define_nvfuser_uniform_op():
    """Defines `nvfuser_uniform` as a torch.library custom op, once per process, and returns it: one op that
    torch.compile calls as it is (inductor spends minutes compiling ten Philox rounds of int64 ops) while it compiles
    the ops around it, fullgraph. What an inductor script of an nvFusion region calls to draw nvFuser's numbers; defined
    there, before the compile, not where the package is imported."""
    namespace, name = NVFUSER_UNIFORM_OP
    if not hasattr(getattr(torch.ops, namespace), name):
        @torch.library.custom_op(f"{namespace}::{name}", mutates_args=())
        def op(shape: list[int], seed: int, offset: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return nvfuser_uniform(shape, seed, offset, dtype, device)

        @op.register_fake
        def _(shape, seed, offset, dtype, device):
            return torch.empty(shape, dtype=dtype, device=device)

    return _nvfuser_uniform_packet().default


def nvfuser_uniform_opaque(shape, seed: int, offset: int, dtype: torch.dtype = torch.float32,
                           device="cpu") -> torch.Tensor:
    """`nvfuser_uniform` through its custom op (`define_nvfuser_uniform_op`, which must have run): what an inductor
    script's region function calls."""
    return _nvfuser_uniform_packet()(list(shape), seed, offset, dtype, torch.device(device))


def compared_in_float32(a, b, comparison: str) -> torch.Tensor:
    """`torch.<comparison>(a, b)` ("lt", "le", "gt", "ge", "eq", "ne") with a half or bfloat16 tensor taken to float32
    first, as nvFuser compares one with a number: torch casts the number to the tensor's dtype instead (0.9 becomes
    bfloat16's 0.8984375), and a dropout's `u < 0.9` then keeps other elements than nvFuser's (those drawn to 0.8984375:
    0.4 % of them).

    >>> u = torch.tensor([0.8984375], dtype=torch.bfloat16)
    >>> bool(torch.lt(u, 0.9)), bool(compared_in_float32(u, 0.9, "lt"))
    (False, True)
    """
    def widened(value):
        if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
            return value.to(torch.float32)
        return value

    return getattr(torch, comparison)(widened(a), widened(b))


def torch_cuda_threads(numel: int, multiprocessors: int, max_threads_per_multiprocessor: int) -> int:
    """The threads (blockDim.x * gridDim.x) torch's CUDA generator launches for `numel` random elements
    (`calc_execution_policy`: blocks of 256, at most as many as the device holds at once)."""
    block = 256
    blocks = min(multiprocessors * (max_threads_per_multiprocessor // block), -(-numel // block))
    return block * max(blocks, 1)


def torch_cuda_uniform(shape, seed: int, offset: int, dtype: torch.dtype = torch.float32, device="cpu", *,
                       threads: int) -> torch.Tensor:
    """What `torch.rand(shape, dtype=dtype)` draws on CUDA when the generator holds `seed` and `offset` (PyTorch's
    unit, a multiple of 4), which is what `torch.ops.rngprims.philox_rand(shape, seed, offset, ...)` draws. `threads`
    is `torch_cuda_threads(numel, ...)` with the properties of the device that drew them.

    Element i is drawn by thread t = i % threads in step s = i // (threads * unroll), as component (i // threads) %
    unroll of `philox(counter = (offset / 4 + s, t), key = seed)`; unroll is 4 (2 for float64). Torch draws 2**31
    elements or more in several launches; not modelled.

    >>> torch_cuda_uniform((3,), 0, 0, threads=256)[0] == nvfuser_uniform((3,), 0, 0)[0]
    tensor(True)
    """
    numel = math.prod(shape)
    if numel >= 2**31:
        raise ValueError(f"{numel} elements: torch draws that many in several launches, which this does not model")
    if offset % 4:
        raise ValueError(f"offset {offset}: the CUDA generator's offsets are multiples of 4")
    unroll = _elements_per_call(dtype)
    steps = -(-numel // (threads * unroll))
    step, thread = torch.meshgrid(torch.arange(steps, device=device), torch.arange(threads, device=device),
                                  indexing="ij")
    words = torch.stack(philox4x32_10(_counter(offset // 4, step.reshape(-1), thread.reshape(-1)), _key(seed)),
                        dim=-1)
    # (step, thread, component) -> (step, component, thread): in each step the threads write one component after the
    # other, each a stride of `threads` apart
    per_step = _uniform_per_component(words, dtype).reshape(steps, threads, unroll).transpose(1, 2)
    return per_step.reshape(-1)[:numel].reshape(shape)


def thunder_seed_and_offset(cuda_state: torch.Tensor) -> tuple[int, int]:
    """The seed and offset Thunder's `get_and_update_rng_state` reads from a CUDA generator's state
    (`torch.cuda.get_rng_state()`: the seed's and the offset's 8 bytes each): the offset in nvFuser's unit, a quarter
    of the generator's (thunder/executors/torchex.py, `_get_and_update_rng_state_impl`)."""
    seed, offset = torch.chunk(cuda_state, 2)
    return int(seed.view(torch.int64).item()), int(offset.view(torch.int64).item()) // 4


#: How a run drew its dropouts, where they can be drawn again (`DrawnAsRun`): "nvfuser" (Thunder's `uniform_philox`
#: in nvFusion regions: `nvfuser_uniform` at the generator's offset / 4, one offset per dropout in program order),
#: "torch_uniform" (Thunder's torch executor: `torch.empty(...).uniform_()` from the generator's state, one draw per
#: dropout in program order), "eager" (an executor's own dropout op, drawn as eager's F.dropout from the generator's
#: state).
DRAWS = ("nvfuser", "torch_uniform", "eager")


class DrawnAsRun(torch.overrides.TorchFunctionMode):
    """Runs the dropouts of eager code as the run drew them (`DRAWS`): each call of `F.dropout` in training with
    0 < p < 1, k-th in program order, becomes Thunder's `x * (u < 1 - p) * (1 / (1 - p))` with u the run's draws
    (`compared_in_float32`, as nvFuser compares a half or bfloat16 draw), for "nvfuser" and "torch_uniform"; for
    "eager", F.dropout as ATen computes it (`dropout_as_aten`). `seed` and `offset` are the CUDA generator's seed and
    nvFuser's offset (a quarter of the generator's) before the run's call. `dtypes` (the dtype each dropout's input
    had in the run) and `masks` (what each "eager" dropout kept) are filled by a first run in the run's dtypes and
    kept for the next: a float64 reference draws the run's numbers and keeps the run's mask, not float64 ones (CUDA's
    dropout kernel draws otherwise for another dtype).

    >>> x = torch.ones(4, 4)
    >>> with DrawnAsRun("nvfuser", seed=0, offset=0) as drawn:
    ...     y = torch.nn.functional.dropout(x, p=0.5)
    >>> bool(((y == 0) | (y == 2)).all()), drawn.calls
    (True, 1)
    """

    def __init__(self, how: str, seed: int = 0, offset: int = 0, dtypes=None, masks=None):
        super().__init__()
        if how not in DRAWS:
            raise ValueError(f"draws are one of {', '.join(DRAWS)}, not {how!r}")
        self.how, self.seed, self.offset = how, seed, offset
        self.dtypes = dtypes if dtypes is not None else []
        self.masks = masks if masks is not None else []
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in (torch.nn.functional.dropout, torch.dropout):
            return func(*args, **kwargs)
        x, p, training, inplace = _dropout_arguments(func, args, kwargs)
        if not training or not 0 < p < 1 or (self.how == "eager" and inplace):
            return func(*args, **kwargs)
        k = self.calls
        self.calls += 1
        if k == len(self.dtypes):
            self.dtypes.append(x.dtype)
        if self.how == "eager":
            if x.dtype == self.dtypes[k] or k >= len(self.masks):
                out, keep = dropout_as_aten(x, p)
                self.masks[k:k + 1] = [keep]
                return out
            return x * self.masks[k] * (1 / (1 - p))  # the run's mask, in this reference's dtype
        if self.how == "nvfuser":
            drawn = nvfuser_uniform(x.shape, self.seed, self.offset + k, self.dtypes[k], x.device)
        else:
            drawn = torch.empty(x.shape, device=x.device, dtype=self.dtypes[k]).uniform_(0.0, 1.0)
        keep = compared_in_float32(drawn, 1 - p, "lt")
        return x * keep * (1 / (1 - p))


def dropout_as_aten(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """F.dropout(x, p) in training, computed as ATen's `at::native::dropout` (aten/src/ATen/native/Dropout.cpp)
    computes it, the same draws and the same rounding, and the mask it kept: on CUDA (its `is_fused_kernel_acceptable`:
    a non-empty CUDA or XPU tensor) `native_dropout`, which returns that mask; elsewhere `_dropout`, noise from
    `bernoulli_(1 - p)` divided by 1 - p. Written out because F.dropout returns no mask."""
    if x.device.type in ("cuda", "xpu") and x.numel() > 0:
        return torch.native_dropout(x, p, True)
    noise = torch.empty_like(x).bernoulli_(1 - p)
    noise.div_(1 - p)
    return x * noise, noise != 0


def _dropout_arguments(func, args, kwargs):
    """(input, p, training, inplace) of a call of F.dropout(input, p=0.5, training=True, inplace=False) or
    torch.dropout(input, p, train)."""
    names = (("input", "p", "training", "inplace") if func is torch.nn.functional.dropout
             else ("input", "p", "train"))
    defaults = {"p": 0.5, "training": True, "inplace": False}
    values = [args[i] if i < len(args) else kwargs.get(name, defaults.get(name)) for i, name in enumerate(names)]
    return values[0], float(values[1]), bool(values[2]), bool(values[3]) if len(values) > 3 else False
