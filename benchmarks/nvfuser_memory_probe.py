"""Does an nvFuser fusion write into memory it was not given? A probe with nvFuser and torch alone (no Thunder).

    source .gpu/setup.sh && python3 benchmarks/nvfuser_memory_probe.py      # exit 1: a tensor was overwritten

The fusion is `nvFusion0_forward` of the 12-layer GPT as Thunder 0.2.6 built it on the H200 (token and position
embedding lookups, their sum, the first LayerNorm), copied verbatim from nvFuser's own repro of it
(`FusionDefinition.repro_script_for`) in the region's dumped script. The probe computes the LayerNorm's
1/sqrt(var + eps) with torch first, keeps a host copy, runs the fusion three times, and after each run checks the
fusion's own output against it and whether torch's tensor, which the fusion was never given, still holds its values.
On the H200 with `nvfuser_cu130_torch210 0.2.36.dev20260301` (a torch-2.10 build adapted to torch 2.11 by
`../shared/gpu/make-bundle.sh`), the fusion's outputs are right and torch's tensor is overwritten: see RESULTS.md,
"nvFuser overwrites memory it does not own".
"""

import sys

import torch

# nvFuser's repro of the fusion definition, verbatim (FusionDefinition.repro_script_for):
from nvfuser_direct import FusionDefinition, DataType  # noqa: E402
def nvfuser_fusion(fd : FusionDefinition) -> None :
    tv0 = fd.define_tensor(shape=[8, 1024], contiguity=[True, True], dtype=DataType.Int, is_cpu=False)
    tv1 = fd.define_tensor(shape=[50304, 768], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    tv2 = fd.define_tensor(shape=[768], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    tv3 = fd.define_tensor(shape=[768], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    tv4 = fd.define_tensor(shape=[1024, 768], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    tv6 = fd.ops.reshape(tv0, new_shape=[8192])
    tv7 = fd.ops.broadcast(tv6, is_broadcast_dim=[False, True])
    tv8 = fd.ops.index_select(tv1, tv7, dim=0)
    tv9 = fd.ops.reshape(tv8, new_shape=[8, 1024, 768])
    tv10 = fd.ops.cast(tv9, dtype=DataType.Float)
    tv5 = fd.ops.iota(length=1024, start=0, step=1)
    tv17 = fd.ops.broadcast(tv5, is_broadcast_dim=[False, True])
    tv18 = fd.ops.index_select(tv4, tv17, dim=0)
    tv19 = fd.ops.broadcast(tv18, is_broadcast_dim=[True, False, False])
    tv20 = fd.ops.expand(tv19, shape=[8, 1024, 768])
    tv21 = fd.ops.cast(tv20, dtype=DataType.Float)
    tv22 = fd.ops.add(tv10, tv21)
    tv23 = fd.ops.cast(tv22, dtype=DataType.BFloat16)
    tv24, tv25, tv26 = fd.ops.welford(tv22, dims=[2])
    tv30 = fd.ops.broadcast(tv24, is_broadcast_dim=[False, False, True])
    tv31 = fd.ops.cast(tv30, dtype=DataType.Float)
    tv33 = fd.ops.expand(tv31, shape=[8, 1024, 768])
    tv35 = fd.ops.sub(tv22, tv33)
    c83 = fd.ops.cast(768, dtype=DataType.Double)
    c85 = fd.ops.mul(1.00000, c83)
    c89 = fd.ops.cast(0, dtype=DataType.Double)
    c91 = fd.ops.sub(c85, c89)
    c93 = fd.ops.cast(0, dtype=DataType.Double)
    c95 = fd.ops.ge(c91, c93)
    c97 = fd.ops.cast(0, dtype=DataType.Double)
    c99 = fd.ops.where(c95, c91, c97)
    c104 = fd.ops.reciprocal(c99)
    tv27 = fd.ops.mul(tv25, c104)
    tv28 = fd.ops.broadcast(tv27, is_broadcast_dim=[False, False, True])
    tv29 = fd.ops.cast(tv28, dtype=DataType.Float)
    tv32 = fd.ops.add(tv29, 1.00000e-05)
    tv34 = fd.ops.rsqrt(tv32)
    tv36 = fd.ops.expand(tv34, shape=[8, 1024, 768])
    tv37 = fd.ops.mul(tv35, tv36)
    tv11 = fd.ops.broadcast(tv2, is_broadcast_dim=[True, True, False])
    tv12 = fd.ops.expand(tv11, shape=[8, 1024, 768])
    tv13 = fd.ops.cast(tv12, dtype=DataType.Float)
    tv38 = fd.ops.mul(tv37, tv13)
    tv14 = fd.ops.broadcast(tv3, is_broadcast_dim=[True, True, False])
    tv15 = fd.ops.expand(tv14, shape=[8, 1024, 768])
    tv16 = fd.ops.cast(tv15, dtype=DataType.Float)
    tv39 = fd.ops.add(tv38, tv16)
    tv40 = fd.ops.cast(tv39, dtype=DataType.BFloat16)
    fd.add_output(tv5)
    fd.add_output(tv23)
    fd.add_output(tv24)
    fd.add_output(tv34)
    fd.add_output(tv40)
with FusionDefinition() as fd:
    nvfuser_fusion(fd)


def main() -> int:
    torch.manual_seed(0)
    idx = torch.randint(1781, 42540, (8, 1024), device="cuda")
    wte = torch.empty(50304, 768, dtype=torch.bfloat16, device="cuda").uniform_(-0.1, 0.1)
    w, b = torch.ones(768, dtype=torch.bfloat16, device="cuda"), torch.zeros(768, dtype=torch.bfloat16, device="cuda")
    wpe = torch.empty(1024, 768, dtype=torch.bfloat16, device="cuda").uniform_(-0.1, 0.1)
    x = wte[idx].float() + wpe.float()[None]
    var, _ = torch.var_mean(x, -1, correction=0)
    want = torch.rsqrt(var + 1e-5)  # allocated before the fusion runs, and never given to it
    want_host = want.cpu()
    overwritten = False
    for run in range(3):
        out = fd.execute([idx, wte, w, b, wpe])
        torch.cuda.synchronize()
        got = out[3].reshape(8, 1024).cpu()
        intact = torch.equal(want.cpu(), want_host)
        words = want.view(torch.int32)
        zero_or_one = int(((words == 0) | (words == 1)).sum())
        print(f"run {run}: the fusion's 1/sqrt(var + eps) output right: {torch.allclose(got, want_host, rtol=1e-3)}; "
              f"torch's tensor of the same values, not given to the fusion, intact: {intact} "
              f"(int32 words now 0 or 1: {zero_or_one} of {words.numel()})")
        overwritten |= not intact
    print("thunder imported: no" if "thunder" not in sys.modules else "thunder imported: yes")
    return 1 if overwritten else 0


if __name__ == "__main__":
    sys.exit(main())
