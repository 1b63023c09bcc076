"""What each piece holds in memory, as the run measures it (`thunderfx_debug.recording.memory`), against counts made
by hand on the same model.

    source .gpu/setup.sh && python benchmarks/memory.py --json $OUT/memory_llama.json
    python benchmarks/memory.py --device cpu --size tiny --steps 4          # smoke test without a GPU

For the model (a zoo model, `benchmarks/harness.py`; default the realistic Llama in bfloat16 on CUDA):
1. by hand, saved bytes: `torch.autograd.graph.saved_tensors_hooks` around one forward of the model under plain
   ThunderCompiler (`plain_thunder_compiler`, its inductor fallbacks compiled lazily: 0.2.6 fails on a Hugging Face
   Llama on CUDA otherwise) and under torch.compile (inductor), the distinct storages saved, parameters left out;
2. ReportingBackend trains `--steps` steps (sampled every `--every` calls after one, THUNDERFX_DEBUG_TRIAGE=split),
   and around each step's forward and backward (the optimizer outside) the user's own reading: the peak counter reset
   before, `torch.cuda.max_memory_allocated()` less what was allocated before, after;
3. what the dump says, against 1 and 2: the splits' saved bytes summed and the graph's, against plain ThunderCompiler's
   count; the step's peak against the user's reading of the sampled steps; each split's peaks; and the triage's
   Thunder and inductor saved bytes of every split (the decoder split holds nearly every op), summed, against the
   two counts of 1.
The record (`--json`) holds every figure in bytes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama", choices=harness.MODELS)
    parser.add_argument("--size", default=None, choices=sorted(harness.SIZES),
                        help="zoo size (default: realistic on CUDA, tiny on CPU)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--steps", type=int, default=8, help="training steps under ReportingBackend (default 8)")
    parser.add_argument("--every", type=int, default=3, help="THUNDERFX_DEBUG_TIMING_EVERY (default 3)")
    parser.add_argument("--json", default=None, help="write the record here")
    args = parser.parse_args(argv)
    args.size = args.size or ("realistic" if args.device.startswith("cuda") else "tiny")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    return args


def saved_by_hand(model, batch: dict, backend) -> int:
    """Bytes of the distinct storages autograd saves in one forward of `model` compiled with `backend` (after a
    first step that compiles), parameters' storages left out."""
    import torch

    compiled = torch.compile(model) if backend == "inductor" else torch.compile(model, backend=backend)
    compiled(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = compiled(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def main(argv=None) -> dict:
    args = parse_args(argv)
    import thunderfx_debug
    import torch
    from thunderfx_debug.render import memory as render_memory
    from thunderfx_debug import plain_thunder_compiler

    cuda = args.device.startswith("cuda")
    by_hand = {}
    for name, backend in (("thunder", lambda: plain_thunder_compiler(lazy_inductor_fallback=cuda,
                                                                      **harness.thunder_options(args.device))),
                          ("inductor", lambda: "inductor")):
        torch._dynamo.reset()
        model, batch = harness.build(args.model, args.size, args.device, args.dtype)
        by_hand[name] = saved_by_hand(model, batch, backend())
        del model
    print(f"by hand: plain ThunderCompiler saves {by_hand['thunder']} B, inductor {by_hand['inductor']} B")

    torch._dynamo.reset()
    model, batch = harness.build(args.model, args.size, args.device, args.dtype)
    dump = Path(tempfile.mkdtemp(prefix="memory_"))
    backend = thunderfx_debug.ReportingBackend(dump, timing_every=args.every, timing_warmup=1, triage="split",
                                               flush_every=0, **harness.thunder_options(args.device))
    trainer = harness.Trainer(model, backend, [batch])
    readings = []
    for _ in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        out = trainer.compiled(**batch)
        out.loss.backward()
        if cuda:
            torch.cuda.synchronize()
            readings.append(torch.cuda.max_memory_allocated() - before)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    report = thunderfx_debug.load_report(backend.flush())
    sampled = list(range(2, args.steps + 1, args.every))
    splits = [(f"{g.name}/{s.name}", s) for g in report.graphs for s in g.splits]
    triaged = [s.triage for _, s in splits if s.triage is not None and s.triage.thunder_memory is not None]
    step = report.step_memory
    results = {
        "model": args.model, "size": args.size, "dtype": args.dtype, "device": args.device, "sampled_calls": sampled,
        "by_hand_saved": by_hand,
        "splits_saved_sum": sum(s.memory.saved_bytes or 0 for _, s in splits if s.memory is not None),
        "graphs_saved": {g.name: g.memory and g.memory.saved_bytes for g in report.graphs},
        "step": step and {**step.to_json(), "peak_bytes": step.peak_bytes},
        "user_peak_readings": readings,
        "user_peak_of_sampled_steps": max((readings[c - 1] for c in sampled), default=None) if readings else None,
        "splits": {path: s.memory and {**s.memory.to_json(),
                                       "triage_thunder": s.triage and s.triage.thunder_memory
                                       and s.triage.thunder_memory.to_json(),
                                       "triage_inductor": s.triage and s.triage.inductor_memory
                                       and s.triage.inductor_memory.to_json()}
                   for path, s in splits},
        "triage_saved_sum": {"thunder": sum(t.thunder_memory.saved_bytes or 0 for t in triaged),
                             "inductor": sum(t.inductor_memory.saved_bytes or 0 for t in triaged)},
    }
    print(f"the run: splits' saved bytes summed {results['splits_saved_sum']} B (by hand under plain "
          f"ThunderCompiler: {by_hand['thunder']} B); graphs {results['graphs_saved']}")
    if step is not None:
        print(f"the step: saved {step.saved_bytes} B, peak {step.peak_bytes} B; the user's reading of the sampled "
              f"steps: {results['user_peak_of_sampled_steps']} B")
    print(f"the triage: Thunder {results['triage_saved_sum']['thunder']} B and inductor "
          f"{results['triage_saved_sum']['inductor']} B saved over the splits (by hand: {by_hand['thunder']} B and "
          f"{by_hand['inductor']} B)")
    print("\n".join(render_memory.summary_lines(report)))
    harness.write_record(args.json, "memory", results, argv)
    return results


if __name__ == "__main__":
    main()
