"""A small GPT-style model for the demo, the tests and the benchmarks.

It is an ordinary pre-norm transformer (token + position embedding, causal self-attention through
`scaled_dot_product_attention`, GELU MLP, tied head). Two options give ThunderFX something to report:
`graph_break=True` puts a Dynamo graph break between the blocks and the head (as a logging call in a training loop
would), and `sinc_gate=True` scales the MLP output by `torch.sinc`, an op that Thunder 0.2.6 only has an automatic
torch fallback for, so ThunderFX sends it to inductor. The gate is sinc(0.5 + h/2), away from 0: near 0, sinc's
backward cancels in float32, and eager and inductor round it differently by more than any tolerance would forgive.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 512
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    graph_break: bool = False
    sinc_gate: bool = False


GPT_12_LAYER = GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, channels // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, channels))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.fc_out = nn.Linear(4 * config.n_embd, config.n_embd)
        self.sinc_gate = config.sinc_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        h = self.fc_out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))
        if self.sinc_gate:
            h = h * torch.sinc(0.5 + 0.5 * h)
        return x + h


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        if self.config.graph_break:
            torch._dynamo.graph_break()  # stands for a logging call or other Python Dynamo cannot trace
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def synthetic_batches(config: GPTConfig, batch_size: int, device: str | torch.device, seed: int = 0):
    """An endless stream of (tokens, targets) batches of a learnable pattern (next token = token + 1, mod vocab)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, config.vocab_size, (batch_size, 1), generator=generator)
        tokens = (start + torch.arange(config.block_size + 1)) % config.vocab_size
        tokens = tokens.to(device)
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
