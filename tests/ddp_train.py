"""Helper of tests/test_ddp.py, run by torchrun: DDP training of a tiny model under ReportingBackend.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/ddp_train.py OUT {cpu|cuda}

Trains twice, 3 steps each: first with every rank recording (dump in OUT/all), then, after `torch._dynamo.reset()`,
with THUNDERFX_DEBUG_RANKS=1 (dump in OUT/rank1_only). After init, RANK and LOCAL_RANK are removed from the
environment, so the backend can only learn its rank from torch.distributed. Each rank writes OUT/result<R>.json with
its losses and a checksum of its parameters (equal on all ranks when DDP kept them in sync).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported)


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).square().mean()


def train(dump_dir: Path, device: torch.device, rank: int, executors) -> tuple[list[float], float]:
    from thunderfx_debug import ReportingBackend

    torch._dynamo.reset()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(
        TinyNet().to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    options = {"executors": executors} if executors else {}
    backend = ReportingBackend(dump_dir=dump_dir, timing="split", timing_every=1, timing_warmup=0, strict=True,
                               **options)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)  # different data on each rank
    losses = []
    for _ in range(3):
        loss = compiled(torch.randn(8, 16, generator=generator).to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    backend.flush()
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    return [float(x) for x in losses], checksum


def main(out: str, device_kind: str) -> None:
    out_dir = Path(out)
    dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    rank = dist.get_rank()
    for variable in ("RANK", "LOCAL_RANK"):
        os.environ.pop(variable, None)  # from here on, only torch.distributed knows the rank
    if device_kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        executors = None  # Thunder's defaults (nvFuser where installed)
    else:
        import thunder
        from thunder.executors.torch_compile import torch_compile_ex

        device = torch.device("cpu")
        executors = [torch_compile_ex, *thunder.get_default_executors()]

    result = {"rank": rank}
    result["all"] = train(out_dir / "all", device, rank, executors)
    os.environ["THUNDERFX_DEBUG_RANKS"] = "1"
    result["rank1_only"] = train(out_dir / "rank1_only", device, rank, executors)
    (out_dir / f"result{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
