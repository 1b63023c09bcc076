"""First look on a GPU machine: the demo with nvFuser, and a small Hugging Face Llama under plain ThunderCompiler and
under ReportingBackend. Prints what worked; used to find GPU-only problems early.

    source .gpu/setup.sh && python benchmarks/gpu_smoke.py
"""

from __future__ import annotations

import sys
import time
import traceback

import torch

import thunderfx_debug  # noqa: F401  (version workarounds first)


def llama(layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).cuda().to(torch.bfloat16)


def train_llama(backend, steps=3):
    model = llama()
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 1024, (2, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    losses = []
    for _ in range(steps):
        loss = compiled(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses).float().cpu().tolist()


def main():
    from thunder.dynamo import ThunderCompiler

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.demo import run_demo

    started = time.perf_counter()
    run_demo(steps=20, dump_dir="/tmp/smoke_demo", device="cuda", progress=False)
    print(f"demo ok in {time.perf_counter() - started:.1f} s", flush=True)
    for name, make in (("plain ThunderCompiler", ThunderCompiler),
                       ("ReportingBackend", lambda: ReportingBackend(dump_dir="/tmp/smoke_llama", timing="split"))):
        torch._dynamo.reset()
        try:
            print(name, "llama losses", train_llama(make()), flush=True)
        except Exception as e:
            print(name, "llama FAILED:", type(e).__name__, str(e)[:300], flush=True)
            traceback.print_exc(limit=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
