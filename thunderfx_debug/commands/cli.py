"""`thunderfx-debug`: the command line. It reads dumps (never importing thunder, except `demo` and `bench`) and
reports user mistakes (a missing or damaged dump, an unwritable output, a bad argument, a device that is not
there) as one clear line on stderr with exit status 2, not as a traceback.

A flag typed on the command line wins over the environment variable of the same setting (`demo --dir` over
THUNDERFX_DEBUG_DIR), with a warning naming both; the library's own rule is the other way round (see `config`).

    thunderfx-debug demo [--dir DIR]            train a small model under ReportingBackend, write and summarise a dump
    thunderfx-debug summary DIR                 the run at a glance (ranks side by side for a multi-rank dump)
    thunderfx-debug html DIR [-o FILE]          one self-contained HTML page with charts, traces and script links
    thunderfx-debug diff DIR_A DIR_B            what changed between two runs, timing changes beyond noise flagged
    thunderfx-debug diff DIR --runs [ID ...]    the same for consecutive runs of one directory (restarts of a job)
    thunderfx-debug runs DIR                    the runs of one directory: the latest and those before it
    thunderfx-debug bench DIR                   nvFuser/Thunder against inductor, region by region (needs CUDA)
    thunderfx-debug verify DIR                  run every repro script of the dump; verify.json and verify.md
    thunderfx-debug minimize SCRIPT             shrink a MISMATCH or CRASH script to the fewest ops that still fail
                                                (runs the script's piece: imports thunder too)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

from thunderfx_debug.settings.config import ConfigError
from thunderfx_debug.records.layout import BENCH as BENCH_REPORT
from thunderfx_debug.render.progress import progress
from thunderfx_debug.records import DumpError
from thunderfx_debug.render.text import plural
from thunderfx_debug.render.report import Report

log = logging.getLogger("thunderfx_debug")


class UsageError(Exception):
    """A mistake of the command's user: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors as one line (what is wrong and where to look) instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


DIR_HELP = "a dump directory (THUNDERFX_DEBUG_DIR of a run, holding rank0/, rank1/, ...) or one rank directory"


def _cmd_demo(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("thunder") is None:
        raise UsageError("the demo trains under Thunder, which is not installed here (pip install lightning-thunder)")
    if args.dir is not None and Path(args.dir).exists() and not Path(args.dir).is_dir():
        raise UsageError(f"--dir {args.dir} exists and is not a directory; give a directory for the dump")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise UsageError(f"--device cuda: {why} (torch {torch.__version__}); leave --device out to train on the CPU")
    from thunderfx_debug.commands.demo import run_demo

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rank_dir = run_demo(steps=args.steps, dump_dir=args.dir, device=device, show_progress=not args.no_progress)
    if rank_dir is not None:
        print(_next_commands(rank_dir.parent, on_cuda=device == "cuda"))
    return 0


def _typed_path(path: Path) -> str:
    """`path` as the user can type it here: relative to the current directory where it lies below it, else
    absolute."""
    try:
        shown = os.path.relpath(path)
    except ValueError:  # another drive
        return str(Path(path).resolve())
    return str(Path(path).resolve()) if shown.startswith("..") else shown


def _next_commands(dump_dir: Path, on_cuda: bool) -> str:
    """What to try after the demo beyond what its summary's "next:" says (the page, verify), with the directory as
    the user can type it (relative where it is below here)."""
    shown = _typed_path(dump_dir)
    other = shlex.quote(shown.rstrip("/") + "_b")
    shown = shlex.quote(shown)
    bench = f"thunderfx-debug bench {shown}" + ("" if on_cuda else " --allow-cpu")
    commands = [
        (f"thunderfx-debug demo --dir {other}", "a second run, then:"),
        (f"thunderfx-debug diff {shown} {other}", "what changed between the two runs, beyond noise"),
        (bench, "each Thunder split" + (" and nvFuser region" if on_cuda else "") + " against inductor"
                + ("" if on_cuda else " (nvFuser regions need CUDA)")),
    ]
    width = max(len(command) for command, _ in commands)
    return "\n".join(["next, try:", *(f"  {command.ljust(width)}  # {what}" for command, what in commands)])


def _load(path: str, rank: int | None) -> dict[int, Report]:
    """The ranks of the dump at `path` (only `rank` if given)."""
    from thunderfx_debug.dump.files import load_report, load_reports

    if rank is not None:
        report = load_report(path, rank)
        return {report.rank: report}
    return load_reports(path)


def _cmd_summary(args: argparse.Namespace) -> int:
    from thunderfx_debug.records import layout
    from thunderfx_debug.render.summary import render_ranks

    print(render_ranks(_load(args.dir, args.rank)), end="")
    earlier = Path(args.dir) / layout.RUNS_DIR
    if earlier.is_dir() and any(earlier.iterdir()):
        print(f"\nearlier runs of this directory are in {earlier} (thunderfx-debug runs {args.dir})")
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from thunderfx_debug.dump.files import list_runs

    root = Path(args.dir)
    rows = [["run id", "started (UTC)", "last written (UTC)", "ranks", "flushes", "where"]]
    for run in list_runs(root):
        where = "." if run.path == root else os.path.relpath(run.path, root)
        rows.append([(run.run_id or "(no run id)") + (" (latest)" if run.latest else ""), run.started_at or "-",
                     run.written_at or "-", ",".join(map(str, run.ranks)),
                     "-" if run.flushes is None else str(run.flushes), where])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"runs of {root}, oldest first:")
    for row in rows:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _write(path: Path, text: str, what: str) -> None:
    try:
        # write_file_atomically replaces a link planted at `path`, never follows it
        from thunderfx_debug.dump.files import write_file_atomically

        write_file_atomically(path, text)
    except OSError as e:
        raise UsageError(f"cannot write the {what} to {path} ({e.strerror or e}); choose another path with -o") from None


def _relative_url(target: Path, page_dir: Path) -> str:
    """`target` as a relative URL seen from `page_dir` (both made absolute first)."""
    relative = os.path.relpath(target.resolve(), page_dir.resolve())
    return "/".join(quote(part) for part in Path(relative).parts)


def _cmd_html(args: argparse.Namespace) -> int:
    from thunderfx_debug.dump.files import rank_dirs
    from thunderfx_debug.render.html import render_html

    reports = _load(args.dir, args.rank)
    directories = rank_dirs(args.dir)
    root = Path(args.dir)
    out = Path(args.output) if args.output else root / "report.html"
    if out.exists() and out.is_dir():
        raise UsageError(f"{out} is a directory; -o takes the path of the HTML file to write")
    prefixes = {rank: _relative_url(directories[rank], out.parent) + "/" for rank in reports}
    title = f"ThunderFX report: {root.resolve().name}"
    _write(out, render_html(reports, prefixes, title=title), "HTML report")
    print(out)
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from thunderfx_debug.dump.files import load_report
    from thunderfx_debug.render.diff import diff_reports, render_diff

    if args.runs is not None:
        return _diff_runs(args)
    if args.dir_b is None:
        raise UsageError("diff takes two dump directories, or one with --runs (its consecutive runs)")
    a, b = load_report(args.dir_a, args.rank), load_report(args.dir_b, args.rank)
    print(render_diff(diff_reports(a, b), args.dir_a, args.dir_b, show_all=args.all), end="")
    return 0


def _diff_runs(args: argparse.Namespace) -> int:
    """Consecutive runs of one directory (all of them, or those named, in the order named), each against the one
    before it."""
    from thunderfx_debug.dump.files import list_runs, load_report
    from thunderfx_debug.render.diff import diff_reports, render_diff

    if args.dir_b is not None:
        raise UsageError("--runs compares the runs of one directory; give one DIR (and run ids after --runs)")
    runs = list_runs(args.dir_a)
    if args.runs:
        by_id = {run.run_id: run for run in runs}
        unknown = [run_id for run_id in args.runs if run_id not in by_id]
        if unknown:
            known = ", ".join(str(run.run_id) for run in runs)
            raise UsageError(f"{args.dir_a} has no run {', '.join(unknown)}; its runs: {known}")
        runs = [by_id[run_id] for run_id in args.runs]
    if len(runs) < 2:
        raise UsageError(f"{args.dir_a} holds {len(runs)} run; --runs needs two or more (thunderfx-debug runs DIR)")
    for i, (a, b) in enumerate(zip(runs, runs[1:])):
        label_a, label_b = (f"run {run.run_id or '(no run id)'} ({run.path})" for run in (a, b))
        text = render_diff(diff_reports(load_report(a.path, args.rank), load_report(b.path, args.rank)), label_a,
                           label_b, show_all=args.all)
        print(("\n" if i else "") + text, end="")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from thunderfx_debug.commands import bench
    from thunderfx_debug.dump.files import rank_dirs
    from thunderfx_debug.commands.bench_report import render_bench_report
    from thunderfx_debug.render import triage_findings

    deviation = _bench_deviation(args)  # a bad threshold is said before any script runs
    (report,) = _load(args.dir, args.rank if args.rank is not None else min(rank_dirs(args.dir))).values()
    rank_dir = Path(report.meta["dump_dir"])
    comparisons = bench.plan(report)
    if comparisons and args.match:
        comparisons = [c for c in comparisons if args.match in c.path]
        if not comparisons:
            raise UsageError(f"no compared piece of {rank_dir} matches {args.match!r}; pieces are named like "
                             f"{bench.plan(report)[0].path!r}")
    if not comparisons:
        raise UsageError(
            f"{rank_dir} has no pairs of repro scripts to compare (nvFusion regions with _repro_nvfuser.py and "
            "_repro_inductor.py, Thunder splits with _repro_thunder.py and _repro_inductor.py); record the run with "
            "THUNDERFX_DEBUG_REPRO=split,fusion on CUDA"
        )
    if args.results is not None:
        results_dir = Path(args.results)
        if not results_dir.is_dir():
            raise UsageError(f"--results {results_dir} is not a directory of earlier results")
        results = {s: bench.read_result(results_dir / bench.result_name(s), s) for s in bench.scripts_of(comparisons)}
    else:
        _check_can_run(args.allow_cpu)
        devices = _devices(args.gpus) if args.gpus else ()
        results_dir = Path(args.results_dir) if args.results_dir else rank_dir / "bench"
        try:
            results_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create {results_dir} ({e.strerror or e}); choose one with --results-dir") from None
        scripts = bench.scripts_of(comparisons)
        kept = {}
        if args.resume:  # an interrupted bench: keep what it measured, run the rest
            kept = {s: r for s in scripts if (r := bench.read_result(results_dir / bench.result_name(s), s)).error is None}
            scripts = [s for s in scripts if s not in kept]
            log.info("--resume: %s already measured in %s, %d to run", plural(len(kept), "script"), results_dir,
                     len(scripts))
        show = not args.no_progress
        if args.jobs > 1 and scripts:
            log.info("compiling %s, %d at a time, before timing them one at a time%s", plural(len(scripts), "script"),
                     args.jobs, f" on each of {len(devices)} GPUs" if len(devices) > 1 else "")
            with progress(len(scripts), "compiling (untimed)", unit="script", enabled=show, delay_s=0) as step:
                bench.warm_up(rank_dir, scripts, args.jobs, args.timeout, devices=devices, on_done=step)

        with progress(len(scripts), "timing", unit="script", enabled=show, delay_s=0, every_s=0) as step:

            def run_one(script: str, device: str | None) -> bench.ScriptResult:
                result = bench.run_script(rank_dir, script, results_dir, args.timeout, device=device)
                step(Path(script).name + (f" on GPU {device}" if device else "")
                     + (f": {result.error}" if result.error else ""))
                return result

            def done(script: str, result: bench.ScriptResult) -> None:
                step(Path(script).name + (f": {result.error}" if result.error else ""))

            if args.process_per_script:
                results = {**kept, **bench.run_all(scripts, run_one, devices)}
            else:
                from thunderfx_debug.commands.bench_worker import run_per_device

                results = {**kept, **run_per_device(rank_dir, scripts, results_dir, args.timeout, devices, done)}
    ranked = bench.rank(comparisons, results, deviation)
    out = Path(args.output) if args.output else rank_dir / BENCH_REPORT
    # Scripts as the user who ran bench types them: relative to the current directory where the dump lies below
    # it, else absolute (the same text goes to the terminal and into the report).
    prefix = _typed_path(rank_dir) + "/"
    triaged = {p.path: p.triage for p in triage_findings.triaged_pieces(report)}
    text = render_bench_report(ranked, deviation, title=str(rank_dir), script_prefix=prefix,
                               outside_in_run=bench.outside_in_run(report), triaged=triaged)
    _write(out, text, "bench report")
    print(text, end="")
    log.info("bench report written to %s", out)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    import importlib.util

    from thunderfx_debug.commands import verify
    from thunderfx_debug.dump.files import load_report, rank_dirs, write_file_atomically

    root = Path(args.dir)
    ranks = rank_dirs(root)
    if args.rank is not None:
        if args.rank not in ranks:
            raise UsageError(f"{root} has no rank {args.rank}; it has ranks {sorted(ranks)}")
        ranks = {args.rank: ranks[args.rank]}
    reports = {directory: load_report(directory) for directory in ranks.values()}
    listed = verify.scripts_of(reports, root)
    if not listed:
        raise UsageError(f"{root} holds no repro scripts; record the run with THUNDERFX_DEBUG_REPRO=all (or "
                         "split, fusion, graph)")
    scripts = verify.select(listed, args.only or ())
    if not scripts:
        raise UsageError(f"no script of {root} matches {' or '.join(args.only)}; scripts are named like "
                         f"{listed[0].path!r} (pieces like {listed[0].piece!r})")
    damaged = [s.problem for s in scripts if s.problem]
    if damaged:
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise DumpError(f"{damaged[0]}{more}: the dump is damaged and nothing was run; write the dump again, or "
                        "leave those scripts out with --only")
    if importlib.util.find_spec("torch") is None:
        raise UsageError("the scripts need torch, which is not installed here (pip install torch)")
    devices: tuple[str, ...] = ()
    on_cuda = [s for s in scripts if s.cuda]
    if on_cuda or args.gpus:
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"{plural(len(on_cuda), 'script')} of {len(scripts)} run on CUDA (nvFuser, or inputs on "
                             "a CUDA device) and this machine has no CUDA device; verify them on the GPU machine, or "
                             "pick the others with --only" if on_cuda else
                             "--gpus: this machine has no CUDA device; leave --gpus out to run on the CPU")
        devices = _devices(args.gpus) if args.gpus else _devices(tuple(range(torch.cuda.device_count())))
    workers = args.jobs or max(1, len(devices))
    try:
        (root / verify.VERIFY_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write into {root} ({e.strerror or e}); verify writes verify.json, verify.md and "
                         "the scripts' logs there: copy the dump somewhere writable") from None
    where = (f"{plural(workers, 'worker')} on GPU{'s' if len(devices) > 1 else ''} {','.join(devices)}" if devices
             else f"{plural(workers, 'worker')} on the CPU")
    log.info("verifying %s of %s in %s", plural(len(scripts), "script"), root, where)
    started = time.perf_counter()
    with progress(len(scripts), "verifying", unit="script", enabled=not args.no_progress, delay_s=0) as step:
        verdicts = verify.run(scripts, root, workers, devices, args.timeout,
                              on_done=lambda v: step(f"{Path(v.script.path).name}: {verify.shown(v.outcome)}"))
    meta = {"dir": str(root), "where": where, "workers": workers, "devices": list(devices),
            "timeout_s": args.timeout, "only": list(args.only or ()), "seconds": round(time.perf_counter() - started, 1)}
    text = verify.verify_md(verdicts, root, meta)
    try:
        write_file_atomically(root / verify.VERIFY_JSON, verify.verify_json(verdicts, meta))
        write_file_atomically(root / verify.VERIFY_MD, text)
    except OSError as e:
        raise UsageError(f"cannot write the verify report into {root} ({e.strerror or e})") from None
    print(text, end="")
    log.info("written: %s, %s", root / verify.VERIFY_JSON, root / verify.VERIFY_MD)
    return 0 if verify.clean(verdicts) else 1


def _cmd_minimize(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{args.script}: no such file; give a repro or mismatch script of a dump "
                         "(<piece>_repro_<backend>.py)")
    out = Path(args.out) if args.out else None
    if out is not None and (out.suffix != ".py" or not out.parent.is_dir()):
        raise UsageError(f"--out {args.out}: give the path of a .py file in a folder that exists")
    from thunderfx_debug.minimize.offline import NotAScript, minimize_script
    from thunderfx_debug.minimize.piece import NotMinimized

    try:
        reduction = minimize_script(script, args.budget, out)
    except NotAScript as e:
        raise UsageError(f"{script.name} is not a script it can minimize: {e}") from None
    except NotMinimized as e:
        raise UsageError(f"{script.name}: nothing minimized: {e}") from None
    budget = f" (stopped by the budget of {args.budget:g} s)" if reduction.budget_spent else ""
    print(f"minimized {reduction.key}: {reduction.ops_before} ops -> {reduction.ops_after} ops (inputs "
          f"{reduction.inputs_before} -> "
          f"{reduction.inputs_after}, outputs {reduction.outputs_before} -> {reduction.outputs_after}), "
          f"{reduction.trials} trials, {reduction.seconds:g} s{budget}")
    print("  kept: " + "; ".join(reduction.kept))
    print(f"  the full piece:     {reduction.verdict}")
    print(f"  the minimal script: {reduction.final}")
    if reduction.note:
        print(f"  note: {reduction.note}")
    print(f"  wrote {reduction.script} (inputs: {reduction.inputs_file.name})")
    return 0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds > 0")
    return value


def _check_can_run(allow_cpu: bool) -> None:
    """bench runs CUDA scripts: say so up front instead of failing every script."""
    import importlib.util

    if importlib.util.find_spec("thunder") is None:
        raise UsageError("bench runs the dump's Thunder scripts, but thunder is not installed here "
                         "(pip install lightning-thunder), or pass --results DIR to triage results measured elsewhere")
    import torch

    if not torch.cuda.is_available() and not allow_cpu:
        raise UsageError("bench compares nvFuser and inductor on a CUDA device and none is visible here; run it on a "
                         "GPU machine, pass --results DIR to triage results measured elsewhere, or --allow-cpu")


def _gpu_list(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"expected distinct GPU indices separated by commas, like 0,1; got {text!r}")
    return tuple(int(part) for part in parts)


def _devices(indices: tuple[int, ...]) -> tuple[str, ...]:
    """The CUDA_VISIBLE_DEVICES entry of each GPU index as this process sees them; an absent GPU is an error."""
    import torch

    count = torch.cuda.device_count()
    absent = [str(i) for i in indices if i >= count]
    if absent:
        sees = f"{count} (indices 0 to {count - 1})" if count else "none"
        raise UsageError(f"--gpus: no GPU {', '.join(absent)} here; this process sees {sees}")
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    return tuple(visible[i] if visible else str(i) for i in indices)


def _bench_deviation(args: argparse.Namespace) -> float:
    """The ratio beyond which bench lists a piece: --deviation, --tolerance F as 1 + F, else
    THUNDERFX_DEBUG_DEVIATION, else its default: the flush-time triage's threshold, so that both judge alike."""
    if args.deviation is not None:
        return args.deviation
    if args.tolerance is not None:
        return 1 + args.tolerance
    from thunderfx_debug.settings.config import setting

    try:
        return setting("deviation")
    except ConfigError as e:
        raise UsageError(f"{e}; or give --deviation") from None


def _deviation(text: str) -> float:
    """A time ratio > 1: "1.2"."""
    from thunderfx_debug.settings.config import ratio_above_one

    try:
        return ratio_above_one(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def _fraction(text: str) -> float:
    """A tolerance as a fraction: "0.1", "10%"."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction such as 0.1 or 10%") from None
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 10 (1000%)")
    return value


def _whole_number(minimum: int, what: str = "a whole number"):
    """An argparse type: `what` (a whole number by default) of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} of at least {minimum}")
        return value

    return parse


_positive_int = _whole_number(1)
_rank = _whole_number(0, "a rank (a whole number)")


def build_parser() -> argparse.ArgumentParser:
    from thunderfx_debug import __version__

    parser = OneLineParser(
        prog="thunderfx-debug",
        description="Reports of ThunderFX training runs recorded by thunderfx_debug.ReportingBackend.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)

    demo = commands.add_parser("demo", help="train a small GPT-style model under ReportingBackend and print the summary")
    demo.add_argument("--steps", type=_positive_int, default=30, help="training steps (default: 30)")
    demo.add_argument("--dir", default=None,
                      help="dump directory (default: $THUNDERFX_DEBUG_DIR if set, else ./thunderfx_debug_demo); "
                           "given here, it wins over THUNDERFX_DEBUG_DIR")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available, else cpu")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    demo.set_defaults(run=_cmd_demo)

    summary = commands.add_parser(
        "summary", help="print the run at a glance: graphs, recompiles, splits and reasons, fusions, top regions",
        description="Graphs and compile ids, recompiles, split reasons grouped by type and op, fusions per split and, "
                    "where timed, the regions that cost most with their share of the step. For a multi-rank dump, "
                    "the ranks side by side with stragglers and ranks that split differently flagged.")
    summary.add_argument("dir", help=DIR_HELP)
    summary.add_argument("--rank", type=_rank, help="only this rank of a multi-rank dump")
    summary.set_defaults(run=_cmd_summary)

    page = commands.add_parser(
        "html", help="write one self-contained HTML page: charts, traces, links to the repro scripts",
        description="Writes a single HTML file (no network, no scripts) with charts of the time per graph, split and "
                    "fusion, the split reasons, a timeline of the samples, the traces and relative links to the "
                    "repro scripts. Multi-rank dumps get the ranks side by side.")
    page.add_argument("dir", help=DIR_HELP)
    page.add_argument("-o", "--output", help="the HTML file to write (default: DIR/report.html)")
    page.add_argument("--rank", type=_rank, help="only this rank of a multi-rank dump")
    page.set_defaults(run=_cmd_html)

    diff = commands.add_parser(
        "diff", help="what changed between two runs: graphs, splits, reasons, fusions, timing beyond noise",
        description="Compares run B with run A: graphs, splits and split reasons, fusion regions (ops gained and lost) "
                    "and timing, as the ratio B/A, flagged when beyond noise: Yuen's trimmed test on log times "
                    "against changes of up to 10%, Holm's correction over all pieces, relative to the run-wide "
                    "shift; pieces with too few samples or too much noise to judge are said to be so.")
    diff.add_argument("dir_a", help="run A: " + DIR_HELP)
    diff.add_argument("dir_b", nargs="?", help="run B: " + DIR_HELP + " (absent with --runs)")
    diff.add_argument("--rank", type=_rank, help="the rank to compare (default: the lowest of each dump)")
    diff.add_argument("--all", action="store_true", help="list every timed piece, not only changes beyond noise")
    diff.add_argument("--runs", nargs="*", metavar="RUN_ID",
                      help="compare the runs of DIR (a job restarted into the same THUNDERFX_DEBUG_DIR), each against "
                           "the one before it: all of them oldest first, or the runs named, in that order")
    diff.set_defaults(run=_cmd_diff)

    runs = commands.add_parser(
        "runs", help="list the runs of a dump directory: the latest (at rank<R>/) and the earlier ones (runs/<id>/)",
        description="A job restarted into the same THUNDERFX_DEBUG_DIR keeps every run: the latest at rank<R>/, "
                    "earlier ones under runs/<run id>/rank<R>/. Lists them oldest first with their ranks, start, "
                    "last flush and number of flushes; `diff DIR --runs` compares consecutive ones.")
    runs.add_argument("dir", help="a THUNDERFX_DEBUG_DIR")
    runs.set_defaults(run=_cmd_runs)

    bench = commands.add_parser(
        "bench", help="run the dump's scripts: nvFuser vs inductor per region, Thunder vs inductor per split (CUDA)",
        description="Runs the dump's fusion scripts (_repro_nvfuser.py against _repro_inductor.py) and Thunder split "
                    "scripts (_repro_thunder.py against _repro_inductor.py) with --benchmark --json, ranks the pieces "
                    "by the time ThunderFX loses per step, and writes a markdown triage report listing the pieces "
                    "whose time deviates (the flush-time triage's rule) with their repro scripts. Needs CUDA, "
                    "thunder and nvFuser.")
    bench.add_argument("dir", help=DIR_HELP)
    bench.add_argument("--rank", type=_rank, help="the rank whose scripts to run (default: the lowest)")
    threshold = bench.add_mutually_exclusive_group()
    threshold.add_argument("--deviation", type=_deviation, default=None,
                       help="list the pieces whose ThunderFX/inductor time ratio lies beyond this either way, as the "
                            "flush-time triage judges (default: THUNDERFX_DEBUG_DEVIATION, else 1.2)")
    threshold.add_argument("--tolerance", type=_fraction, default=None,
                       help="the same as --deviation 1+TOLERANCE (a fraction: 0.1 or 10%%)")
    bench.add_argument("-o", "--output",
                       help="the report to write (default: <rank dir>/bench.md; the flush-time triage writes triage.md)")
    bench.add_argument("--results-dir", help="where the scripts write their JSON results (default: <rank dir>/bench)")
    bench.add_argument("--results", metavar="DIR",
                       help="run nothing: triage the JSON results an earlier bench wrote into DIR")
    bench.add_argument("--match", metavar="TEXT",
                       help="only the pieces whose name contains TEXT (e.g. graph0/thunder_0, nvFusion3)")
    bench.add_argument("--timeout", type=_positive_int, default=600, help="seconds per script (default: 600)")
    bench.add_argument("--process-per-script", action="store_true",
                       help="run each script in a process of its own (default: all of them in one process per GPU, "
                            "a script that crashes that process alone in its own)")
    bench.add_argument("--jobs", type=_positive_int, default=1,
                       help="first run every script once without timing, N at a time, so that the timed runs (one "
                            "at a time) find inductor's and Triton's compiled code in their on-disk caches "
                            "(default: 1, no such pass)")
    bench.add_argument("--resume", action="store_true",
                       help="keep the results an earlier, interrupted bench of this dump left in the results "
                            "directory and run only the scripts without one")
    bench.add_argument("--gpus", metavar="LIST", type=_gpu_list,
                       help="time on these GPUs at once, one script per GPU at a time (e.g. 0,1; indices as this "
                            "process sees them; default: one script at a time on the default device)")
    bench.add_argument("--allow-cpu", action="store_true",
                       help="run without a CUDA device (CPU scripts only; nvFuser scripts then fail)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    bench.set_defaults(run=_cmd_bench)

    check = commands.add_parser(
        "verify", help="run every repro script of the dump, as its users would, and say what each found",
        description="Runs the repro scripts the dump's records list (nothing else of the dump), each as `python "
                    "script.py` would, in long-lived worker processes that import torch and Thunder once (one per "
                    "GPU, or --jobs of them); a script that takes its worker down runs again alone. Writes "
                    "verify.json (every script's verdict) and verify.md (counts per kind and verdict, the failures "
                    "first with the command to rerun each) into DIR. Exit status 0 when every script is OK or NOT "
                    "COMPARABLE, 1 otherwise, 2 for a bad argument or a missing or damaged dump.")
    check.add_argument("dir", help=DIR_HELP)
    check.add_argument("--only", action="append", metavar="GLOB",
                       help="only the scripts whose path (relative to DIR) or piece matches GLOB (fnmatch: * matches "
                            "across folders, e.g. '*nvfuser*', 'graph0/thunder_2/*'); may be given several times")
    check.add_argument("--jobs", type=_positive_int, default=None,
                       help="worker processes (default: one per GPU, one on CPU); with several GPUs they take the "
                            "GPUs in turn")
    check.add_argument("--gpus", metavar="LIST", type=_gpu_list,
                       help="run on these GPUs (e.g. 0,1; indices as this process sees them; default: every GPU "
                            "where the scripts need CUDA)")
    check.add_argument("--timeout", type=_positive_seconds, default=600,
                       help="seconds a script may take before it is killed (default: 600)")
    check.add_argument("--rank", type=_rank, help="only this rank of a multi-rank dump (default: every rank)")
    check.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    check.set_defaults(run=_cmd_verify)

    minimize = commands.add_parser(
        "minimize", help="shrink a MISMATCH or CRASH repro script to the fewest ops that still fail the same way",
        description="Runs the script (twice: a failure that changes between identical runs is random and is not "
                    "shrunk), then delta-debugs its piece: each cut drops ops, turns the values they computed in "
                    "the full piece into inputs, and is run as a script in a child process; a cut is kept only if "
                    "it fails the same way (a MISMATCH of the same kind of value, a CRASH with the same exception). "
                    "Writes <piece>_minimal_repro_<backend>.py with its inputs next to the script: the same check "
                    "and verdict line, a header saying what was cut. Needs thunder (and CUDA, nvFuser for an "
                    "nvFuser region); refuses a script whose verdict is OK, NOT COMPARABLE or REFUSED.")
    minimize.add_argument("script", help="a repro or mismatch script of a split or fusion region from a dump")
    minimize.add_argument("--budget", type=_positive_seconds, default=120.0, metavar="S",
                          help="seconds of shrinking (default: 120, as THUNDERFX_DEBUG_MINIMIZE_BUDGET); the smallest "
                               "failing piece found by then is written")
    minimize.add_argument("--out", metavar="PATH",
                          help="the minimal script to write (default: <piece>_minimal_repro_<backend>.py next to "
                               "SCRIPT); its inputs go next to it")
    minimize.set_defaults(run=_cmd_minimize)
    return parser


@contextlib.contextmanager
def _messages_to_stderr() -> Iterator[None]:
    """The package's log records (warnings, progress lines) as plain lines on stderr while a command runs; taken
    away after, so that a program calling `main` keeps its own logging."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _messages_to_stderr():
        try:
            return args.run(args)
        except (UsageError, DumpError, ConfigError) as e:
            print(f"thunderfx-debug {args.command}: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"thunderfx-debug {args.command}: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
