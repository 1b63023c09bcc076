"""`thunderfx-debug bench`: where does ThunderFX lose time against inductor, region by region?

Runs the repro scripts of a dump in pairs, each in its own process, with `--benchmark --json PATH` (the contract of
the repro scripts: they write {"script", "piece", "executor", "outcome", "forward_ms", "backward_ms", ...}):
    fusion regions:  ..._nvFusionN_<phase>_repro_nvfuser.py  against  ..._nvFusionN_<phase>_repro_inductor.py
    thunder splits:  ..._thunder_N_repro_thunder.py          against  ..._thunder_N_repro_inductor.py
then ranks the pieces by the time ThunderFX loses (or gains) per training step there: (ours - inductor) x calls
per step, the calls per step coming from the records (see `render.digest`). `bench_report` writes the report.

Planning and ranking are pure and run anywhere (tests use fixture results); running needs the scripts' own
requirements (CUDA, thunder, nvFuser), checked by the command, not imported here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from thunderfx_debug.children import standalone
from thunderfx_debug.children.protocol import how_it_ended
from thunderfx_debug.records import DEVIATION, RankRecord, SplitKind, deviation_outcome, layout
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import digest


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A piece of the run and its two scripts: `ours` (nvFuser or Thunder) and `theirs` (inductor).

    `level` is a split or a fusion region; `path` names the piece ("graph0/thunder_0/nvFusion0 forward"); script paths
    are relative to the rank directory; `calls_per_step` weighs the piece by how often the run called it.
    """

    level: digest.PieceLevel  # SPLIT or FUSION
    path: str
    ours_executor: str
    ours_script: str
    theirs_script: str
    calls_per_step: float = 1.0
    split: str = ""  # "graph0/thunder_0": the split the piece belongs to (itself for splits)

    def __post_init__(self):
        object.__setattr__(self, "level", digest.PieceLevel(self.level))  # "split" given as text is the same level


@dataclasses.dataclass(frozen=True)
class ScriptResult:
    """What one script measured (ms per call; backward None where the piece has none), or why it measured nothing
    (`error`). `note` is set when the script measured but exited non-zero, e.g. its self-check against eager
    found a mismatch: the time is still worth comparing, and the mismatch is a finding of its own.
    `*_ms` are wall clock; `*_device_ms` the GPU's time for the piece's kernels (CUDA scripts only)."""

    script: str
    forward_ms: float | None = None
    backward_ms: float | None = None
    error: str | None = None
    note: str | None = None
    forward_device_ms: float | None = None
    backward_device_ms: float | None = None


def _script(files: Mapping[str, str], kind: str) -> str | None:
    """The script of `kind` (nvfuser, inductor, thunder) among a record's files, by label or by file name."""
    for label, path in files.items():
        if label == f"repro_{kind}" or path.endswith(f"_repro_{kind}.py"):
            return path
    return None


def plan(report: RankRecord) -> list[Comparison]:
    """The pairs of scripts to run for `report`: every nvFusion region and every Thunder split that has both."""
    steps = digest.steps(report)
    comparisons = []
    for graph in report.graphs:
        per_step = steps.per_step(graph)
        for split in graph.splits:
            if split.kind is not SplitKind.THUNDER:
                continue
            where = PieceKey.of(graph.name, split.name)
            thunder, inductor = _script(split.files, "thunder"), _script(split.files, "inductor")
            if thunder and inductor:
                comparisons.append(Comparison(digest.PieceLevel.SPLIT, where, "thunder", thunder, inductor, per_step, where))
            for fusion in split.fusions:
                nvfuser, inductor = _script(fusion.files, "nvfuser"), _script(fusion.files, "inductor")
                if nvfuser and inductor:
                    comparisons.append(Comparison(digest.PieceLevel.FUSION, f"{where}/{fusion.name} {fusion.phase.value}", "nvfuser",
                                                  nvfuser, inductor, per_step, where))
    return comparisons


def outside_in_run(report: RankRecord) -> dict[str, float]:
    """Per split ("graph0/thunder_0"): the training run's own time outside its fusion regions, forward and backward,
    in ms per step (fusion-level timing; splits without it are absent). Where `bench` finds a split's gap outside its
    regions, this says how much time lives there to lose."""
    outside: dict[str, float] = {}
    for piece in digest.timed_pieces(report):
        if piece.level is digest.PieceLevel.OUTSIDE_FUSIONS:
            key = PieceKey.of(piece.graph, piece.split)
            outside[key] = outside.get(key, 0.0) + piece.ms_per_step
    return outside


def result_name(script: str) -> str:
    """The results file of a script: its file name with .json for .py (names in a dump are unique by design)."""
    name = Path(script).name
    return (name[: -len(".py")] if name.endswith(".py") else name) + ".json"


def read_result(path: Path, script: str) -> ScriptResult:
    """Reads one script's JSON result; a missing or malformed file is a result with an error, not an exception."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ScriptResult(script, error=f"no result file {path.name}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return ScriptResult(script, error=f"unreadable result {path.name}: {e}")
    if not isinstance(data, dict):
        return ScriptResult(script, error=f"{path.name}: expected a JSON object")
    values = {}
    for key in ("forward_ms", "backward_ms", "forward_device_ms", "backward_device_ms"):
        value = data.get(key)
        ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                               and value >= 0)
        if not ok:
            return ScriptResult(script, error=f"{path.name}: {key} must be a non-negative number or null")
        values[key] = None if value is None else float(value)
    if values["forward_ms"] is None:
        return ScriptResult(script, error=f"{path.name}: no forward_ms")
    return ScriptResult(script, **values)


def _script_path(rank_dir: Path, script: str) -> Path:
    """The absolute path of `script` (relative to `rank_dir`; the script runs in its own folder).

    Raises:
        ValueError: the name leaves the dump, or no such script is in it.
    """
    path = (rank_dir / layout.safe_relative(script)).resolve()
    if not path.is_file():
        raise ValueError(f"{script} is not in the dump")
    return path


def script_path(rank_dir: Path, script: str) -> Path:
    """`_script_path`, for the one-process runner (`bench_worker`)."""
    return _script_path(rank_dir, script)


def device_env(device: str | None) -> dict[str, str] | None:
    """`_env`, for the one-process runner (`bench_worker`)."""
    return _env(device)


def _env(device: str | None) -> dict[str, str] | None:
    """The environment of a script pinned to `device` (a CUDA_VISIBLE_DEVICES entry), or None: inherit ours."""
    return None if device is None else {**os.environ, "CUDA_VISIBLE_DEVICES": device}


def warm_up(rank_dir: Path, scripts: Iterable[str], jobs: int, timeout_s: float, python: str = sys.executable,
            devices: Sequence[str] = (), on_done: Callable[[str], None] | None = None) -> int:
    """Runs each script once without timing it, `jobs` at a time, and returns how many exited 0 (`on_done(script)`
    after each, from the thread that ran it).

    Why: most of a script's run is compiling (inductor and Triton), and both keep what they compile in on-disk caches
    that the next process reads. Compiling every script in parallel first leaves the timed runs, which must run one
    at a time, mostly cache hits. Failures are not reported here: the timed run of the same script reports them.
    With `devices`, the workers take them in turn, so that their allocations spread over the GPUs.
    """
    from thunderfx_debug.children.pool import Job, run_jobs

    work, passed = [], []
    names = {}
    for script in scripts:
        try:
            job = Job(_script_path(rank_dir, script))
        except ValueError:
            if on_done is not None:
                on_done(Path(script).name)
            continue
        work.append(job)
        names[job] = Path(script).name

    def done(finished) -> None:
        passed.append(finished.status == 0)
        if on_done is not None:
            on_done(names[finished.job])

    # In `jobs` long-lived workers (`children.pool`), the GPUs taken in turn; a script that crashes one runs alone.
    envs = [(_env(devices[i % len(devices)]) if devices else None) or dict(os.environ) for i in range(max(jobs, 1))]
    run_jobs(work, envs, timeout_s, _untimed_alone(python, timeout_s), done, python=python)
    return sum(passed)


def _untimed_alone(python: str, timeout_s: float):
    """Runs a warm-up script that took its worker down in a process of its own, for its exit status."""
    from thunderfx_debug.children.pool import Finished

    def alone(job, env, _worker_end) -> Finished:
        run = standalone.run_script(job.script, timeout_s=timeout_s, env=dict(env), python=python)
        return Finished(job, run.returncode, timeout_s if run.returncode is None else 0.0, "alone")

    return alone


def run_all(scripts: Iterable[str], run: Callable[[str, str | None], ScriptResult],
            devices: Sequence[str] = ()) -> dict[str, ScriptResult]:
    """Each script's result from `run(script, device)`: one script at a time on each of `devices` (all of them at
    once when there are several), or one at a time with the inherited device when `devices` is empty.

    A timed script must have its GPU to itself, else it measures its neighbour too; several GPUs of one host each
    run their own script and finish the same list sooner (the dumped GPT's 36 scripts need ~25 s each)."""
    scripts = list(dict.fromkeys(scripts))
    if len(devices) <= 1:
        return {script: run(script, devices[0] if devices else None) for script in scripts}
    free: queue.Queue[str] = queue.Queue()
    for device in devices:
        free.put(device)

    def on_a_free_device(script: str) -> ScriptResult:
        device = free.get()
        try:
            return run(script, device)
        finally:
            free.put(device)

    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        return dict(zip(scripts, pool.map(on_a_free_device, scripts)))


def run_script(rank_dir: Path, script: str, results_dir: Path, timeout_s: float,
               python: str = sys.executable, device: str | None = None) -> ScriptResult:
    """Runs `script` (relative to `rank_dir`) with --benchmark --json as `verify` runs a script that runs alone
    (`standalone.run_script`: where thunderfx_debug cannot be imported) and reads what it wrote; with `device`, on
    that CUDA device alone (CUDA_VISIBLE_DEVICES)."""
    try:
        path = _script_path(rank_dir, script)
    except ValueError as e:
        return ScriptResult(script, error=str(e))
    out = (results_dir / result_name(script)).resolve()
    out.unlink(missing_ok=True)
    done = standalone.run_script(path, ("--benchmark", "--json", str(out)), timeout_s, env=_env(device), python=python)
    if done.returncode is None:
        return ScriptResult(script, error=f"timed out after {timeout_s:g} s")
    result = read_result(out, script)
    if done.returncode != 0:
        why = f"the script {how_it_ended(done.returncode)}: {_why(done.stdout + chr(10) + done.stderr)}"
        return dataclasses.replace(result, note=why) if result.error is None else ScriptResult(script, error=why)
    return result


def _why(output: str) -> str:
    """The telling line of a failed script's output: a MISMATCH or an error, not the warnings around it."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines if "warn" not in line.lower()] or lines or ["no output"]
    telling = [line for line in lines if "MISMATCH" in line or "Error" in line]
    return "; ".join(telling[-2:] if telling else lines[-1:])[:400]


def scripts_of(comparisons: Iterable[Comparison]) -> list[str]:
    """The distinct scripts of `comparisons`, in order (a piece's own script, then inductor's)."""
    return list(dict.fromkeys(s for c in comparisons for s in (c.ours_script, c.theirs_script)))


@dataclasses.dataclass(frozen=True)
class Ranked:
    """A compared piece: ms per call of ours and inductor's, ratio ours/theirs (above 1: ThunderFX is slower),
    `loss_ms` the time ThunderFX loses per step there (negative: it gains), `beyond` whether the ratio deviates
    beyond `deviation` either way, by the flush-time triage's rule (`records.deviation_outcome`; here a point ratio
    of two medians, without an interval); `error` when a script failed (then no figures)."""

    comparison: Comparison
    ours_ms: float | None
    theirs_ms: float | None
    error: str | None = None
    deviation: float = DEVIATION
    notes: tuple[str, ...] = ()  # scripts that measured but exited non-zero (self-check mismatches)
    clock: str = "wall"  # "device" where both scripts measured their kernels' GPU time, which is then compared

    @property
    def ratio(self) -> float | None:
        if self.ours_ms is None or self.theirs_ms is None or self.theirs_ms <= 0:
            return None
        return self.ours_ms / self.theirs_ms

    @property
    def loss_ms(self) -> float:
        if self.ours_ms is None or self.theirs_ms is None:
            return 0.0
        return (self.ours_ms - self.theirs_ms) * self.comparison.calls_per_step

    @property
    def beyond(self) -> bool:
        return self.ratio is not None and deviation_outcome(self.ratio, self.ratio, self.deviation) == "deviates"


def _total(ours: ScriptResult, theirs: ScriptResult) -> tuple[float | None, float | None, str]:
    """(ours ms, theirs ms, clock): forward, plus backward where both scripts measured one (so both sides time the
    same work), in device time where both scripts measured it, else in wall-clock time."""
    if ours.forward_ms is None or theirs.forward_ms is None:
        return None, None, "wall"
    device = ours.forward_device_ms is not None and theirs.forward_device_ms is not None

    def figures(r: ScriptResult) -> tuple[float, float | None]:
        return (r.forward_device_ms, r.backward_device_ms) if device else (r.forward_ms, r.backward_ms)

    (ours_forward, ours_backward), (theirs_forward, theirs_backward) = figures(ours), figures(theirs)
    both_backward = ours_backward is not None and theirs_backward is not None
    return (ours_forward + (ours_backward if both_backward else 0.0),
            theirs_forward + (theirs_backward if both_backward else 0.0), "device" if device else "wall")


def rank(comparisons: Iterable[Comparison], results: Mapping[str, ScriptResult],
         deviation: float = DEVIATION) -> list[Ranked]:
    """The compared pieces, those where ThunderFX loses most per step first, failures last."""
    ranked = []
    for c in comparisons:
        ours = results.get(c.ours_script, ScriptResult(c.ours_script, error="not run"))
        theirs = results.get(c.theirs_script, ScriptResult(c.theirs_script, error="not run"))
        error = "; ".join(f"{Path(r.script).name}: {r.error}" for r in (ours, theirs) if r.error) or None
        ours_ms, theirs_ms, clock = (None, None, "wall") if error else _total(ours, theirs)
        notes = tuple(f"{Path(r.script).name}: {r.note}" for r in (ours, theirs) if r.note)
        ranked.append(Ranked(c, ours_ms, theirs_ms, error, deviation, notes, clock))
    return sorted(ranked, key=lambda r: (r.error is not None, -r.loss_ms, r.comparison.path))


@dataclasses.dataclass(frozen=True)
class Explained:
    """For one split: its own loss (whole split, Thunder vs inductor) and the sum of its fusion regions' losses."""

    split: str
    split_loss_ms: float | None
    regions_loss_ms: float
    regions_beyond_loss_ms: float


def explain(ranked: Iterable[Ranked]) -> list[Explained]:
    """How much of each split's gap its fusion regions account for (all of them, and those that deviate)."""
    by_split: dict[str, dict[str, float | None]] = {}
    for r in ranked:
        entry = by_split.setdefault(r.comparison.split, {"split": None, "regions": 0.0, "beyond": 0.0})
        if r.error:
            continue
        if r.comparison.level is digest.PieceLevel.SPLIT:
            entry["split"] = r.loss_ms
        else:
            entry["regions"] += r.loss_ms
            entry["beyond"] += r.loss_ms if r.beyond else 0.0
    return [Explained(s, e["split"], e["regions"], e["beyond"]) for s, e in sorted(by_split.items())]
