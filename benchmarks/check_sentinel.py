"""The correctness sentinel (THUNDERFX_DEBUG_CHECK) on a real training run: does it name the faulty region, does it
stay quiet where nothing is wrong, and what does it cost.

    source .gpu/setup.sh && python3 benchmarks/check_sentinel.py --json check_sentinel.json    # H200, ~5-6 min
    python benchmarks/check_sentinel.py --tiny                                                   # CPU smoke test

Proof (the 12-layer GPT of `thunderfx_debug.commands.models.GPT_12_LAYER`, bf16, batch --batch, AdamW): two worker
processes train it for --proof-steps steps with THUNDERFX_DEBUG_CHECK=fusion checking every call, each writing its
dump after every step (a run that the fault kills still leaves its findings):
  nvfuser        Thunder's default executors (nvFuser). On the H200 that nvFuser's kernel for the GPT's first fusion
                 writes out of bounds (benchmarks/RESULTS.md), so the sentinel must name a mismatching
                 nvFusion0_forward (--expect); its mismatch scripts are then run (exit status 1 expected).
  torchcompile   --clean-executors (default torchcompile,sdpa,torchcompile_xentropy): every checked piece clean.
Cost (--cost-layers, default 12; --cost-executors, default those of torchcompile, because nvFuser computes this GPT
wrongly there): three worker processes, ReportingBackend with the check off, at `split` and at `fusion`, checking
every --every calls (default 50; --tiny 5). After --warmup steps, rounds of one --block-step block per configuration
(one worker at a time, order rotated each round; a block of --every steps holds exactly one checked call), step
boundaries as CUDA events (host clock on CPU), the device synchronised at the end of a block only. The cost of a
configuration is its paired ratio per round, its block's mean step over the check-off block's of the same round: the
median over rounds is the headline, with its range and the ratio of means over all steps. Target: split <= 1.05x.
The warm-up losses of split and fusion must equal the check-off run's bit for bit (the check changes nothing).

All workers start at once (their compiles overlap); the cost is measured once the proof workers are done, so that
nothing else runs on the device meanwhile. Exit status 1 when the proof fails, a loss differs or a worker fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

import thunderfx_debug  # noqa: F401  (version workarounds before thunder is imported; the workers import this too)
from thunderfx_debug.commands.models import (
    GPT,
    GPT_12_LAYER,
    GPTConfig,
    synthetic_batches,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
COST_CONFIGURATIONS = {"off": "off", "split": "split", "fusion": "fusion"}
TARGETS = {"split": 1.05}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--tiny", action="store_true", help="a tiny GPT on CPU or GPU: a smoke test of this script")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 8; tiny 4)")
    parser.add_argument("--proof-steps", type=int, default=3, help="steps of each proof run, all checked (default 3)")
    parser.add_argument("--expect", default="nvFusion0_forward",
                        help="the region the nvfuser proof must find mismatching (default nvFusion0_forward); "
                             "'none' expects no mismatch (a machine whose nvFuser is sound)")
    parser.add_argument("--clean-executors", default="torchcompile,sdpa,torchcompile_xentropy",
                        help="Thunder executors of the clean proof run (default torchcompile,sdpa,torchcompile_xentropy)")
    parser.add_argument("--no-proof", action="store_true", help="measure the cost only")
    parser.add_argument("--no-cost", action="store_true", help="run the proof only")
    parser.add_argument("--cost-layers", type=int, default=None, help="transformer blocks of the cost runs' GPT "
                        "(default 12)")
    parser.add_argument("--cost-executors", default=None, help="Thunder executors of the cost runs (default: "
                        "--clean-executors; on CPU, torchcompile first)")
    parser.add_argument("--every", type=int, default=None, help="THUNDERFX_DEBUG_CHECK_EVERY of the cost runs "
                        "(default 50; tiny 5)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured steps of the cost runs (default 10)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per cost configuration "
                        "(default 300; tiny 20)")
    parser.add_argument("--block", type=int, default=None, help="steps per block (default --every)")
    parser.add_argument("--script-timeout", type=float, default=240.0, help="seconds per mismatch script (240)")
    parser.add_argument("--worker-timeout", type=float, default=600.0, help="seconds to wait for any reply (600)")
    parser.add_argument("--out", type=Path, default=None, help="where the proof runs' dumps go (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.batch = args.batch or (4 if args.tiny else 8)
    args.steps = args.steps or (20 if args.tiny else 300)
    args.every = args.every or (5 if args.tiny else 50)
    args.block = args.block or args.every  # a block holds exactly one checked call
    args.cost_layers = args.cost_layers or (TINY.n_layer if args.tiny else GPT_12_LAYER.n_layer)
    if args.steps % args.block:
        parser.error(f"--steps ({args.steps}) must be a multiple of --block ({args.block})")
    for option in ("clean_executors", "cost_executors"):  # an unknown name fails here, before any worker starts
        value = getattr(args, option)
        if value is not None:
            try:
                setattr(args, option, tuple(e.name for e in harness.executors(args.device, value)))
            except SystemExit as error:
                parser.error(f"--{option.replace('_', '-')}: {str(error).removeprefix('--executors: ')}")
    return args


# ---- workers ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Job:
    name: str
    kind: str  # "proof" | "cost"
    config: GPTConfig
    device: str
    batch: int
    check: str
    every: int
    steps: int  # proof: steps to train; cost: warm-up steps
    executors: tuple[str, ...] | None  # None: Thunder's defaults (CPU: torchcompile first)
    dump_dir: str | None = None


class Trainer(harness.Trainer):
    def __init__(self, job: Job):
        from thunderfx_debug import ReportingBackend

        self.job, self.cuda = job, job.device.startswith("cuda")
        if not self.cuda:
            # one intra-op thread: with more, MKL picks a thread count by the machine's load, and the workers' losses
            # then differ in their last bit with the check on and off alike
            torch.set_num_threads(1)
        torch.manual_seed(0)
        dtype = torch.bfloat16 if self.cuda else torch.float32
        model = GPT(job.config).to(device=job.device, dtype=dtype)
        backend = ReportingBackend(dump_dir=job.dump_dir, check=job.check, check_every=job.every,
                                   **harness.thunder_options(job.device, job.executors))
        batches = [b for _, b in zip(range(8), synthetic_batches(job.config, job.batch, job.device))]
        super().__init__(model, backend, batches, lr=1e-4, device=job.device)


def _findings(backend) -> dict:
    from thunderfx_debug.render.correctness import checked_pieces, render_correctness

    report = backend.report()
    pieces = checked_pieces(report)
    return {
        "correctness": render_correctness(report),
        "checked": len(pieces),
        "mismatching": {p.path: p.check.to_json() for p in pieces if p.status == "mismatch"},
        "scripts": {p.path: path for p in pieces for label, path in p.files.items() if "mismatch" in label},
        "reporting_failures": [f["what"] + ": " + f["error"] for f in report.meta.get("reporting_failures", [])],
    }


def worker_main(job: Job, conn) -> None:
    try:
        started = time.perf_counter()
        trainer = Trainer(job)
        if job.kind == "proof":
            losses = []
            for _ in range(job.steps):
                losses.append(float(trainer.step().float()))
                trainer.clock.sync()
                trainer.backend.flush()  # the findings are on disk even if the fault kills the next step
            result = _findings(trainer.backend)
            result.update(losses=losses, wall_s=time.perf_counter() - started)
            conn.send(("proof", result))
            return
        trainer.clock.sync()
        losses = [float(trainer.step().float()) for _ in range(job.steps)]
        trainer.clock.sync()
        conn.send(("ready", {"losses": losses, "warmup_s": time.perf_counter() - started}))
        while True:
            command, argument = conn.recv()
            if command == "block":
                conn.send(("block", trainer.block(argument)))
            elif command == "finish":
                result = _findings(trainer.backend)
                result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30 if trainer.cuda else None
                conn.send(("finished", result))
                return
    except EOFError:
        return
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
        sys.exit(1)


class Worker:
    def __init__(self, context, job: Job):
        self.job, self.name = job, job.name
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(job, child), name=f"check-{job.name}")
        self.process.start()
        child.close()

    def receive(self, expected: str, timeout: float):
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.conn.poll(1.0):
                try:
                    kind, payload = self.conn.recv()
                except EOFError:
                    break
                if kind == "error":
                    raise RuntimeError(f"{self.name} failed:\n{payload}")
                if kind != expected:
                    raise RuntimeError(f"{self.name} replied {kind!r}, expected {expected!r}")
                return payload
            if not self.process.is_alive() and not self.conn.poll():
                break
        self.process.join(5)
        raise RuntimeError(f"{self.name} gave no {expected!r} reply (exit code {self.process.exitcode}; its own "
                           "output above may say why)")

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


# ---- the parts ----------------------------------------------------------------------------------------------------

def _dead_proof(job: Job, error: str) -> dict:
    """What a proof worker that died left: its dump of the last completed step."""
    from thunderfx_debug import load_report
    from thunderfx_debug.render.correctness import checked_pieces, render_correctness

    result = {"error": error.strip().splitlines()[-1][:500] if error.strip() else "died"}
    try:
        report = load_report(Path(job.dump_dir))
    except Exception as e:
        result["dump"] = f"unreadable: {e}"
        return result
    pieces = checked_pieces(report)
    result.update(correctness=render_correctness(report), checked=len(pieces),
                  mismatching={p.path: p.check.to_json() for p in pieces if p.status == "mismatch"},
                  scripts={p.path: path for p in pieces for label, path in p.files.items() if "mismatch" in label})
    return result


def run_scripts(dump_dir: str, scripts: dict[str, str], wanted: str, timeout: float) -> dict:
    """Runs the mismatch scripts of the pieces whose path ends with `wanted`, each as `thunderfx-debug verify` runs a
    script alone (where thunderfx_debug cannot be imported): {path: (exit status, RESULT line)}."""
    from internals import run_script

    runs = {}
    for piece, relative in scripts.items():
        if not piece.endswith(wanted):
            continue
        done = run_script(Path(dump_dir) / "rank0" / relative, timeout_s=timeout)
        if done.returncode is None:
            runs[piece] = {"exit": None, "result": f"timed out after {timeout:.0f} s"}
            continue
        runs[piece] = {"exit": done.returncode, "result": done.result_line or done.stdout[-300:],
                       "stdout_tail": done.stdout[-1500:]}
    return runs


def jobs_of(args, out: Path) -> list[Job]:
    """The proof workers (nvFuser and the clean executors on CUDA; on CPU, no nvFuser: the clean run only) and the
    cost workers, one per check level."""
    cuda = args.device.startswith("cuda")
    proof_config = TINY if args.tiny else GPT_12_LAYER
    cost_config = dataclasses.replace(proof_config, n_layer=args.cost_layers)
    cost_executors = args.cost_executors or (args.clean_executors if cuda else None)
    jobs = []
    if not args.no_proof:
        proofs = (("nvfuser", None), ("torchcompile", args.clean_executors)) if cuda else (("torchcompile", None),)
        for name, executors in proofs:
            jobs.append(Job(name, "proof", proof_config, args.device, args.batch, "fusion", 1, args.proof_steps,
                            executors, str(out / name)))
    if not args.no_cost:
        for name, level in COST_CONFIGURATIONS.items():
            jobs.append(Job(f"cost-{name}", "cost", cost_config, args.device, args.batch, level, args.every,
                            args.warmup, cost_executors))
    print(f"device {args.device}; proof: GPT {proof_config.n_layer} layers, {args.proof_steps} steps, check=fusion "
          f"every call; cost: GPT {cost_config.n_layer} layers, check every {args.every} calls, executors "
          f"{', '.join(cost_executors) if cost_executors else 'defaults'}; {len(jobs)} workers start at once; "
          f"dumps in {out}", flush=True)
    return jobs


def collect_proofs(workers: list[Worker], timeout: float, started: float) -> dict:
    proofs = {}
    for worker in workers:
        try:
            proofs[worker.name] = worker.receive("proof", timeout)
        except RuntimeError as e:
            print(str(e), file=sys.stderr)
            proofs[worker.name] = _dead_proof(worker.job, str(e))
        print(f"  proof {worker.name} done {time.perf_counter() - started:.0f} s after start", flush=True)
    return proofs


def measure_cost(workers: list[Worker], args) -> dict:
    """The interleaved blocks of the cost workers once all are warm, their paired ratios against the check-off
    worker's, and whether their warm-up losses equal its."""
    ready = {w.name.removeprefix("cost-"): w.receive("ready", args.worker_timeout) for w in workers}
    print("  cost workers ready; measuring", flush=True)

    def block_of(worker: Worker):
        def run():
            worker.conn.send(("block", args.block))
            return worker.receive("block", args.worker_timeout)
        return run

    steps = harness.interleaved({w.name.removeprefix("cost-"): block_of(w) for w in workers}, args.steps // args.block)
    finished = {}
    for worker in workers:
        worker.conn.send(("finish", None))
        finished[worker.name.removeprefix("cost-")] = worker.receive("finished", args.worker_timeout)
    blocks = {name: [statistics.fmean(times) for times in done] for name, done in steps.items()}
    means = {name: statistics.fmean([ms for times in done for ms in times]) for name, done in steps.items()}
    losses = {name: r["losses"] for name, r in ready.items()}
    return {"layers": args.cost_layers, "every": args.every, "block": args.block,
            "clock": "CUDA events" if args.device.startswith("cuda") else "host perf_counter",
            "mean_step_ms": means, "paired_ratios": harness.paired_ratios(blocks, "off"),
            "ratio_of_means": {n: means[n] / means["off"] for n in means if n != "off"},
            "warmup_losses_equal_off": {n: losses[n] == losses["off"] for n in losses if n != "off"},
            "warmup_losses": losses, "findings": finished,
            "step_ms": {name: [ms for times in done for ms in times] for name, done in steps.items()}}


def main(argv=None) -> int:
    args = parse_args(argv)
    for name in [n for n in os.environ if n.startswith("THUNDERFX_DEBUG_")]:
        del os.environ[name]  # they would override the settings compared here
    out = args.out or Path(tempfile.mkdtemp(prefix="check-sentinel-"))
    context = multiprocessing.get_context("spawn")
    workers = [Worker(context, job) for job in jobs_of(args, out)]
    started = time.perf_counter()
    try:
        results = {"proof": collect_proofs([w for w in workers if w.job.kind == "proof"], args.worker_timeout,
                                           started)}
        cost_workers = [w for w in workers if w.job.kind == "cost"]
        results["cost"] = measure_cost(cost_workers, args) if cost_workers else {}
    finally:
        for worker in workers:
            worker.stop()
    ok = _report_proof(results, args, out) & _report_cost(results)
    harness.write_record(args.json, "check_sentinel", {**results, "ok": ok}, argv)
    return 0 if ok else 1


def _report_proof(results: dict, args, out: Path) -> bool:
    ok = True
    for name, proof in results["proof"].items():
        print(f"\nproof run {name}:" + (f" DIED ({proof['error']})" if "error" in proof else ""))
        for line in proof.get("correctness", []):
            print(f"  {line}")
        mismatching = proof.get("mismatching", {})
        if name == "nvfuser":
            expected = args.expect != "none"
            found = [p for p in mismatching if p.endswith(args.expect)] if expected else []
            verdict = bool(found) if expected else not mismatching
            proof["expected_found"] = verdict
            if found:
                proof["script_runs"] = run_scripts(str(out / name), proof.get("scripts", {}), args.expect,
                                                   args.script_timeout)
                for piece, run in proof["script_runs"].items():
                    print(f"  mismatch script of {piece}: exit {run['exit']}: {run['result']}")
                    verdict &= run["exit"] == 1
            print(f"  {'PASS' if verdict else 'FAIL'}: " + (f"the sentinel names {', '.join(found)} (expected "
                  f"{args.expect})" if expected else "no mismatch expected"))
        else:
            verdict = proof.get("checked", 0) > 0 and not mismatching and "error" not in proof
            print(f"  {'PASS' if verdict else 'FAIL'}: {proof.get('checked', 0)} pieces checked, "
                  f"{len(mismatching)} mismatching (none expected)")
        ok &= verdict
    return ok


def _report_cost(results: dict) -> bool:
    cost = results["cost"]
    if not cost:
        return True
    ok = True
    print(f"\ncost: GPT {cost['layers']} layers, checking every {cost['every']} calls; blocks of {cost['block']} "
          f"steps; paired ratio = a block's mean step / the check-off block's of the same round ({cost['clock']})")
    print(f"{'configuration':<14} {'mean ms':>9} {'paired median':>14} {'min':>7} {'max':>7} {'ratio of means':>15}  "
          "target")
    print(f"{'off':<14} {cost['mean_step_ms']['off']:9.3f}")
    for name, ratio in cost["paired_ratios"].items():
        target = TARGETS.get(name)
        verdict = "" if target is None else f"<= {target:.2f}x " + ("ok" if ratio["median"] <= target else "MISSED")
        print(f"{name:<14} {cost['mean_step_ms'][name]:9.3f} {ratio['median']:14.4f} {ratio['min']:7.4f} "
              f"{ratio['max']:7.4f} {cost['ratio_of_means'][name]:15.4f}  {verdict}")
    for name, same in cost["warmup_losses_equal_off"].items():
        if not same:
            print(f"FAILED: the warm-up losses of {name} differ from the check-off run's: the check changed the "
                  "training", file=sys.stderr)
            ok = False
    if all(cost["warmup_losses_equal_off"].values()):
        print(f"warm-up losses of {', '.join(cost['warmup_losses_equal_off'])} equal the check-off run's bit for bit")
    for name, found in cost["findings"].items():
        if found["mismatching"]:
            print(f"note: the {name} cost run found mismatches: {', '.join(found['mismatching'])}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
