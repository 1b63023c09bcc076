"""What the benchmarks share: the zoo of Hugging Face models built from configs (no weights, no network), at two
sizes; Thunder's executors per device; one training loop with its clock; the interleaved rounds and their paired
ratios; and the JSON record every benchmark writes.

Sizes (a `Size`, or its name in SIZES):
  tiny       1 layer, hidden 32, sequence 16, batch 2: CPU tests, float32.
  realistic  4 layers, hidden 768, 12 heads, sequence 512, batch 4, vocabulary 32000: the H200 in bf16, where
             nvFuser picks other kernels and strides differ from a tiny config's.

Models: decoders (Llama, Mistral, Qwen2, Qwen3, GPT-2, Phi3, Gemma, GPT-NeoX, OPT), a Mixtral mixture of experts
(4 experts, top 2; one sequence per batch on CPU, see CPU_BATCH_OF_ONE), BERT and T5 (encoder and decoder, its
relative-position buckets computed in the graph). Every model trains in train mode with dropout off (so that each piece
can be compared with eager), but for the `-dropout` variants, which keep the configuration's dropout (0.1). The last
sequence of a batch ends in two padding positions (attention_mask 0, labels -100), so that the models' mask paths are
traced; BERT predicts three masked positions per sequence. No KV cache (its torch.cat would be one more inductor split
per decoder).

    import harness
    model, batch = harness.build("llama", "realistic", device="cuda", dtype="bfloat16")

A benchmark is a script in this folder; the scripts put it on sys.path themselves (`sys.path.insert(0, HERE)`), so
that they import it from any working directory, and tests import it through tests/harness_path.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

MODELS = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "phi3", "gemma", "gptneox", "opt", "bert", "gpt2-dropout",
          "bert-dropout", "mixtral", "t5", "t5-dropout")


@dataclasses.dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    seq: int
    batch: int
    experts: int = 4  # a mixture of experts' experts, and how many of them each token goes to
    experts_per_token: int = 2


SIZES = {
    # 2 heads of 16, 1 KV head (grouped-query attention where the model has it)
    "tiny": Size(layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64, vocab=128, seq=16, batch=2),
    # 12 heads of 64, 4 KV heads
    "realistic": Size(layers=4, hidden=768, heads=12, kv_heads=4, intermediate=2048, vocab=32000, seq=512, batch=4),
}


def config_for(name: str, size: Size):
    """(model class, config) of a zoo model (the architecture's name without the "-dropout" suffix)."""
    import transformers as tf

    base = name.removesuffix("-dropout")
    head_dim = size.hidden // size.heads
    common = dict(vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
                  num_hidden_layers=size.layers, num_attention_heads=size.heads,
                  max_position_embeddings=max(64, 2 * size.seq))
    gqa = dict(common, num_key_value_heads=size.kv_heads)
    if base == "llama":
        return tf.LlamaForCausalLM, tf.LlamaConfig(**gqa)
    if base == "mixtral":
        return tf.MixtralForCausalLM, tf.MixtralConfig(**gqa, num_local_experts=size.experts,
                                                       num_experts_per_tok=size.experts_per_token)
    if base == "mistral":
        return tf.MistralForCausalLM, tf.MistralConfig(**gqa, sliding_window=None)
    if base == "qwen2":
        return tf.Qwen2ForCausalLM, tf.Qwen2Config(**gqa)
    if base == "qwen3":
        return tf.Qwen3ForCausalLM, tf.Qwen3Config(**gqa, head_dim=head_dim)
    if base == "phi3":
        return tf.Phi3ForCausalLM, tf.Phi3Config(**gqa, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if base == "gemma":
        return tf.GemmaForCausalLM, tf.GemmaConfig(**gqa, head_dim=head_dim)
    if base == "gptneox":
        return tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(**common, rotary_pct=0.25)
    if base == "opt":
        return tf.OPTForCausalLM, tf.OPTConfig(vocab_size=size.vocab, hidden_size=size.hidden, ffn_dim=4 * size.hidden,
                                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                               max_position_embeddings=max(64, 2 * size.seq),
                                               word_embed_proj_dim=size.hidden, pad_token_id=1)
    if base == "gpt2":
        return tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=size.vocab, n_embd=size.hidden, n_layer=size.layers,
                                                 n_head=size.heads, n_positions=max(64, 2 * size.seq),
                                                 n_inner=4 * size.hidden if size.hidden >= 768 else size.intermediate,
                                                 bos_token_id=1, eos_token_id=2)
    if base == "t5":  # encoder and decoder of `layers` each; the relative-position buckets index a table of 8 or 32
        return tf.T5ForConditionalGeneration, tf.T5Config(
            vocab_size=size.vocab, d_model=size.hidden, d_kv=head_dim, d_ff=size.intermediate, num_layers=size.layers,
            num_heads=size.heads, relative_attention_num_buckets=8 if size.hidden < 768 else 32,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    if base == "bert":
        return tf.BertForMaskedLM, tf.BertConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                                                 num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                                 intermediate_size=4 * size.hidden if size.hidden >= 768
                                                 else size.intermediate,
                                                 max_position_embeddings=max(64, 2 * size.seq), type_vocab_size=2)
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


#: Thunder 0.2.6 on torch 2.13 (CPU) fails on a Mixtral batch of more than one sequence, plain ThunderCompiler too
#: ("Attempting to reshape a.shape=(2, 24) to shape=(1, 24)" in its alias handling): on CPU it trains on one.
CPU_BATCH_OF_ONE = ("mixtral",)


def build(name: str, size: str | Size = "tiny", device: str = "cpu", dtype: str = "float32", seed: int = 0):
    """(model, batch): the model in train mode and the keyword arguments of one batch (see the module docstring)."""
    import torch

    shape = SIZES[size] if isinstance(size, str) else size
    if name in CPU_BATCH_OF_ONE and not str(device).startswith("cuda"):
        shape = dataclasses.replace(shape, batch=1)  # see CPU_BATCH_OF_ONE
    torch.manual_seed(seed)
    cls, config = config_for(name, shape)
    config.use_cache = False
    if not name.endswith("-dropout"):
        for key, value in config.to_dict().items():
            if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
                setattr(config, key, 0.0)
    config._attn_implementation = "sdpa"
    model = cls(config).to(device, getattr(torch, dtype)).train()
    return model, batch_for(name, shape, device, seed)


def batch_for(name: str, size: Size, device: str, seed: int = 0) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, size.vocab, (size.batch, size.seq), generator=generator)
    attention_mask = torch.ones(size.batch, size.seq, dtype=torch.long)
    labels = input_ids.clone()
    attention_mask[-1, -2:] = 0
    labels[-1, -2:] = -100
    if name.startswith("bert"):
        labels = torch.full_like(input_ids, -100)
        labels[:, [1, 5, 9]] = input_ids[:, [1, 5, 9]]
        input_ids[:, [1, 5, 9]] = 3  # a stand-in [MASK] id
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return {key: value.to(device) for key, value in batch.items()}


def executors(device: str, names: str | Sequence[str] | None = None) -> list | None:
    """Thunder's executors of a benchmark run: the named ones (a comma list or a sequence); else None (Thunder's
    defaults, nvFuser fusing) on CUDA, and on CPU, where the defaults fuse nothing, its torch.compile executor first.
    An unknown name is a SystemExit that lists the executors Thunder has."""
    import thunderfx_debug  # noqa: F401  (its version workarounds before thunder is imported)
    import thunder

    if names is not None:
        wanted = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        wanted = [n for n in wanted if n]
        unknown = [n for n in wanted if thunder.extend.get_executor(n) is None]
        if unknown or not wanted:
            known = ", ".join(e.name for e in thunder.get_all_executors())
            raise SystemExit(f"--executors: unknown executor {', '.join(unknown) or '(none given)'}; "
                             f"Thunder has {known}")
        return [thunder.extend.get_executor(n) for n in wanted]
    if str(device).startswith("cuda"):
        return None
    from thunder.executors.torch_compile import torch_compile_ex

    return [torch_compile_ex, *thunder.get_default_executors()]


def thunder_options(device: str, names: str | Sequence[str] | None = None) -> dict:
    """`executors(device, names)` as keyword arguments of ThunderCompiler or ReportingBackend ({} for the defaults)."""
    found = executors(device, names)
    return {} if found is None else {"executors": found}


def train(model, batch: dict, backend, steps: int, lr: float = 1e-3,
          after_step: Callable[[int], None] | None = None) -> list:
    """`steps` AdamW steps of `torch.compile(model, backend=backend)` on `batch`; the losses as device tensors."""
    trainer = Trainer(model, backend, [batch], lr=lr)
    losses = []
    for step in range(steps):
        losses.append(trainer.step())
        if after_step is not None:
            after_step(step)
    return losses


class Clock:
    """Marks at step boundaries: CUDA events on CUDA (read after one synchronisation), the host clock elsewhere:
    `host_clock` in seconds, the wall clock by default; `time.thread_time` times the calling thread's work only (on
    CPU the whole step, autograd included, runs in it), so that a core shared with other work is no cost of the step."""

    def __init__(self, device: str, host_clock: Callable[[], float] = time.perf_counter):
        import torch

        self.torch, self.cuda = torch, str(device).startswith("cuda")
        self._host_clock = host_clock
        self.name = "CUDA events" if self.cuda else ("host" if host_clock is time.perf_counter
                                                      else f"host, {getattr(host_clock, '__name__', host_clock)}")

    def mark(self):
        if not self.cuda:
            return self._host_clock()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def between(self, marks: list) -> list[float]:
        """Milliseconds between consecutive marks; synchronises first."""
        self.sync()
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]


class Trainer:
    """A model compiled with `backend` (None: eager; "inductor": torch.compile's default) and AdamW, stepping through
    `batches` in turn. A batch is a dict of keyword arguments (a Hugging Face model: its output's `.loss`) or a tuple
    of positional ones (thunderfx_debug.commands.models.GPT: it returns the loss)."""

    def __init__(self, model, backend, batches: Sequence, lr: float = 1e-4, device: str | None = None,
                 host_clock: Callable[[], float] = time.perf_counter):
        import torch

        self.model, self.backend, self.batches = model, backend, list(batches)
        if backend is None:
            self.compiled = model
        else:
            self.compiled = torch.compile(model) if backend == "inductor" else torch.compile(model, backend=backend)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        device = device or str(next(model.parameters()).device)
        self.clock = Clock(device, host_clock)  # the host clock of `block` where the device is the CPU
        self.steps_done = 0

    def step(self):
        """One training step; the loss, detached, on the device (no synchronisation)."""
        batch = self.batches[self.steps_done % len(self.batches)]
        out = self.compiled(**batch) if isinstance(batch, dict) else self.compiled(*batch)
        loss = out.loss if hasattr(out, "loss") else out
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        return loss.detach()

    def timed_step(self) -> tuple:
        """One step, the device synchronised before and after: (its loss, its wall milliseconds)."""
        self.clock.sync()
        started = time.perf_counter()
        loss = self.step()
        self.clock.sync()
        return loss, (time.perf_counter() - started) * 1e3

    def block(self, steps: int) -> list[float]:
        """`steps` steps with a mark at each boundary, one synchronisation at the end: per-step milliseconds."""
        marks = [self.clock.mark()]
        for _ in range(steps):
            self.step()
            marks.append(self.clock.mark())
        return self.clock.between(marks)


def interleaved(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, list]:
    """Each round calls every configuration's `run` once, the order rotated by one each round (so that drift of the
    clock, the temperature or other load hits every configuration alike); per configuration, its results in round
    order.

    Example:
        >>> calls = []
        >>> interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2) and calls
        ['a', 'b', 'b', 'a']
    """
    names = list(runs)
    results: dict[str, list] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(runs[name]())
    return results


def shuffled(runs: dict[str, Callable[[], object]], rounds: int, seed: int = 0,
             until: Callable[[], bool] | None = None) -> dict[str, list]:
    """As `interleaved`, but each round in an order drawn at random (seeded): neither a fixed order nor a rotation
    can then line a configuration up with a periodic disturbance of the machine. Stops early, after a whole round,
    once `until()` is true (a deadline); every configuration then has the same number of results.

    Example:
        >>> calls = []
        >>> done = shuffled({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, seed=1)
        >>> sorted(calls) == ["a"] * 3 + ["b"] * 3, [len(v) for v in done.values()]
        (True, [3, 3])
    """
    import random

    rng = random.Random(seed)
    names = list(runs)
    results: dict[str, list] = {name: [] for name in names}
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            results[name].append(runs[name]())
        if until is not None and until():
            break
    return results


def median_interval(values: Sequence[float], confidence: float = 0.95, resamples: int = 4000,
                    seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of `values` and its bootstrap percentile interval (`resamples` resamplings
    of the values with replacement, seeded).

    Example:
        >>> median_interval([1.0, 1.0, 1.0])
        (1.0, 1.0, 1.0)
    """
    return _bootstrap(values, statistics.median, confidence, resamples, seed)


def ratio_of_sums_interval(values: Sequence[float], baseline: Sequence[float], confidence: float = 0.95,
                           resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(sum(values) / sum(baseline), low, high), pairs resampled together: the amortised ratio of two series of
    paired rounds (a round holding a sampled step counts with its weight), with its bootstrap interval.

    Example:
        >>> ratio_of_sums_interval([2.0, 4.0], [2.0, 2.0])[0]
        1.5
    """
    pairs = list(zip(values, baseline))
    return _bootstrap(pairs, lambda sample: sum(v for v, _ in sample) / sum(b for _, b in sample), confidence,
                      resamples, seed)


def _bootstrap(values: Sequence, statistic: Callable, confidence: float, resamples: int,
               seed: int) -> tuple[float, float, float]:
    import random

    values = list(values)
    if not values:
        raise ValueError("no values to bootstrap")
    rng = random.Random(seed)
    estimates = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = estimates[min(int(tail * resamples), resamples - 1)]
    high = estimates[min(int((1 - tail) * resamples), resamples - 1)]
    return statistic(values), low, high


def paired_ratios(blocks: dict[str, list[float]], baseline: str) -> dict[str, dict]:
    """Per configuration but the baseline: each round's figure over the baseline's in the same round, and their
    median, minimum and maximum.

    Example:
        >>> paired_ratios({"off": [10.0, 12.0], "split": [10.5, 12.0]}, "off")["split"]["median"]
        1.025
    """
    result = {}
    for name, values in blocks.items():
        if name == baseline:
            continue
        ratios = [v / b for v, b in zip(values, blocks[baseline])]
        result[name] = {"per_round": ratios, "median": statistics.median(ratios), "min": min(ratios),
                        "max": max(ratios)}
    return result


def versions() -> dict:
    """Python, torch, Thunder, nvFuser and transformers versions (None for one not installed), and the GPU's name."""
    import importlib.metadata

    found = {"python": platform.python_version()}
    for name, dist in (("torch", "torch"), ("thunder", "lightning-thunder"), ("transformers", "transformers")):
        try:
            found[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["nvfuser"] = next((d.version for d in importlib.metadata.distributions()
                             if (d.metadata["Name"] or "").startswith("nvfuser")), None)
    return found


def machine() -> dict:
    """The host, its architecture and core count, and the GPU's name where torch sees one."""
    found = {"host": platform.node(), "arch": platform.machine(), "cores": os.cpu_count(), "gpu": None}
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name()
    return found


def record(benchmark: str, results, argv: Sequence[str] | None = None) -> dict:
    """The JSON record of a benchmark run: what ran it, when, where, with which versions, and its results."""
    script = Path(sys.argv[0]).name if sys.argv[0].endswith(".py") else f"{benchmark}.py"  # a script's records differ
    command = " ".join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)])
    return {"benchmark": benchmark, "command": command,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "versions": versions(), "results": results}


def write_record(path: str | Path | None, benchmark: str, results, argv: Sequence[str] | None = None) -> None:
    """Writes `record(...)` to `path` as JSON (nothing when `path` is None), its folder made first; written whole or
    not at all, so that a run cut short keeps its last complete record."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record(benchmark, results, argv), indent=1, default=str) + "\n")
    os.replace(partial, path)
