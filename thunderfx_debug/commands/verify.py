"""`thunderfx-debug verify DIR`: every repro script of a dump run as its user would (`python script.py`), in
long-lived workers (`children.pool`), and what each said.

The scripts are those the dump's records list (graph.json `files`: `repro_eager`, `repro_thunder`,
`repro_mismatch_nvfuser`, ...), each checked to lie inside the dump, not behind a link; nothing else of the dump is
executed (its JSON is read as data, its traces are not run). Each script's verdict comes from its own last line
(`RESULT OK (exit 0)...`, see `artifacts.repro.script_template`) and its exit status.

Files written into DIR (the directory given):
    verify.json        one entry per script: path, piece, kind, verdict, its RESULT line, exit status, seconds, how
                       it ran (in a worker, alone after taking its worker down, killed at the timeout, not run
                       or cut at the deadline), log
    verify.md          counts per kind and verdict, the failures first, each with the command that reruns it
    verify/logs/...    what each script printed
    verify/cache/...   inductor's and Triton's on-disk caches for the scripts (unless TORCHINDUCTOR_CACHE_DIR and
                       TRITON_CACHE_DIR are set), shared by the workers and kept for the next verify of the dump

A dump is clean when every script is OK or NOT COMPARABLE (a random piece whose draws differ from eager's). A script
of a piece that failed in the run says REPRODUCED where it raised the run's exception on its own (never clean: the
dump holds a failure, and that script is its bug report; verify.md says so first) and NOT REPRODUCED where it did
not.
Verdicts are written for the reader as the scripts print them ("NOT COMPARABLE", `shown`); verify.json keeps their
tokens ("NOT_COMPARABLE"), as `scripts/result_line.outcome_of` reads them, for programs.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from thunderfx_debug.children.protocol import how_it_ended
from thunderfx_debug.records import InputMeta, RankRecord, layout
from thunderfx_debug.records.keys import PieceKey

VERIFY_JSON = "verify.json"
VERIFY_MD = "verify.md"
VERIFY_DIR = "verify"
CLEAN = frozenset({"OK", "NOT_COMPARABLE"})
#: Verdicts in the order verify.md lists them (failures first).
OUTCOMES = ("REPRODUCED", "MISMATCH", "CRASH", "REFUSED", "NOT_REPRODUCED", "NOT_REBUILT", "KILLED", "TIMEOUT",
            "NO_RESULT", "NOT_RUN", "NOT_COMPARABLE", "OK")


@dataclasses.dataclass(frozen=True)
class Script:
    """A repro script of a dump: `path` relative to the directory verify was given, `file` absolute, the `piece`
    it reproduces ("graph0/thunder_0/nvFusion0_forward"), its `kind` (level and way of running: "fusion_nvfuser",
    "split_mismatch_thunder"), whether it needs CUDA (its piece's inputs are on a CUDA device, or nvFuser), and
    why it cannot be run, if so."""

    path: str
    file: Path
    piece: str
    kind: str
    cuda: bool
    problem: str = ""  # why it cannot be run: it leaves the dump or is missing (a damaged dump)


@dataclasses.dataclass(frozen=True)
class ScriptOutcome:
    """What one script said: its outcome (OK, MISMATCH, REFUSED, CRASH, NOT_COMPARABLE, NOT_REBUILT; KILLED by a
    signal, TIMEOUT, NO_RESULT: it ended without a RESULT line), the line, its exit status, wall seconds, how it
    ran."""

    script: Script
    outcome: str
    line: str
    exit_status: int | None
    seconds: float
    how: str
    note: str = ""
    log: str = ""

    def to_json(self) -> dict:
        return {"path": self.script.path, "piece": self.script.piece, "kind": self.script.kind,
                "verdict": self.outcome, "line": self.line, "exit_status": self.exit_status,
                "seconds": round(self.seconds, 2), "ran": self.how, "note": self.note, "log": self.log}


# ---- which scripts --------------------------------------------------------------------------------------------------


def _on_cuda(metas: Iterable[InputMeta]) -> bool:
    return any(m.device.startswith("cuda") for m in metas)


def _listed(report: RankRecord) -> Iterable[tuple[str, str, str, str, bool]]:
    """(relative path, label, level, piece, on CUDA) of every repro script the records of one rank list."""
    for graph in report.graphs:
        for label, path in graph.files.items():
            yield path, label, "graph", graph.name, _on_cuda(graph.input_meta)
        for split in graph.splits:
            piece = PieceKey.of(graph.name, split.name)
            for label, path in split.files.items():
                yield path, label, "split", piece, _on_cuda(split.input_meta)
            for fusion in split.fusions:
                for label, path in fusion.files.items():
                    yield path, label, "fusion", piece.region(fusion.qualified_name), _on_cuda(
                        fusion.input_meta)


def scripts_of(reports: Mapping[Path, RankRecord], root: Path) -> list[Script]:
    """The repro scripts the records list, rank by rank (`reports`: rank directory -> its records), with paths
    relative to `root`; a script that leaves the dump (a link, '..') or is missing has its `problem` said."""
    from thunderfx_debug.dump.files import inside_dump

    scripts = []
    for rank_dir, report in reports.items():
        for path, label, level, piece, on_cuda in _listed(report):
            if not label.startswith("repro_"):
                continue
            kind = f"{level}_{label.removeprefix('repro_')}"
            graph_json = rank_dir / layout.graph_dir(piece.split("/")[0]) / layout.GRAPH_JSON
            problem, file = "", rank_dir / path
            try:
                file = inside_dump(rank_dir, path)
            except ValueError as e:
                problem = f"{graph_json} lists {path!r}: {e}"
            else:
                if file.is_symlink() or not file.is_file() or file.suffix != ".py":
                    why = "a link" if file.is_symlink() else "not a script" if file.exists() else "missing"
                    problem = f"{graph_json} lists the script {path}, which is {why}"
            shown = os.path.relpath(file, root) if not problem else f"{os.path.relpath(rank_dir, root)}/{path}"
            scripts.append(Script(os.path.normpath(shown), file, piece, kind, on_cuda or kind.endswith("nvfuser"),
                                  problem))
    return sorted(scripts, key=lambda s: s.path)


def select(scripts: Sequence[Script], patterns: Sequence[str]) -> list[Script]:
    """The scripts whose path (relative to the directory given) or piece matches one of the glob `patterns`
    (fnmatch: `*` matches across folders); all of them without patterns."""
    if not patterns:
        return list(scripts)
    return [s for s in scripts if any(fnmatch.fnmatchcase(s.path, p) or fnmatch.fnmatchcase(s.piece, p)
                                      for p in patterns)]


# ---- running --------------------------------------------------------------------------------------------------------


def script_env(root: Path, workers: int, on_gpus: bool, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the scripts: ours without THUNDERFX_DEBUG_* (a script must not depend on the reporting's
    settings), inductor's and Triton's caches under the dump unless set, one inductor compile thread per worker on
    CPU (the cores are shared by the workers) and the intra-op threads split among the workers."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("THUNDERFX_DEBUG_")}
    cache = Path(root).absolute() / VERIFY_DIR / "cache"  # absolute: each script runs in its own folder
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    cores = os.cpu_count() or 1
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, cores // workers) if on_gpus else 1))
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
    return env


def slots(workers: int, devices: Sequence[str], env: Mapping[str, str]) -> list[dict[str, str]]:
    """One environment per worker: the GPUs (CUDA_VISIBLE_DEVICES entries) dealt out in turn."""
    return [{**env, "CUDA_VISIBLE_DEVICES": devices[i % len(devices)]} if devices else dict(env)
            for i in range(workers)]


def _log_path(root: Path, script: Script) -> Path:
    return root / VERIFY_DIR / "logs" / (script.path.replace(os.sep, "__").removesuffix(".py") + ".log")


def verdict_of(script: Script, status: int | None, output: str, seconds: float, how: str, note: str,
               log: str) -> ScriptOutcome:
    """A script's verdict from its exit status and what it printed (its last RESULT line)."""
    from thunderfx_debug.scripts.result_line import last_result, outcome_of

    found = last_result(output)
    # Cut at the deadline: the script ran out of the time this verify had, not of its own limit; not judged.
    outcome = {"timeout": "TIMEOUT", "not_run": "NOT_RUN", "cut": "NOT_RUN"}.get(how) or outcome_of(status, output)
    return ScriptOutcome(script, outcome, found.line if found is not None else "", status, seconds, how, note, log)


def run(scripts: Sequence[Script], root: Path, workers: int, devices: Sequence[str], timeout_s: float,
        on_done: Callable[[ScriptOutcome], None] | None = None, deadline: float | None = None,
        env: Mapping[str, str] | None = None) -> list[ScriptOutcome]:
    """Runs `scripts` in `workers` long-lived workers (on `devices` in turn, or on CPU) and returns their verdicts;
    logs and caches go under `root` (see the module docstring). Past `deadline` (time.monotonic()) no script starts,
    and one running is cut there (both NOT_RUN, the note says which: for lent machines with a time limit). `env`:
    the environment to start from (default: ours)."""
    from thunderfx_debug.children.standalone import run_script
    from thunderfx_debug.children.pool import Finished, Job, run_jobs

    env = script_env(root, workers, bool(devices), env)
    by_file = {s.file: s for s in scripts}
    jobs = []
    for script in scripts:
        log = _log_path(root, script)
        log.parent.mkdir(parents=True, exist_ok=True)
        jobs.append(Job(script.file, (), log))

    def alone(job: Job, job_env: Mapping[str, str], _worker_end: Finished) -> Finished:
        started = time.perf_counter()
        done = run_script(job.script, timeout_s=timeout_s, env=dict(job_env))
        job.log.write_text(done.stdout + done.stderr)
        return Finished(job, done.returncode, time.perf_counter() - started, "alone",
                        "" if done.returncode is not None else f"killed after {timeout_s:g} s")

    def verdict(finished: Finished) -> ScriptOutcome:
        script = by_file[finished.job.script]
        try:
            output = finished.job.log.read_text(errors="replace")
        except OSError:
            output = ""
        how = "timeout" if finished.status is None and finished.how not in ("not_run", "cut") else finished.how
        return verdict_of(script, finished.status, output, finished.seconds, how, finished.note,
                          os.path.relpath(finished.job.log, root))

    def done(finished: Finished) -> None:
        if on_done is not None:
            on_done(verdict(finished))

    results = run_jobs(jobs, slots(workers, devices, env), timeout_s, alone, done,
                       worker_log=root / VERIFY_DIR / "workers.log", deadline=deadline)
    return [verdict(f) for f in results]


# ---- what it says ---------------------------------------------------------------------------------------------------


def shown(outcome: str) -> str:
    """A verdict in the words a reader sees everywhere (progress lines, verify.md, the scripts' own RESULT lines):
    "NOT_COMPARABLE" -> "NOT COMPARABLE"."""
    return outcome.replace("_", " ")


#: verify.md names the scripts that keep a dump from being clean in its first lines when there are at most this many.
NAMED_FAILURES = 3


def clean_sentence(failures: Sequence[ScriptOutcome]) -> str:
    """verify.md's verdict on the dump: "A dump is clean when every script is OK or NOT COMPARABLE: 1 is not
    (MISMATCH: rank0/graph0/..._repro_thunder.py)."; beyond NAMED_FAILURES scripts, counts by verdict."""
    rule = "A dump is clean when every script is OK or NOT COMPARABLE: "
    if not failures:
        return rule + "this one is."
    verb = "is" if len(failures) == 1 else "are"
    if len(failures) <= NAMED_FAILURES:
        which = "; ".join(f"{shown(v.outcome)}: {v.script.path}" for v in failures)
    else:
        by_outcome = Counter(v.outcome for v in failures)
        which = ", ".join(f"{by_outcome[o]} {shown(o)}" for o in OUTCOMES if by_outcome[o])
        which += ", listed under Failures"
    return rule + f"{len(failures)} {verb} not ({which})."


def clean(verdicts: Iterable[ScriptOutcome]) -> bool:
    return all(v.outcome in CLEAN for v in verdicts)


def counts(verdicts: Iterable[ScriptOutcome]) -> dict[str, dict[str, int]]:
    """kind -> verdict -> scripts."""
    table: dict[str, Counter] = {}
    for v in verdicts:
        table.setdefault(v.script.kind, Counter())[v.outcome] += 1
    return {kind: dict(sorted(c.items(), key=lambda item: OUTCOMES.index(item[0]) if item[0] in OUTCOMES else 99))
            for kind, c in sorted(table.items())}


def reproduced(verdicts: Iterable[ScriptOutcome]) -> list[str]:
    """The scripts that reproduced the run's failure on their own (REPRODUCED), by path."""
    return sorted(v.script.path for v in verdicts if v.outcome == "REPRODUCED")


def verify_json(verdicts: Sequence[ScriptOutcome], meta: Mapping) -> str:
    return json.dumps({**meta, "clean": clean(verdicts), "counts": counts(verdicts),
                       "reproduced": reproduced(verdicts), "scripts": [v.to_json() for v in verdicts]},
                      indent=1) + "\n"


def rerun_command(script: Script) -> str:
    """The command that runs the script again, from the directory verify was run in."""
    try:
        shown = os.path.relpath(script.file)
    except ValueError:
        shown = str(script.file)
    return f"python {shlex.quote(str(script.file) if shown.startswith('..') else shown)}"


def verify_md(verdicts: Sequence[ScriptOutcome], root: Path, meta: Mapping) -> str:
    """The failures first, each with its RESULT line (or why there is none) and the command that reruns it, then the
    counts per kind and verdict."""
    total = Counter(v.outcome for v in verdicts)
    failures = sorted((v for v in verdicts if v.outcome not in CLEAN),
                      key=lambda v: (OUTCOMES.index(v.outcome) if v.outcome in OUTCOMES else 99, v.script.path))
    summary = ", ".join(f"{total[o]} {shown(o)}" for o in OUTCOMES if total[o])
    lines = [f"# verify: {root}", "",
             f"{len(verdicts)} scripts in {meta.get('seconds', 0):.0f} s ({meta.get('where', '')}): {summary}.",
             clean_sentence(failures)]
    found = reproduced(verdicts)
    if found:
        lines.append(f"The run's failure is reproduced on its own by {', '.join(found[:NAMED_FAILURES])}"
                     + (f" and {len(found) - NAMED_FAILURES} more" if len(found) > NAMED_FAILURES else "")
                     + " (REPRODUCED): such a script is the bug report to file.")
    lines.append("")
    if failures:
        lines += ["## Failures", ""]
        for v in failures:
            said = v.line or f"no RESULT line (the script {how_it_ended(v.exit_status)}; see {v.log})"
            note = f" ({v.note})" if v.note else ""
            lines += [f"- **{shown(v.outcome)}** `{v.script.path}` ({v.script.kind}, {v.script.piece}){note}",
                      f"  {said}", f"  rerun: `{rerun_command(v.script)}`; log: `{v.log}`"]
        lines.append("")
    table = counts(verdicts)
    columns = [o for o in OUTCOMES if any(o in row for row in table.values())]
    lines += ["## Counts", "", "| kind | " + " | ".join(shown(c) for c in columns) + " | scripts |",
              "| --- |" + " ---: |" * (len(columns) + 1)]
    for kind, row in table.items():
        lines.append(f"| {kind} | " + " | ".join(str(row.get(c, "")) for c in columns) + f" | {sum(row.values())} |")
    return "\n".join(lines) + "\n"
