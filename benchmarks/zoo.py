"""A zoo of small Hugging Face models (built from configs: no weights, no network) trained under ReportingBackend with
every repro script dumped; then every script runs as its users will, in a fresh interpreter where thunderfx_debug
cannot be imported (`thunderfx_debug.artifacts.repro.standalone`), and the outcomes are counted per model and kind.

    python benchmarks/zoo.py --device cpu --models llama,bert --json zoo_cpu.json      # Thunder's torch.compile executor
    source .gpu/setup.sh && python benchmarks/zoo.py --device cuda --json zoo_h200.json  # Thunder's defaults (nvFuser)

Models: llama, mistral, qwen2, gpt2, phi3, gemma, bert (dropout off, so that every piece can be compared with
eager), and gpt2-dropout and bert-dropout (as configured by default, dropout 0.1: their random pieces must say NOT
COMPARABLE or match after reseeding, never pass vacuously). Each trains in its own process (`--train-jobs` at a time) for
`--steps` steps with THUNDERFX_DEBUG_REPRO=all, all sharing one inductor cache directory under the dump, which the
scripts then use too. Scripts run `--jobs` at a time. Kinds: graph_{eager,thunder,torchcompile},
split_{eager,thunder,inductor}, fusion_{nvfuser,inductor}.

Writes (with --json) every script's outcome, RESULT line and wall time, and the counts; prints a Markdown table of
passes per model and kind (for benchmarks/RESULTS.md) and the failures with their RESULT lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VOCAB, SEQ, BATCH = 128, 16, 2
MODELS = ("llama", "mistral", "qwen2", "gpt2", "phi3", "gemma", "bert", "gpt2-dropout", "bert-dropout")
KINDS = ("graph_eager", "graph_thunder", "graph_torchcompile", "split_eager", "split_thunder", "split_inductor",
         "fusion_nvfuser", "fusion_inductor")
# hidden 32, 2 heads of 16, 1 KV head (grouped-query attention where the model has it), 1 layer, MLP 64.
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              max_position_embeddings=64)


def config_for(name: str):
    """(model class, config) of a zoo model (the architecture's name without the "-dropout" suffix)."""
    import transformers as tf

    base = name.removesuffix("-dropout")
    if base == "llama":
        return tf.LlamaForCausalLM, tf.LlamaConfig(**COMMON, num_key_value_heads=1)
    if base == "mistral":
        return tf.MistralForCausalLM, tf.MistralConfig(**COMMON, num_key_value_heads=1, sliding_window=None)
    if base == "qwen2":
        return tf.Qwen2ForCausalLM, tf.Qwen2Config(**COMMON, num_key_value_heads=1)
    if base == "phi3":
        return tf.Phi3ForCausalLM, tf.Phi3Config(**COMMON, num_key_value_heads=1, pad_token_id=0, bos_token_id=1,
                                                 eos_token_id=2)
    if base == "gemma":
        return tf.GemmaForCausalLM, tf.GemmaConfig(**COMMON, num_key_value_heads=1, head_dim=16)
    if base == "gpt2":
        return tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                                 n_inner=64, bos_token_id=1, eos_token_id=2)
    if base == "bert":
        return tf.BertForMaskedLM, tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=64,
                                                 max_position_embeddings=64, type_vocab_size=2)
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def build(name: str, device: str, dtype: str, seed: int = 0):
    """(model, batch): the model in train mode and the keyword arguments of one batch. The second sequence ends in
    two padding positions (attention_mask 0, labels -100), so that the models' mask paths are traced; BERT predicts
    three masked positions per sequence. No KV cache (its torch.cat would be one more inductor split per decoder)."""
    import torch

    torch.manual_seed(seed)
    cls, config = config_for(name)
    config.use_cache = False
    if not name.endswith("-dropout"):
        for key, value in config.to_dict().items():
            if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
                setattr(config, key, 0.0)
    config._attn_implementation = "sdpa"
    model = cls(config).to(device, getattr(torch, dtype)).train()
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB, (BATCH, SEQ), generator=generator)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    labels = input_ids.clone()
    attention_mask[1, -2:] = 0
    labels[1, -2:] = -100
    if name.startswith("bert"):
        labels = torch.full_like(input_ids, -100)
        labels[:, [1, 5, 9]] = input_ids[:, [1, 5, 9]]
        input_ids[:, [1, 5, 9]] = 3  # a stand-in [MASK] id
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return model, {key: value.to(device) for key, value in batch.items()}


def train(name: str, dump: Path, device: str, dtype: str, steps: int) -> dict:
    """Trains one model under ReportingBackend (all repro scripts), flushes, and returns facts of the run."""
    started = time.perf_counter()
    import thunderfx_debug  # noqa: F401  (first: the workaround `import thunder` needs on this torch)
    import thunder
    import torch
    from thunderfx_debug import ReportingBackend

    options = {}
    if device == "cpu":  # Thunder's default executors fuse nothing on CPU; its torch.compile executor does
        from thunder.executors.torch_compile import torch_compile_ex

        options["executors"] = [torch_compile_ex, *thunder.get_default_executors()]
    model, batch = build(name, device, dtype)
    backend = ReportingBackend(dump_dir=dump, repro="all", strict=True, **options)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = compiled(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    rank_dir = backend.flush()
    report = backend.report()
    splits = [s for g in report.graphs for s in g.splits]
    return {"model": name, "dump": str(rank_dir), "train_s": round(time.perf_counter() - started, 1),
            "losses": [round(float(x), 4) for x in losses], "graphs": len(report.graphs),
            "thunder_splits": sum(s.kind.value == "thunder" for s in splits),
            "inductor_splits": sum(s.kind.value == "inductor" for s in splits),
            "fusions": sum(len(s.fusions) for s in splits),
            "reporting_failures": report.meta.get("reporting_failures", [])}


# ---- scripts --------------------------------------------------------------------------------------------------------


def script_kind(path: Path) -> str:
    """graph_thunder, split_inductor, fusion_nvfuser, ... from a script's place and name in the dump."""
    suffix = path.stem.rsplit("_repro_", 1)[-1]
    if path.parent.name == "fusions":
        return f"fusion_{suffix}"
    return f"split_{suffix}" if re.fullmatch(r"graph\d+_(thunder|inductor)_\d+", path.parent.name) else f"graph_{suffix}"


def random_ops_of(path: Path) -> tuple[str, ...]:
    """The random ops a script declares in its call of `main` (empty for deterministic pieces)."""
    found = re.findall(r"^        random_ops=\(([^)]*)\),$", path.read_text(), re.M)  # the last call: main's
    return tuple(part.strip(" '\"") for part in found[-1].split(",") if part.strip()) if found else ()


def scripts_of(rank_dir: Path) -> list[Path]:
    return sorted(rank_dir.rglob("*_repro_*.py"))


#: The order in which `sample` takes kinds: the backends' own pieces first, the eager ones (which check only that
#: they run) last.
SAMPLE_ORDER = ("fusion_nvfuser", "fusion_inductor", "split_thunder", "split_inductor", "graph_thunder",
                "graph_torchcompile", "split_eager", "graph_eager")


def sample(scripts: list[Path], per_model: int) -> list[Path]:
    """`per_model` scripts spread over the kinds: the first of each kind in turn, in `SAMPLE_ORDER` (deterministic)."""
    by_kind: dict[str, list[Path]] = defaultdict(list)
    for script in scripts:
        by_kind[script_kind(script)].append(script)
    chosen: list[Path] = []
    while len(chosen) < per_model and any(by_kind.values()):
        for kind in [k for k in SAMPLE_ORDER if k in by_kind]:
            if by_kind[kind] and len(chosen) < per_model:
                chosen.append(by_kind[kind].pop(0))
    return chosen


def run_scripts(scripts: list[Path], jobs: int, timeout_s: float, env: dict[str, str], deadline: float | None = None):
    """Each script's run, `jobs` at a time. Past `deadline` (a time.monotonic() value) no script starts: those left
    are NOT_RUN, so that a run on a lent machine ends in its time with what it has."""
    from thunderfx_debug.artifacts.repro.standalone import ScriptRun, run_script

    def one(script: Path):
        left = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
        if left <= 0:
            return ScriptRun(str(script), "NOT_RUN", None, 0.0, "", "")
        return run_script(script, timeout_s=left, env=env)

    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads only wait on the subprocesses
        return list(pool.map(one, scripts))


def table(rows: list[dict]) -> str:
    """Markdown: passes / scripts per model and kind, then the other outcomes per model."""
    models = list(dict.fromkeys(row["model"] for row in rows))
    kinds = [k for k in KINDS if any(row["kind"] == k for row in rows)]
    lines = ["| model | " + " | ".join(kinds) + " | not OK |", "| --- |" + " --- |" * (len(kinds) + 1)]
    for model in models:
        mine = [row for row in rows if row["model"] == model]
        cells = []
        for kind in kinds:
            of_kind = [row for row in mine if row["kind"] == kind]
            cells.append(f"{sum(row['outcome'] == 'OK' for row in of_kind)}/{len(of_kind)}" if of_kind else "")
        others = Counter(row["outcome"] for row in mine if row["outcome"] != "OK")
        cells.append(", ".join(f"{n} {outcome}" for outcome, n in sorted(others.items())) or "none")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dump", default="zoo_dump", help="dump directory (one folder per model)")
    parser.add_argument("--train-jobs", type=int, default=1, help="models trained at once (default 1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="scripts run at once")
    parser.add_argument("--all-of", default=None, help="comma list of models whose every script runs; others are "
                        "sampled with --sample (default: every script of every model)")
    parser.add_argument("--sample", type=int, default=0, help="scripts per model outside --all-of")
    parser.add_argument("--random-of", default="", help="comma list of models whose Thunder split and fusion scripts "
                        "with random ops all run, besides those --all-of or --sample choose")
    parser.add_argument("--only-random", action="store_true", help="run only the scripts of pieces with random ops")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per script")
    parser.add_argument("--deadline", type=float, default=None, help="seconds after the start by which every script "
                        "must have ended: those that cannot start in time are NOT_RUN (default: no deadline)")
    parser.add_argument("--json", help="write the outcomes and counts here")
    parser.add_argument("--train", metavar="MODEL", help=argparse.SUPPRESS)  # a child: train one model, print JSON
    args = parser.parse_args(argv)
    dump = Path(args.dump).absolute()
    if args.train:
        print("ZOO " + json.dumps(train(args.train, dump / args.train, args.device, args.dtype, args.steps)))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    deadline = None if args.deadline is None else time.monotonic() + args.deadline
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(dump / "inductor_cache"))  # one cache for training and scripts
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no pool of compile workers per process
    for name in [n for n in env if n.startswith("THUNDERFX_DEBUG_")]:
        del env[name]
    started = time.perf_counter()
    trained = _train_all(models, args, dump, env, deadline)
    train_s = time.perf_counter() - started
    full = set(models if args.all_of is None else [m.strip() for m in args.all_of.split(",")])
    random_of = {m.strip() for m in args.random_of.split(",") if m.strip()}
    chosen: list[tuple[str, Path]] = []
    for model, facts in trained.items():
        if "error" in facts:
            continue
        scripts = scripts_of(Path(facts["dump"]))
        if args.only_random:
            scripts = [s for s in scripts if random_ops_of(s)]
        picked = scripts if model in full else sample(scripts, args.sample)
        if model in random_of:
            picked += [s for s in scripts if random_ops_of(s) and s not in picked
                       and script_kind(s) in ("split_thunder", "fusion_nvfuser", "fusion_inductor")]
        chosen += [(model, s) for s in picked]
    started = time.perf_counter()
    runs = run_scripts([s for _, s in chosen], args.jobs, args.timeout, env, deadline)
    scripts_s = time.perf_counter() - started
    rows = []
    for (model, script), run in zip(chosen, runs):
        rows.append({"model": model, "kind": script_kind(script), "script": str(script.relative_to(dump)),
                     "outcome": run.outcome, "result": run.result_line, "wall_s": round(run.wall_s, 2),
                     "random_ops": list(random_ops_of(script)),
                     "tail": "" if run.outcome == "OK" else (run.stdout[-1500:] + "\n" + run.stderr[-2500:])})
    print(table(rows))
    for row in rows:
        if row["outcome"] != "OK":
            print(f"\n{row['outcome']}: {row['script']}\n  {row['result'] or row['tail'][-600:]}")
    failed_training = {m: f["error"] for m, f in trained.items() if "error" in f}
    for model, error in failed_training.items():
        print(f"\nTRAINING FAILED: {model}\n{error}")
    ran = [r for r in rows if r["outcome"] not in ("NOT_RUN", "TIMEOUT")]
    medians = {kind: round(statistics.median(r["wall_s"] for r in ran if r["kind"] == kind), 1)
               for kind in KINDS if any(r["kind"] == kind for r in ran)}
    print(f"\ntraining {train_s:.0f} s, {len(rows)} scripts in {scripts_s:.0f} s ({args.jobs} at a time)")
    print("median wall seconds per script (a fresh interpreter: imports, build, check): "
          + ", ".join(f"{kind} {seconds}" for kind, seconds in medians.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": args.device, "dtype": args.dtype, "steps": args.steps, "train_s": round(train_s, 1),
            "scripts_s": round(scripts_s, 1), "jobs": args.jobs, "median_wall_s": medians, "models": trained,
            "scripts": rows,
            "counts": {m: dict(Counter(r["outcome"] for r in rows if r["model"] == m)) for m in trained},
        }, indent=1) + "\n")
    return 1 if failed_training else 0


def _train_all(models: list[str], args, dump: Path, env: dict[str, str], deadline: float | None) -> dict[str, dict]:
    """Trains each model in its own process, `--train-jobs` at a time; model -> its facts (or {"error": ...})."""

    def one(model: str) -> tuple[str, dict]:
        command = [sys.executable, __file__, "--train", model, "--device", args.device, "--dtype", args.dtype,
                   "--steps", str(args.steps), "--dump", str(dump)]
        timeout = 1800 if deadline is None else max(deadline - time.monotonic(), 1)
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return model, {"error": f"training did not end within {timeout:.0f} s"}
        lines = [line for line in done.stdout.splitlines() if line.startswith("ZOO ")]
        if done.returncode != 0 or not lines:
            return model, {"error": (done.stdout[-1000:] + "\n" + done.stderr[-3000:]).strip()}
        return model, json.loads(lines[-1][4:])

    with ThreadPoolExecutor(max_workers=max(1, args.train_jobs)) as pool:
        return dict(pool.map(one, models))


if __name__ == "__main__":
    sys.exit(main())
