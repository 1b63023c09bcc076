"""Distributed training under ReportingBackend: a 12-layer GPT and a Hugging Face Llama (8 layers, from a config, no
weights) on N ranks, with DDP and with FSDP2 (`fully_shard`), each rank writing its own dump; then the ranks side
by side (the straggler view) and the losses against the same run under plain ThunderCompiler.

    torchrun --nproc-per-node 2 benchmarks/distributed.py --json /tmp/distributed.json            # 2 GPUs, NCCL
    torchrun --nproc-per-node 2 benchmarks/distributed.py --size tiny --device cpu --steps 4      # CPU, gloo
    python benchmarks/distributed.py --nproc 2 ...                     # the same, torchrun started for you
    python benchmarks/distributed.py --nproc 2 --dist-backend gloo ... # 2 ranks sharing 1 GPU (NCCL refuses that)

Per rank and case (model x parallelism), in this order:
  1. reporting: ReportingBackend with its dump (`--out`/<model>_<parallel>/rank<R>/), fusion-level timing and the
     correctness check (`--check`, where this version of thunderfx_debug has it); steps timed on the host (with a
     device synchronisation per step on CUDA), then the flush timed;
  2. plain: the same training under plain ThunderCompiler (`thunderfx_debug.plain_thunder_compiler`,
     with the lazy inductor fallback that a Hugging Face Llama needs under Thunder 0.2.6), from the same seeds, and
     its losses compared with (1)'s step by step (`--no-plain` skips it).
Rank 0 then reads every rank's dump back and writes `side_by_side.txt` (`thunderfx-debug summary` of the case's
directory) and `report.html` beside the rank directories, prints a table, and writes `--json`.

DDP: the whole DDP module is compiled; Dynamo's DDPOptimizer hands the backend one graph per gradient bucket
(`--bucket-cap-mb`), and the buckets' all-reduces run in DDP's autograd hooks, outside the graphs. FSDP2: each
transformer block is `fully_shard`ed and its `forward` compiled (the way torchtitan compiles blocks), the root
sharded too; FSDP2's all-gathers and reduce-scatters run in its module hooks, outside the compiled forward (the
embeddings, final norm, head and loss run eagerly). Compiling a `fully_shard`ed root instead makes Dynamo break the
graph at every FSDP2 module (its hooks are skipped functions), which leaves only the glue between blocks compiled.

Every rank gets its own data (seed 100 + rank) and the same initial weights (seed 0). On CUDA the backend is NCCL,
the models bf16, and NVLink SHARP / multicast stay off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
set before the process group starts); rank R uses GPU R modulo the GPUs there are. NCCL refuses two ranks on one
GPU; `--dist-backend gloo` runs them there anyway (gloo copies CUDA tensors to the host for each collective, so its
collectives' times say nothing about NCCL's, and the ranks share the GPU's time: a test of the pieces, not a
measurement of scaling). On CPU the backend is gloo, fp32, and Thunder's torch.compile executor makes the fusion
regions (Thunder's default executors fuse nothing on CPU); `--executors default` leaves it out. On CUDA, `auto`
gives the Llama Thunder's defaults (nvFuser) and the GPT Thunder's torch.compile executor with sdpa and its fused
cross-entropy (the H200's nvFuser miscompiles the GPT's first fusion: benchmarks/RESULTS.md, "Known issue").
`--noisy-rank R` runs a Python thread that competes for the GIL on rank R during the timed steps: a real
straggler, for the side-by-side view to find.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (imports no torch: the environment is set first)

#: What torchrun's children get and what this script sets before the process group starts: no NVLink SHARP
#: (multicast) collectives in NCCL, no multicast in torch's symmetric memory.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
MODELS = ("gpt", "llama")
PARALLEL = ("ddp", "fsdp2")


def _csv(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        unknown = [t for t in items if t not in allowed]
        if not items or unknown:
            raise argparse.ArgumentTypeError(f"{text!r}: a comma list of {', '.join(allowed)}")
        return items

    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=_csv(MODELS), default=list(MODELS), help="gpt, llama or both (default both)")
    parser.add_argument("--parallel", type=_csv(PARALLEL), default=list(PARALLEL),
                        help="ddp, fsdp2 or both (default both)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="full: GPT_12_LAYER and an 8-layer Llama of hidden size 1024, sequences of 1024; "
                             "tiny: 2-layer models for CPU (default full)")
    parser.add_argument("--steps", type=int, help="training steps per run (default 30; tiny 4)")
    parser.add_argument("--layers", type=int, help="transformer blocks (default: gpt 12, llama 8; tiny 2)")
    parser.add_argument("--batch", type=int, help="sequences per rank and step (default: gpt 8, llama 4; tiny 2)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="cuda (NCCL, one GPU per rank), cpu (gloo); auto: cuda where there is one")
    parser.add_argument("--dist-backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="torch.distributed's backend; auto: nccl on CUDA, gloo on CPU. gloo on CUDA lets "
                             "several ranks share one GPU")
    parser.add_argument("--executors", default="auto",
                        help="Thunder's executors: default (Thunder's), torch_compile (its torch.compile executor "
                             "before the defaults), or a comma list of executor names, e.g. "
                             "torchcompile,sdpa,torchcompile_xentropy (the H200's nvFuser miscompiles the GPT: see "
                             "benchmarks/RESULTS.md); auto: torch_compile on CPU; on CUDA default for the Llama and "
                             "torchcompile,sdpa,torchcompile_xentropy for the GPT")
    parser.add_argument("--out", default="/tmp/thunderfx_debug_distributed",
                        help="the dumps go to OUT/<model>_<parallel>/rank<R>/ (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="write the figures to PATH (rank 0)")
    parser.add_argument("--timing", default="fusion", choices=("off", "graph", "split", "fusion"),
                        help="THUNDERFX_DEBUG_TIMING of the reporting run (default fusion)")
    parser.add_argument("--timing-every", type=int, help="sample every N-th call (default 10; tiny 1)")
    parser.add_argument("--timing-warmup", type=int, help="calls before the first sample (default 3; tiny 1)")
    parser.add_argument("--check", choices=("auto", "off", "split", "fusion"), default="auto",
                        help="THUNDERFX_DEBUG_CHECK of the reporting run (auto: split where this thunderfx_debug "
                             "has the check, else off; asking for it where it does not exist is an error)")
    parser.add_argument("--ranks", default="all",
                        help="THUNDERFX_DEBUG_RANKS of the reporting run: all, or the ranks that record (default all)")
    parser.add_argument("--bucket-cap-mb", type=float, help="DDP's bucket size (default 25; tiny 1, the least "
                                                            "Dynamo's DDPOptimizer accepts)")
    parser.add_argument("--no-plain", action="store_true", help="skip the run under plain ThunderCompiler")
    parser.add_argument("--noisy-rank", type=int, help="a thread competing for the GIL on this rank (a straggler)")
    parser.add_argument("--flight-recorder", type=int, default=2000, metavar="N",
                        help="TORCH_FR_BUFFER_SIZE: torch's flight recorder keeps the last N collectives, which the "
                             "dumps read (with NCCL also TORCH_NCCL_ENABLE_TIMING=1: their device time); 0: off "
                             "(default %(default)s)")
    parser.add_argument("--nproc", type=int, help="start torchrun with this many processes (instead of being "
                                                  "started by torchrun)")
    args = parser.parse_args(argv)
    tiny = args.size == "tiny"
    args.steps = args.steps or (4 if tiny else 30)
    args.timing_every = args.timing_every or (1 if tiny else 10)
    args.timing_warmup = args.timing_warmup if args.timing_warmup is not None else (1 if tiny else 3)
    args.bucket_cap_mb = args.bucket_cap_mb or (1.0 if tiny else 25.0)
    if args.steps < 2:
        parser.error("--steps: at least 2 (the first step compiles)")
    if args.dist_backend == "nccl" and args.device == "cpu":
        parser.error("--dist-backend nccl: needs --device cuda (or auto on a machine with CUDA)")
    return args


# ---- models --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Built:
    model: object  # torch.nn.Module
    blocks: list  # the transformer blocks (FSDP2 shards and compiles each)
    batches: object  # iterator of argument tuples
    loss: object  # (callable model, batch) -> loss


def build(name: str, tiny: bool, device, dtype, batch: int | None, seed_data: int, layers: int | None) -> Built:
    import torch

    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    if name == "gpt":
        from thunderfx_debug.commands.models import GPT, GPT_12_LAYER, GPTConfig, synthetic_batches

        config = GPTConfig(vocab_size=512, block_size=32, n_layer=2, n_head=4, n_embd=128) if tiny else GPT_12_LAYER
        config = dataclasses.replace(config, n_layer=layers or config.n_layer)
        model = GPT(config).to(device=device, dtype=dtype)
        batches = synthetic_batches(config, batch_size=batch or (2 if tiny else 8), device=device, seed=seed_data)
        return Built(model, list(model.blocks), batches, lambda m, b: m(*b))
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        seq = 32
    else:
        config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                             num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048)
        seq = 1024
    config.num_hidden_layers = layers or config.num_hidden_layers
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    generator = torch.Generator().manual_seed(seed_data)
    rows = batch or (2 if tiny else 4)

    def batches():
        while True:
            yield (torch.randint(0, config.vocab_size, (rows, seq), generator=generator).to(device),)

    return Built(model, list(model.model.layers), batches(), lambda m, b: m(input_ids=b[0], labels=b[0]).loss)


def parallelize(built: Built, parallel: str, device, compiler, bucket_cap_mb: float):
    """The callable a training step calls: the compiled DDP module, or the FSDP2 model with compiled blocks."""
    import torch

    if parallel == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(
            built.model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb)
        return torch.compile(ddp, backend=compiler)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for block in built.blocks:
        fully_shard(block, mesh=mesh)
        # The forward alone: FSDP2's hooks (all-gather before, reduce-scatter after) stay outside the graph.
        block.forward = torch.compile(block.forward, backend=compiler)
    fully_shard(built.model, mesh=mesh)
    return built.model


# ---- one run -------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def noisy_neighbour(enabled: bool):
    """A Python thread that spins, competing for the GIL with the training thread: the rank's host work slows."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, daemon=True) if enabled else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join()


#: `--executors auto` on CUDA, per model (None: Thunder's defaults).
CUDA_EXECUTORS = {"llama": None, "gpt": "torchcompile,sdpa,torchcompile_xentropy"}


def executors_for(choice: str, device, model: str) -> list | None:
    """Thunder's executors for `--executors` (None: Thunder's defaults): "auto" is the model's CUDA_EXECUTORS on
    CUDA and harness.executors' CPU choice (torch.compile's first) elsewhere; "torch_compile" that CPU choice."""
    if choice == "auto" and device.type == "cuda":
        choice = CUDA_EXECUTORS[model] or "default"
    if choice == "default":
        return None
    if choice in ("auto", "torch_compile"):
        return harness.executors("cpu")
    return harness.executors(device.type, choice)


def check_setting(choice: str) -> str | None:
    """The check to ask ReportingBackend for (None: this thunderfx_debug has none and none was asked for)."""
    from internals import OWN_OPTIONS

    if "check" not in OWN_OPTIONS:
        if choice not in ("auto", "off"):
            raise SystemExit(f"--check {choice}: this thunderfx_debug has no correctness check (THUNDERFX_DEBUG_CHECK)")
        return None
    return "split" if choice == "auto" else choice


def run(args, name: str, parallel: str, mode: str, rank: int, device, dump_dir: Path) -> dict:
    import torch

    from thunderfx_debug import ReportingBackend
    from thunderfx_debug import plain_thunder_compiler

    torch._dynamo.reset()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    built = build(name, args.size == "tiny", device, dtype, args.batch, seed_data=100 + rank, layers=args.layers)
    executors = executors_for(args.executors, device, name)
    options = {} if executors is None else {"executors": executors}
    backend = None
    if mode == "reporting":
        check = check_setting(args.check)
        own = {"check": check} if check is not None else {}
        backend = ReportingBackend(dump_dir=dump_dir, timing=args.timing, timing_every=args.timing_every,
                                   timing_warmup=args.timing_warmup, ranks=args.ranks, flush_every=0, **own,
                                   **options)
        compiler = backend
    else:
        compiler = plain_thunder_compiler(lazy_inductor_fallback=name == "llama", **options)
    step_fn = parallelize(built, parallel, device, compiler, args.bucket_cap_mb)
    optimizer = torch.optim.AdamW(built.model.parameters(), lr=1e-3)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses, step_s = [], []
    with noisy_neighbour(args.noisy_rank == rank):
        for _ in range(args.steps):
            batch = next(built.batches)
            sync()
            started = time.perf_counter()
            loss = built.loss(step_fn, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            step_s.append(time.perf_counter() - started)
            losses.append(loss.detach())
    result = {"losses": [float(x) for x in losses], "first_step_s": step_s[0],
              "median_step_s": statistics.median(step_s[1:]), "step_s": step_s, "blocks": len(built.blocks)}
    if parallel == "ddp":  # equal on every rank where DDP kept the replicas in step (FSDP2's are shards)
        result["parameter_checksum"] = sum(float(p.detach().double().sum()) for p in built.model.parameters())
    if backend is not None:
        started = time.perf_counter()
        rank_dir = backend.close()  # the dump stays as it is now: no flush at exit with later runs' collectives
        result["flush_s"] = time.perf_counter() - started
        result["recorded"] = rank_dir is not None
        result["check"] = backend.config.to_json().get("check")
    if device.type == "cuda":
        result["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    return result


def compare_losses(reporting: list[float], plain: list[float]) -> dict:
    diffs = [abs(a - b) for a, b in zip(reporting, plain)]
    return {"equal": reporting == plain, "max_abs_diff": max(diffs) if diffs else None,
            "first_step_equal": bool(reporting and plain and reporting[0] == plain[0])}


# ---- the ranks side by side (rank 0) -------------------------------------------------------------------------------


def side_by_side(case_dir: Path) -> dict:
    """Reads the case's dumps back, writes side_by_side.txt and report.html beside them; the figures of the view."""
    from thunderfx_debug import load_reports
    from thunderfx_debug.render import digest, ranks
    from thunderfx_debug.render.html import render_html
    from thunderfx_debug.render.summary import render_ranks

    reports = load_reports(case_dir)
    (case_dir / "side_by_side.txt").write_text(render_ranks(reports))
    (case_dir / "report.html").write_text(render_html(reports, {r: f"rank{r}/" for r in reports},
                                                      title=f"ThunderFX report: {case_dir.name}"))
    steps = ranks.rank_steps(reports)
    spread = ranks.spread(steps)
    figures = {
        "ranks": sorted(reports),
        "counts": {r: digest.counts(report) for r, report in reports.items()},
        "compiled_step_ms": {s.rank: s.compiled_ms for s in steps},
        "wall_step_ms": {s.rank: s.wall_ms for s in steps},  # host clock, the graphs' call period
        "clock": next((s.clock.value for s in steps if s.clock is not None), None),
        "collective_places": {r: [dataclasses.asdict(p) for p in ranks.collective_places(report)]
                              for r, report in reports.items()},
        "ddp_buckets": {r: ranks.ddp_buckets(report) for r, report in reports.items()},
    }
    lags = ranks.arrival_lags(reports)
    if lags is not None:
        figures["collective_arrival"] = dataclasses.asdict(lags)
        figures["late_outside_graphs"] = ranks.late_outside_graphs(steps, lags)
    figures["collective_times"] = [dataclasses.asdict(row) for row in ranks.collective_times(reports)]
    if spread is not None:
        figures["spread"] = {**dataclasses.asdict(spread), "ratio": spread.ratio}
        figures["slowest_pieces"] = [
            {"label": p.label, "executor": p.executor, "ms_per_step": p.ms_per_step, "excess_ms": p.excess_ms}
            for p in ranks.slowest_pieces(reports, spread.slowest)]
    return figures


# ---- main ----------------------------------------------------------------------------------------------------------


def launch(args, argv: list[str]) -> int:
    """Starts torchrun with this script (the child processes get MULTICAST_OFF in their environment)."""
    rest, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        if arg.startswith("--nproc="):
            continue
        rest.append(arg)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
               __file__, *rest]
    return subprocess.call(command, env={**os.environ, **MULTICAST_OFF})


def start_rank(args):
    """This rank's device and process group (NCCL on CUDA, gloo elsewhere, unless --dist-backend); SystemExit where
    the choice cannot work. Returns the device."""
    os.environ.update(MULTICAST_OFF)  # before the process group (and NCCL) starts
    if args.flight_recorder > 0:  # also before: c10d reads them when it makes its process groups
        os.environ.update(TORCH_FR_BUFFER_SIZE=str(args.flight_recorder), TORCH_NCCL_ENABLE_TIMING="1")
    import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on torch 2.13)
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    for name in args.model:  # an unknown executor fails here, before any training
        executors_for(args.executors, device, name)
    dist_backend = args.dist_backend if args.dist_backend != "auto" else "nccl" if cuda else "gloo"
    if dist_backend == "nccl" and not cuda:
        raise SystemExit("--dist-backend nccl needs CUDA (--device cuda)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist_backend == "nccl" and world > torch.cuda.device_count():
        raise SystemExit(f"--dist-backend nccl: {world} ranks on {torch.cuda.device_count()} GPU(s); NCCL refuses "
                         "two ranks on one GPU (--dist-backend gloo shares one)")
    dist.init_process_group(dist_backend, device_id=device if dist_backend == "nccl" else None)
    return device


def run_case(args, name: str, parallel: str, device, out: Path) -> dict | None:
    """One case on every rank (under ReportingBackend, then plain ThunderCompiler); rank 0 gets every rank's results
    and the side-by-side view, the others None."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    case = f"{name}_{parallel}"
    results = {"reporting": run(args, name, parallel, "reporting", rank, device, out / case)}
    if not args.no_plain:
        results["plain"] = run(args, name, parallel, "plain", rank, device, out / case)
        results["losses"] = compare_losses(results["reporting"]["losses"], results["plain"]["losses"])
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    dist.barrier()  # every rank has flushed
    if rank != 0:
        return None
    by_rank = dict(enumerate(gathered))
    figures = {"per_rank": by_rank, "dumps": str(out / case)}
    if any(res["reporting"].get("recorded") for res in by_rank.values()):
        figures["side_by_side"] = side_by_side(out / case)
    print_case(case, figures)
    return figures


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.nproc is not None:
        return launch(args, argv)
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("start this script with torchrun (torchrun --nproc-per-node 2 benchmarks/distributed.py "
                         "...), or give --nproc N")
    device = start_rank(args)
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    cases = {}
    figures = {"device": str(device.type), "backend": dist.get_backend(), "world_size": dist.get_world_size(),
               "ranks_per_device": dist.get_world_size() / torch.cuda.device_count() if cuda else None,
               "multicast_off": MULTICAST_OFF, "arguments": vars(args),
               "step_clock": "host wall time per step" + (" with torch.cuda.synchronize() before and after"
                                                          if cuda else ""), "cases": cases}
    for name in args.model:
        for parallel in args.parallel:
            case = run_case(args, name, parallel, device, Path(args.out).absolute())
            if case is not None:
                cases[f"{name}_{parallel}"] = case
                harness.write_record(args.json, "distributed", figures, argv)  # a run cut short keeps its cases
    dist.destroy_process_group()
    return 0


def print_case(case: str, figures: dict) -> None:
    print(f"\n{case}: median step (host wall, after the first), first step, flush; losses against plain ThunderCompiler")
    for rank, res in figures["per_rank"].items():
        rep = res["reporting"]
        line = (f"  rank {rank}: reporting {1e3 * rep['median_step_s']:.1f} ms (first {rep['first_step_s']:.1f} s, "
                f"flush {rep.get('flush_s', 0):.1f} s)")
        if "plain" in res:
            losses = res["losses"]
            line += (f"; plain {1e3 * res['plain']['median_step_s']:.1f} ms; losses "
                     + ("equal" if losses["equal"] else f"differ by up to {losses['max_abs_diff']:.3g}"))
        print(line)
    spread = figures.get("side_by_side", {}).get("spread")
    if spread is not None:
        view = figures["side_by_side"]
        print(f"  straggler view ({view['clock']} clock): slowest rank {spread['slowest']}, "
              f"{spread['excess_ms']:.2f} ms per step above the others' median, {spread['ratio']:.3f}x the fastest; "
              f"see {figures['dumps']}/side_by_side.txt")

if __name__ == "__main__":
    sys.exit(main())
