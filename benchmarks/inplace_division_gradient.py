"""Independent of thunderfx_debug: Thunder's gradient of Mixtral's router renormalising its top-k probabilities in
place (`v, i = torch.topk(p, 2); v /= v.sum(-1, keepdim=True)`), against autograd in float64, eager and `thunder.jit`
with Thunder's default executors for the device. The yardstick for the sentinel's MISMATCH of an MoE router gate's
gradient (benchmarks/RESULTS.md, issue 34).

    python benchmarks/inplace_division_gradient.py --device cpu
    source .gpu/setup.sh && python benchmarks/inplace_division_gradient.py --device cuda
"""

import argparse

import torch
from torch import nn


class Router(nn.Module):
    """Mixtral's router and expert mix in miniature: softmax over 4 experts, the top 2, renormalised in place
    (`zero_gate`: every expert ties for every token; tests/test_verdicts_beyond_decoders.py uses it so)."""

    def __init__(self, zero_gate: bool = False):
        super().__init__()
        self.gate = nn.Linear(8, 4, bias=False)
        self.experts = nn.Linear(8, 32)
        if zero_gate:
            nn.init.zeros_(self.gate.weight)

    def forward(self, x):
        probs = torch.softmax(self.gate(x), dim=-1)
        top_values, top_indices = torch.topk(probs, 2, dim=-1)
        top_values /= top_values.sum(dim=-1, keepdim=True)
        mixed = self.experts(x).view(-1, 4, 8).gather(1, top_indices[..., None].expand(-1, -1, 8))
        return (mixed * top_values[..., None]).sum(), top_indices


def gate_gradient(device, dtype, jit):
    # the one workaround `import thunder` needs on torch >= 2.13 (lightning-thunder#2829); nothing else of the
    # package is used
    import thunderfx_debug  # noqa: F401
    import thunder

    torch.manual_seed(0)
    model = Router().to(device, dtype)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    (thunder.jit(model) if jit else model)(x)[0].backward()
    return model.gate.weight.grad.double().cpu()


def main():
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    wide = gate_gradient(args.device, torch.float64, jit=False)
    scale = float(wide.abs().max())
    for dtype in (torch.float32, torch.bfloat16):
        eager = float((gate_gradient(args.device, dtype, False) - wide).abs().max()) / scale
        by_thunder = float((gate_gradient(args.device, dtype, True) - wide).abs().max()) / scale
        print(f"{args.device} {str(dtype).replace('torch.', '')}: the gate's gradient off float64 autograd "
              f"(relative to its largest value): eager {eager:.3g}, thunder.jit {by_thunder:.3g}")


if __name__ == "__main__":
    main()
