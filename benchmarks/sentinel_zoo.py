"""The correctness sentinel (THUNDERFX_DEBUG_CHECK) on the realistic zoo, its verdicts proved against independent
computations, the training it must leave bit for bit as it was, and what it costs.

    source .gpu/setup.sh && python benchmarks/sentinel_zoo.py --json $OUT/sentinel_zoo.json      # H200, < 10 min
    python benchmarks/sentinel_zoo.py --device cpu --size tiny --models llama,gpt2 --json /tmp/sentinel_zoo.json

Models (benchmarks/harness.py, --size realistic: 4 layers, hidden 768, sequence 512, batch 4, bf16 on CUDA): llama,
qwen3, gpt2, gpt2-dropout, phi3, gptneox, bert; and the GPT of `thunderfx_debug.commands.models` (GPT_12_LAYER, batch
8), whose first nvFuser region writes out of bounds on the H200 (benchmarks/RESULTS.md). Every part runs in processes of
its own, --jobs at a time, within --deadline seconds; everything goes into one JSON (--json) and a table is printed.

Parts:
  grads     one step of a model from the same weights and batch: eager in the model's dtype, eager in float64
            (`model.double()`), plain ThunderCompiler (`plain_thunder_compiler(lazy_inductor_fallback=True)`) and
            ReportingBackend with CHECK=fusion checking every call. Per parameter: max|g - g64| / max|g64| of eager,
            plain Thunder and the reporting run, and whether the reporting run's gradient is bit-identical to plain
            Thunder's. The sentinel's verdicts are set against that: where Thunder's gradients are right (within 3x
            eager's own error, every parameter), every MISMATCH of the model is false. The capture diagnostic: each
            gradient the sentinel captured of a parameter against that parameter's .grad after the backward (equal
            where the split is the parameter's only user), with whether the sentinel proved the capture; and whether
            this torch keeps an autograd node's Python wrapper alive (torch < 2.12 does not: keyed by its id(), the
            H200's gradients went missing). Models with dropout get the sentinel's verdicts only.
  oob       the GPT under CHECK=fusion, every call checked, --oob-steps steps: the sentinel must flag --expect-oob
            (default on CUDA graph0/thunder_0/nvFusion0_forward; on CPU none).
  identity  each model trained --steps steps with the check off twice (the control) and with CHECK=fusion checking
            every call, each in its own process; the losses and the parameters (sha256 of their bytes) compared bit
            for bit. Where the two check-off runs differ, the model's training is nondeterministic without the check
            (on CUDA: atomics in a backward) and the identity is not judged; the check alters the training only
            where the two check-off runs agree and the checked run differs from them.
  cost      --cost-model, alone on the device once the other parts are done (--cost-budget seconds): three copies
            from the same weights in one process, ReportingBackend with the check off, at split and at fusion,
            checking every --every calls (default 50). A checked step of each against the unchecked steps of the same
            copy; --rounds rounds of one --every-step block per copy (one checked call in each), the copies' order
            rotated each round, the ratio of a checked copy's block mean to the check-off block of the same round
            (median and range: the amortized cost); and torch.cuda.max_memory_allocated (which counts the check's
            memory pool) over a checked step and over an unchecked one. CUDA events at step boundaries (host clock
            on CPU).
Exit status 0 when no false MISMATCH, the out-of-bounds region flagged (where expected), no checked run that altered
a deterministic training, and no part failed or ran out of time; a model nondeterministic without the check is
listed as not judged.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402
ZOO = ("llama", "qwen3", "gpt2", "gpt2-dropout", "phi3", "gptneox", "bert")
#: Thunder's error against float64 may be this many times eager's own before a gradient counts as wrong.
THUNDER_SLACK = 3.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--size", default=None, choices=("tiny", "realistic"),
                        help="harness size (default: realistic on CUDA, tiny on CPU)")
    parser.add_argument("--models", default=",".join(ZOO), help=f"zoo models (default {','.join(ZOO)})")
    parser.add_argument("--parts", default="grads,oob,identity,cost", help="which parts (default all)")
    parser.add_argument("--steps", type=int, default=4, help="training steps of the identity runs (default 4)")
    parser.add_argument("--oob-steps", type=int, default=2, help="steps of the GPT's checked run (default 2)")
    parser.add_argument("--gpt-layers", type=int, default=None, help="layers of the GPT (default 12; tiny 2)")
    parser.add_argument("--gpt-batch", type=int, default=None, help="batch of the GPT (default 8; tiny 2)")
    parser.add_argument("--expect-oob", default=None,
                        help="the piece the GPT's run must flag (default on CUDA graph0/thunder_0/nvFusion0_forward, "
                             "on CPU none); 'none' expects no mismatch")
    parser.add_argument("--cost-model", default="llama", help="the model of the cost part (default llama)")
    parser.add_argument("--every", type=int, default=50, help="CHECK_EVERY of the cost part (default 50)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the cost part (default 4)")
    parser.add_argument("--cost-budget", type=float, default=150.0, help="seconds kept for the cost part (150)")
    parser.add_argument("--jobs", type=int, default=None, help="processes at a time (default 16 on CUDA, 2 on CPU)")
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds for everything (default 540)")
    parser.add_argument("--json", type=Path, default=None, help="write everything here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return args
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    args.device = args.device or ("cuda" if cuda else "cpu")
    on_cuda = args.device.startswith("cuda")
    args.size = args.size or ("realistic" if on_cuda else "tiny")
    args.jobs = args.jobs or (16 if on_cuda else 2)
    args.gpt_layers = args.gpt_layers or (12 if args.size == "realistic" else 2)
    args.gpt_batch = args.gpt_batch or (8 if args.size == "realistic" else 2)
    if args.expect_oob is None:
        args.expect_oob = "graph0/thunder_0/nvFusion0_forward" if on_cuda else "none"
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = args.parts - {"grads", "oob", "identity", "cost"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from grads, oob, identity, cost")
    return args


# ---- in a worker process ------------------------------------------------------------------------------------------

def _setup(job: dict):
    sys.path.insert(0, str(HERE))
    import thunderfx_debug  # noqa: F401  (before thunder)
    import torch

    if job["device"] == "cpu":
        torch.set_num_threads(1)  # with more, MKL picks its thread count by the machine's load: last bits differ
    return torch


def _dtype(job: dict) -> str:
    return "bfloat16" if job["device"].startswith("cuda") else "float32"


def _sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _checks(report) -> dict:
    """The sentinel's verdicts of a report: the correctness section and, per piece that was not clean, its record."""
    from thunderfx_debug.render.correctness import checked_pieces, render_correctness

    pieces = checked_pieces(report)
    statuses = {}
    for p in pieces:
        statuses[p.status] = statuses.get(p.status, 0) + 1
    return {
        "correctness": render_correctness(report),
        "pieces": len(pieces), "statuses": statuses,
        "not_clean": {p.path: {"status": p.status, "reasons": list(p.reasons),
                               **({} if p.check is None else {k: v for k, v in p.check.to_json().items()
                                                               if k in ("mismatches", "compared", "worst_output",
                                                                        "worst_ratio", "mismatched_values",
                                                                        "writes_unowned_memory", "overwritten")})}
                      for p in pieces if p.status != "clean"},
        "mismatching": [p.path for p in pieces if p.status == "mismatch"],
        "verified_gradients": sum(p.check.verified_gradients for p in pieces if p.check is not None),
    }


def _parameter_name(label: str) -> str | None:
    """"gradient of input 6 (l_self_modules_transformer_modules_h_modules_0_modules_ln_1_parameters_weight_)" ->
    "transformer.h.0.ln_1.weight" (Dynamo's name of a lifted parameter); None for other values."""
    if "(" not in label or "_parameters_" not in label:
        return None
    name = label.rsplit("(", 1)[1].rstrip(")").rstrip("_")
    for prefix in ("l_self_", "l_args_0_", "l_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = name.removeprefix("modules_")
    return name.replace("_modules_", ".").replace("_parameters_", ".")


def _node_wrappers_persist(torch) -> bool:
    """Whether this torch keeps a live autograd node's Python wrapper alive with the node (>= 2.12)."""
    from torch.autograd.graph import get_gradient_edge

    parameters = [torch.nn.Parameter(torch.randn(2)) for _ in range(4)]
    out = torch.stack(parameters).sum()
    ids = [id(get_gradient_edge(p).node) for p in parameters]
    node = out.grad_fn.next_functions[0][0]
    return ids == [id(n) for n, _ in node.next_functions]


def grads_worker(job: dict) -> dict:
    torch = _setup(job)
    from thunderfx_debug import ReportingBackend
    from thunderfx_debug import plain_thunder_compiler
    from internals import watching_backward_captures

    name, device = job["model"], job["device"]
    base, batch = harness.build(name, job["size"], device, _dtype(job))
    options = harness.thunder_options(device)
    random = name.endswith("-dropout")

    def gradients(model) -> dict:
        return {n: p.grad.detach().double().cpu() for n, p in model.named_parameters() if p.grad is not None}

    def one_step(model, backend=None):
        compiled = torch.compile(model, backend=backend) if backend is not None else model
        torch.manual_seed(0)
        compiled(**batch).loss.backward()
        _sync(torch, device)
        return gradients(model)

    result = {"model": name, "torch": torch.__version__, "node_wrappers_persist": _node_wrappers_persist(torch)}
    started = time.perf_counter()
    independent = {}
    if not random:
        independent["eager"] = one_step(copy.deepcopy(base))
        independent["float64"] = one_step(copy.deepcopy(base).double())
        torch._dynamo.reset()
        independent["thunder"] = one_step(copy.deepcopy(base), plain_thunder_compiler(lazy_inductor_fallback=True,
                                                                                          **options))
    torch._dynamo.reset()
    captures = []

    def note(label, verified, address, captured):  # the capture diagnostic: what the sentinel captured, before judging
        captures.append({"input": label, "verified": verified, "ptr": address,
                         "captured": None if captured is None else captured.detach().double().cpu()})

    reported = copy.deepcopy(base)
    backend = ReportingBackend(check="fusion", check_every=1, **options)
    with watching_backward_captures(note):
        independent["reporting"] = one_step(reported, backend)
    report = backend.report()
    result["sentinel"] = _checks(report)
    result["reporting_failures"] = [f"{f.get('what')}: {f.get('error')}"
                                    for f in report.meta.get("reporting_failures", [])[:10]]

    by_ptr = {p.data_ptr(): n for n, p in reported.named_parameters()}
    capture_rows = []
    for c in captures:
        parameter = by_ptr.get(c["ptr"])
        if parameter is None or c["captured"] is None or parameter not in independent["reporting"]:
            continue
        grad = independent["reporting"][parameter]
        difference = float((c["captured"] - grad).abs().max()) if c["captured"].shape == grad.shape else math.inf
        capture_rows.append({"input": c["input"], "parameter": parameter, "verified": c["verified"],
                             "relative_difference": difference / max(float(grad.abs().max()), 1e-30)})
    result["captures"] = {
        "parameters": len(capture_rows),
        "equal_to_grad": sum(r["relative_difference"] == 0 for r in capture_rows),
        "verified": sum(r["verified"] for r in capture_rows),
        "verified_but_different": [r for r in capture_rows if r["verified"] and r["relative_difference"] != 0],
        "different": [r for r in capture_rows if r["relative_difference"] != 0][:20],
    }
    if not random:
        wide = independent["float64"]
        rows = []
        for parameter, g64 in wide.items():
            scale = float(g64.abs().max()) or 1.0
            errors = {k: float((independent[k][parameter] - g64).abs().max()) / scale
                      for k in ("eager", "thunder", "reporting") if parameter in independent[k]}
            rows.append({"parameter": parameter, **errors,
                         "reporting_equals_thunder": bool(torch.equal(independent["reporting"].get(parameter),
                                                                      independent["thunder"].get(parameter)))
                         if parameter in independent["reporting"] and parameter in independent["thunder"] else False})
        wrong = [r["parameter"] for r in rows if r.get("thunder", math.inf) > THUNDER_SLACK * r["eager"] + 1e-12]
        result["independent"] = {"parameters": len(rows), "thunder_beyond_eager": wrong,
                                 "reporting_equals_thunder": sum(r["reporting_equals_thunder"] for r in rows),
                                 "worst": sorted(rows, key=lambda r: -(r.get("thunder", 0) / max(r["eager"], 1e-30)))[:5]}
        labels = [label for path in result["sentinel"]["mismatching"]
                  for label in result["sentinel"]["not_clean"][path].get("mismatched_values", [])]
        named = {_parameter_name(label) for label in labels} - {None}
        # Thunder's gradients right everywhere: every MISMATCH of this model is false; else those naming a right one
        result["false_mismatches"] = (result["sentinel"]["mismatching"] if not wrong else
                                      sorted(named - set(wrong)))
    else:
        result["false_mismatches"] = result["sentinel"]["mismatching"]  # dropout: random pieces are never compared
    result["wall_s"] = time.perf_counter() - started
    return result


def oob_worker(job: dict) -> dict:
    torch = _setup(job)
    from thunderfx_debug import ReportingBackend
    from thunderfx_debug.commands.models import (
        GPT,
        GPT_12_LAYER,
        GPTConfig,
        synthetic_batches,
    )

    device = job["device"]
    config = GPTConfig(**{**vars(GPT_12_LAYER), "n_layer": job["gpt_layers"]}) if job["size"] == "realistic" else \
        GPTConfig(vocab_size=64, block_size=16, n_layer=job["gpt_layers"], n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = GPT(config).to(device=device, dtype=getattr(torch, _dtype(job)))
    backend = ReportingBackend(check="fusion", check_every=1, **harness.thunder_options(device))
    batches = [b for _, b in zip(range(job["oob_steps"]), synthetic_batches(config, job["gpt_batch"], device))]
    trainer = harness.Trainer(model, backend, batches, lr=1e-4, device=device)
    started = time.perf_counter()
    losses = [float(trainer.step().float()) for _ in range(job["oob_steps"])]
    result = {"losses": losses, "sentinel": _checks(backend.report()), "wall_s": time.perf_counter() - started}
    if device.startswith("cuda"):
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def _digest(torch, model) -> str:
    digest = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


IDENTITY_RUNS = ("off", "off_again", "fusion")


def identity_verdict(runs: dict[str, dict]) -> dict:
    """What the identity runs of one model say: "error" (a run failed), "nondeterministic without the check" (the
    two check-off runs differ: not judged), "CHECK=fusion changed the training" (the check-off runs agree, the
    checked run differs), or "bit-identical". `step` is the first step whose loss differs (1-based; None where only
    the parameters do), `fusion_equals` the check-off runs the checked run equals.

    Example:
        >>> run = lambda *bits, sha="a": {"loss_bits": list(bits), "parameters_sha256": sha}
        >>> identity_verdict({"off": run("1", "2"), "off_again": run("1", "3", sha="b"), "fusion": run("1", "2")})
        {'verdict': 'nondeterministic without the check', 'step': 2, 'fusion_equals': ['off']}
        >>> identity_verdict({"off": run("1"), "off_again": run("1"), "fusion": run("1", sha="c")})["verdict"]
        'CHECK=fusion changed the training'
    """
    if any("error" in runs.get(name, {"error": "missing"}) for name in IDENTITY_RUNS):
        return {"verdict": "error", "step": None, "fusion_equals": []}

    def same(a: dict, b: dict) -> bool:
        return a["loss_bits"] == b["loss_bits"] and a["parameters_sha256"] == b["parameters_sha256"]

    def first_difference(a: dict, b: dict) -> int | None:
        return next((n + 1 for n, (x, y) in enumerate(zip(a["loss_bits"], b["loss_bits"])) if x != y), None)

    off, again, fusion = (runs[name] for name in IDENTITY_RUNS)
    equals = [name for name in ("off", "off_again") if same(runs[name], fusion)]
    if not same(off, again):
        return {"verdict": "nondeterministic without the check", "step": first_difference(off, again),
                "fusion_equals": equals}
    if not equals:
        return {"verdict": "CHECK=fusion changed the training", "step": first_difference(off, fusion),
                "fusion_equals": []}
    return {"verdict": "bit-identical", "step": None, "fusion_equals": equals}


def identity_worker(job: dict) -> dict:
    torch = _setup(job)
    from thunderfx_debug import ReportingBackend

    model, batch = harness.build(job["model"], job["size"], job["device"], _dtype(job))
    options = {"check": "fusion", "check_every": 1} if job["check"] == "fusion" else {}
    backend = ReportingBackend(**options, **harness.thunder_options(job["device"]))
    torch.manual_seed(0)
    started = time.perf_counter()
    losses = harness.train(model, batch, backend, steps=job["steps"])
    _sync(torch, job["device"])
    result = {"losses": [float(loss.float()) for loss in losses], "loss_bits": [float(loss.float()).hex() for loss in losses],
              "parameters_sha256": _digest(torch, model), "wall_s": time.perf_counter() - started}
    if job["check"] == "fusion":
        result["sentinel"] = _checks(backend.report())
    return result


def cost_worker(job: dict) -> dict:
    torch = _setup(job)
    from thunderfx_debug import ReportingBackend

    device, every, cuda = job["device"], job["every"], job["device"].startswith("cuda")
    base, batch = harness.build(job["model"], job["size"], device, _dtype(job))
    options = harness.thunder_options(device)
    levels = ("off", "split", "fusion")
    copies = {level: harness.Trainer(copy.deepcopy(base), ReportingBackend(
        **({} if level == "off" else {"check": level, "check_every": every}), **options), [batch], lr=1e-4,
        device=device) for level in levels}

    def checked(level: str, number: int) -> bool:  # the first step is call 1 of every graph
        return level != "off" and (number - 1) % every == 0

    started = time.perf_counter()
    for level in levels:  # compiles; the checked copies' first steps are checked calls
        for _ in range(2):
            copies[level].step()
    # align every copy so that a block of `every` steps holds exactly one checked call
    for trainer in copies.values():
        for _ in range((every - trainer.steps_done % every) % every):
            trainer.step()
    _sync(torch, device)
    warmup_s = time.perf_counter() - started
    memory = {}

    def block_of(level: str):
        def block() -> list[tuple[int, float]]:
            trainer, first = copies[level], copies[level].steps_done + 1
            if not (cuda and level == "fusion" and not memory):
                return list(zip(range(first, first + every), trainer.block(every)))
            # the fusion copy's first block: peak memory over its checked step and the unchecked one after it
            marks, numbers = [trainer.clock.mark()], []
            for number in range(first, first + every):
                around = checked(level, number) or checked(level, number - 1)
                if around:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                trainer.step()
                if around:
                    torch.cuda.synchronize()
                    memory["checked" if checked(level, number) else "unchecked"] = \
                        torch.cuda.max_memory_allocated() / 2**30
                marks.append(trainer.clock.mark())
                numbers.append(number)
            return list(zip(numbers, trainer.clock.between(marks)))
        return block

    rounds = harness.interleaved({level: block_of(level) for level in levels}, job["rounds"])
    blocks = {level: [statistics.fmean(ms for _, ms in done) for done in blocks_of]
              for level, blocks_of in rounds.items()}
    per_step = {level: {"checked": [ms for done in blocks_of for n, ms in done if checked(level, n)],
                        "unchecked": [ms for done in blocks_of for n, ms in done if not checked(level, n)]}
                for level, blocks_of in rounds.items()}
    steps = {level: {kind: {"count": len(ms), "median_ms": statistics.median(ms) if ms else None}
                     for kind, ms in kinds.items()} for level, kinds in per_step.items()}
    findings = {level: _checks(copies[level].backend.report()) for level in ("split", "fusion")}
    return {"model": job["model"], "every": every, "rounds": job["rounds"], "clock": copies["off"].clock.name,
            "warmup_s": warmup_s, "block_mean_ms": blocks, "amortized_ratio": harness.paired_ratios(blocks, "off"),
            "steps": steps, "peak_memory_gb": memory or None, "sentinel": findings}


WORKERS = {"grads": grads_worker, "oob": oob_worker, "identity": identity_worker, "cost": cost_worker}


def worker_main(spec: str) -> int:
    job = json.loads(spec)
    try:
        result = WORKERS[job["part"]](job)
    except BaseException as error:  # the parent reads the reason from the file
        result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
    Path(job["out"]).write_text(json.dumps(result, indent=1, default=str))
    return 0


# ---- the parent ---------------------------------------------------------------------------------------------------

def _run(job: dict, timeout: float) -> dict:
    if timeout <= 5:
        return {"error": "not run: out of time (--deadline)"}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key in [k for k in env if k.startswith("THUNDERFX_DEBUG_")]:
        del env[key]
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"out of time after {timeout:.0f} s (--deadline)"}
    try:
        result = json.loads(Path(job["out"]).read_text())
    except (OSError, ValueError):
        result = {"error": f"the worker died (exit {done.returncode}): {done.stderr[-2000:]}"}
    result["process_s"] = time.perf_counter() - started
    return result


def _verdicts(results: dict, args: argparse.Namespace) -> dict:
    problems = []
    for key, result in results.items():
        if "error" in result:
            problems.append(f"{key}: {result['error'][:300]}")
    false = {m: r["false_mismatches"] for m, r in results.get("grads", {}).items() if r.get("false_mismatches")}
    for model, pieces in false.items():
        problems.append(f"grads {model}: false MISMATCH {pieces}")
    oob = results.get("oob")
    if oob is not None and "error" not in oob:
        flagged = oob["sentinel"]["mismatching"]
        if args.expect_oob == "none" and flagged:
            problems.append(f"oob: unexpected MISMATCH {flagged}")
        elif args.expect_oob != "none" and args.expect_oob not in flagged:
            problems.append(f"oob: {args.expect_oob} not flagged (flagged: {flagged})")
    not_judged = []
    for model, runs in results.get("identity", {}).items():
        verdict = identity_verdict(runs)
        if verdict["verdict"] == "CHECK=fusion changed the training":
            problems.append(f"identity {model}: CHECK=fusion changed the training (check off twice "
                            f"{runs['off']['losses']}; checked {runs['fusion']['losses']})")
        elif verdict["verdict"] == "nondeterministic without the check":
            not_judged.append(f"identity {model}: nondeterministic without the check (the two check-off runs differ "
                              f"from step {verdict['step']}: {runs['off']['losses']} against "
                              f"{runs['off_again']['losses']}; the checked run equals "
                              f"{' and '.join(verdict['fusion_equals']) or 'neither'})")
    return {"ok": not problems, "problems": problems, "not_judged": not_judged}


def _table(results: dict) -> list[str]:
    lines = ["| model | sentinel pieces | MISMATCH | false MISMATCH | Thunder grads beyond 3x eager's error | "
             "captures equal to .grad / proved / parameters | training with CHECK=fusion (check off twice) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model in sorted(set(results.get("grads", {})) | set(results.get("identity", {}))):
        g = results.get("grads", {}).get(model, {})
        i = results.get("identity", {}).get(model, {})
        sentinel = g.get("sentinel", {})
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(sentinel.get("statuses", {}).items()))
        independent = g.get("independent")
        captures = g.get("captures", {})
        identical = identity_verdict(i)["verdict"] if i else "-"
        lines.append(f"| {model} | {g.get('error', statuses)[:60]} | {len(sentinel.get('mismatching', []))} | "
                     f"{len(g.get('false_mismatches', [])) if g else '-'} | "
                     f"{'-' if independent is None else len(independent['thunder_beyond_eager'])} | "
                     f"{captures.get('equal_to_grad', '-')} / {captures.get('verified', '-')} / "
                     f"{captures.get('parameters', '-')} | {identical} |")
    return lines


def jobs_of(args, scratch: Path) -> list[tuple[tuple[str, ...], dict]]:
    """(key, job) of every worker process but the cost part's: the GPT's, and per model its grads and identity runs."""
    common = {"device": args.device, "size": args.size}
    jobs = []
    if "oob" in args.parts:
        jobs.append((("oob",), {**common, "part": "oob", "gpt_layers": args.gpt_layers, "gpt_batch": args.gpt_batch,
                                "oob_steps": args.oob_steps}))
    for model in args.models:
        if "grads" in args.parts:
            jobs.append((("grads", model), {**common, "part": "grads", "model": model}))
        if "identity" in args.parts:
            for run in IDENTITY_RUNS:
                jobs.append((("identity", model, run), {**common, "part": "identity", "model": model,
                                                        "check": run.removesuffix("_again"), "steps": args.steps}))
    for n, (_, job) in enumerate(jobs):
        job["out"] = str(scratch / f"job{n}.json")
    return jobs


def run_all(args, deadline: float) -> dict:
    """Every part's workers, --jobs at a time, then the cost part alone on the device; results by part (and model)."""
    scratch = Path(tempfile.mkdtemp(prefix="sentinel_zoo_"))
    keep = args.cost_budget if "cost" in args.parts else 0.0
    results: dict = {}

    def run(item):
        key, job = item
        return key, _run(job, deadline - keep - time.perf_counter())

    with ThreadPoolExecutor(args.jobs) as pool:
        for key, result in pool.map(run, jobs_of(args, scratch)):
            if key[0] == "oob":
                results["oob"] = result
            elif key[0] == "grads":
                results.setdefault("grads", {})[key[1]] = result
            else:
                results.setdefault("identity", {}).setdefault(key[1], {})[key[2]] = result
            print(f"  {' '.join(key)}: {result.get('error', 'done')[:200]} ({result.get('process_s', 0):.0f} s)",
                  flush=True)
    if "cost" in args.parts:
        job = {"device": args.device, "size": args.size, "part": "cost", "model": args.cost_model,
               "every": args.every, "rounds": args.rounds, "out": str(scratch / "cost.json")}
        results["cost"] = _run(job, deadline - time.perf_counter())
        print(f"  cost {args.cost_model}: {results['cost'].get('error', 'done')[:200]}", flush=True)
    return results


def print_summary(results: dict, verdicts: dict) -> None:
    print("\n".join(_table(results)))
    cost = results.get("cost", {})
    if "amortized_ratio" in cost:
        for level, ratio in cost["amortized_ratio"].items():
            steps = cost["steps"][level]
            print(f"cost {cost['model']} at {level}, every {cost['every']}: amortized step ratio median "
                  f"{ratio['median']:.3f} (range {ratio['min']:.3f}-{ratio['max']:.3f}, {cost['rounds']} rounds); "
                  f"checked step {steps['checked']['median_ms']:.1f} ms, unchecked {steps['unchecked']['median_ms']:.1f} "
                  f"ms ({cost['clock']})")
        if cost.get("peak_memory_gb"):
            print(f"peak memory at fusion: {cost['peak_memory_gb']}")
    oob = results.get("oob", {})
    if "sentinel" in oob:
        print(f"oob GPT: flagged {oob['sentinel']['mismatching']}")
    if verdicts["not_judged"]:
        print("NOT JUDGED:\n  " + "\n  ".join(verdicts["not_judged"]))
    print("OK" if verdicts["ok"] else "PROBLEMS:\n  " + "\n  ".join(verdicts["problems"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)
    started = time.perf_counter()
    results = run_all(args, started + args.deadline)
    verdicts = _verdicts(results, args)
    harness.write_record(args.json, "sentinel_zoo", {
        "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items() if k != "json"},
        "wall_s": time.perf_counter() - started, "verdicts": verdicts, **results}, argv)
    print_summary(results, verdicts)
    return 0 if verdicts["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
