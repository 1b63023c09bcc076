"""What the benchmarks share: the zoo of Hugging Face models built from configs (no weights, no network), at two
sizes, Thunder's executors per device, and one training loop.

Sizes:
  tiny       1 layer, hidden 32, sequence 16, batch 2: CPU tests, float32.
  realistic  4 layers, hidden 768, 12 heads, sequence 512, batch 4, vocabulary 32000: the H200 in bf16, where
             nvFuser picks other kernels and strides differ from a tiny config's.

Every model trains in train mode with dropout off (so that each piece can be compared with eager), but for the
`-dropout` variants, which keep the configuration's dropout (0.1). The second sequence of a batch ends in two padding
positions (attention_mask 0, labels -100), so that the models' mask paths are traced; BERT predicts three masked
positions per sequence. No KV cache (its torch.cat would be one more inductor split per decoder).

    import harness
    model, batch = harness.build("llama", "realistic", device="cuda", dtype="bfloat16")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

MODELS = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "phi3", "gemma", "gptneox", "opt", "bert", "gpt2-dropout",
          "bert-dropout")


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
    if base == "bert":
        return tf.BertForMaskedLM, tf.BertConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                                                 num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                                 intermediate_size=4 * size.hidden if size.hidden >= 768
                                                 else size.intermediate,
                                                 max_position_embeddings=max(64, 2 * size.seq), type_vocab_size=2)
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def build(name: str, size: str = "tiny", device: str = "cpu", dtype: str = "float32", seed: int = 0):
    """(model, batch): the model in train mode and the keyword arguments of one batch (see the module docstring)."""
    import torch

    shape = SIZES[size]
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
    attention_mask[1, -2:] = 0
    labels[1, -2:] = -100
    if name.startswith("bert"):
        labels = torch.full_like(input_ids, -100)
        labels[:, [1, 5, 9]] = input_ids[:, [1, 5, 9]]
        input_ids[:, [1, 5, 9]] = 3  # a stand-in [MASK] id
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return {key: value.to(device) for key, value in batch.items()}


def thunder_options(device: str) -> dict:
    """Thunder's options for a zoo run: its default executors (nvFuser on CUDA); on CPU, where they fuse nothing, its
    torch.compile executor first."""
    if device != "cpu":
        return {}
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    return {"executors": [torch_compile_ex, *thunder.get_default_executors()]}


def train(model, batch: dict, backend, steps: int, lr: float = 1e-3,
          after_step: Callable[[int], None] | None = None) -> list:
    """`steps` AdamW steps of `torch.compile(model, backend=backend)` on `batch`; the losses as device tensors."""
    import torch

    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        loss = compiled(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if after_step is not None:
            after_step(step)
    return losses
