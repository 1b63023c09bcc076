"""Helper process of tests/test_torch_trace.py: a short CPU training run under ReportingBackend with torch's trace
log on (the test sets TORCH_TRACE, which torch reads at import), dumped to DUMP_DIR.

    TORCH_TRACE=TRACE_DIR python tests/traced_run.py DUMP_DIR

The model has a Dynamo graph break (two graphs, two compile ids) and `torch.sinc`, which Thunder 0.2.6 sends to
inductor (a split reason); Thunder's torch.compile executor fuses the rest (TorchCompileN regions), and compiles
them with nested torch.compile calls of their own compile ids, under which nothing of ours may be filed.
"""

from __future__ import annotations

import sys

import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs)

import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        h = h * torch.sinc(h)
        torch._dynamo.graph_break()
        return torch.tanh(self.b(h)).sum()


def main(dump_dir: str) -> None:
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    from thunderfx_debug import ReportingBackend

    torch.manual_seed(0)
    model = Tiny()
    backend = ReportingBackend(dump_dir=dump_dir, timing="fusion", timing_every=1, timing_warmup=0, strict=True,
                               executors=[torch_compile_ex, *thunder.get_default_executors()])
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        compiled(torch.randn(8, 16)).backward()
    backend.flush()
    backend.flush()  # a second flush with nothing new writes nothing new into the trace log


if __name__ == "__main__":
    main(sys.argv[1])
