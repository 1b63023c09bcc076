"""Writing a dump (atomically, per rank) and reading it back (without importing thunder, never executing code).

What to write comes as (relative path, content) pairs (`artifacts.dump_contents.report_files`). Each file is written to a
temporary name and renamed over the old one, in order, and `manifest.json`, the index that `load_report` reads
first, comes last. A run killed in the middle of a flush therefore leaves the previous dump readable: the old
manifest still indexes complete files. Successive flushes of one process (`DumpWriter`) skip the files whose
content did not change, so a long run's traces and scripts are written once.

A run restarted into the same directory first moves the earlier run's dump aside (`move_earlier_run_aside`):
the latest run is always at `rank<R>/`, earlier ones under `runs/<run id>/rank<R>/` (`list_runs`).
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from thunderfx_debug.records import layout
from thunderfx_debug.settings.config import ConfigError
from thunderfx_debug.dump.runs import safe_run_id
from thunderfx_debug.records import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, CollectiveLog, DumpError, GraphRecord
from thunderfx_debug.render.report import Report


class DumpWriteError(OSError):
    """The dump could not be written (unwritable directory, full disk); the message says where and what to do."""


def check_writable(dump_dir: Path) -> None:
    """Fails fast, before training, when the dump directory cannot be created or written."""
    try:
        dump_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dump_dir, prefix=".write-check-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"THUNDERFX_DEBUG_DIR / dump_dir {str(dump_dir)!r} cannot be written ({_why_not_writable(dump_dir, e)}); "
            "choose a writable directory or unset THUNDERFX_DEBUG_DIR"
        ) from None


def _why_not_writable(dump_dir: Path, error: OSError) -> str:
    """What the OS said, or, where it says "No such file or directory" of a folder whose parent exists (mkdir in a
    virtual filesystem such as /proc or /sys), what that means."""
    existing = next((p for p in [dump_dir, *dump_dir.parents] if p.exists()), None)
    if isinstance(error, FileNotFoundError) and existing is not None and existing != dump_dir:
        return f"no directory can be made in {existing} ({error.strerror}): it is not an ordinary writable folder"
    return error.strerror or str(error)


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it back at once
    os.umask(mask)
    return mask


#: The mode of dump files: what `open()` would give (mkstemp's 0600 would hide the dump from the colleague or the
#: web server that is to read it).
_FILE_MODE = 0o666 & ~_umask()


def _atomic_write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _FILE_MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_file_atomically(path: str | os.PathLike, content: str | bytes) -> None:
    """Writes one file through a temporary file renamed over `path`: a reader never sees half of it, and where
    `path` is a symbolic link (say, planted in a dump someone sent) the link is replaced, not written through."""
    _atomic_write(Path(path), content)


def write_files(rank_dir: Path, files: list[tuple[str, str | bytes]]) -> None:
    """Writes (relative path, content) pairs under `rank_dir`, each atomically, in order."""
    DumpWriter(rank_dir).write(files)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class DumpWriter:
    """Writes the files of successive flushes into one rank directory: each atomically, in the order given (the
    manifest last), except those whose content is what this writer last wrote at that path and which are still
    there: a long run rewrites its graph.json, summary, trace and manifest, not its traces and scripts.

    `write` returns how many files it wrote and how many it left as they were. A content object given again is
    known unchanged without reading it; another is compared by digest.
    """

    def __init__(self, rank_dir: Path):
        self.rank_dir = rank_dir
        self._written: dict[str, tuple[str | bytes, bytes]] = {}  # relative path -> (content, its digest)

    def write(self, files: Sequence[tuple[str, str | bytes]]) -> tuple[int, int]:
        written = unchanged = 0
        for relative, content in files:
            path = self.rank_dir / layout.safe_relative(relative)
            previous = self._written.get(relative)
            if previous is not None and previous[0] is content and path.is_file():
                unchanged += 1
                continue
            data = content.encode() if isinstance(content, str) else content
            digest = _digest(data)
            if previous is not None and previous[1] == digest and path.is_file():
                self._written[relative] = (content, digest)
                unchanged += 1
                continue
            try:
                _atomic_write(path, data)
            except OSError as e:
                hint = "free some space" if e.errno == errno.ENOSPC else "check the directory's permissions"
                raise DumpWriteError(
                    e.errno,
                    f"cannot write {path} ({e.strerror or e}); {hint}. The previous dump in {self.rank_dir} is intact.",
                ) from e
            self._written[relative] = (content, digest)
            written += 1
        return written, unchanged


# ---- runs of one directory ------------------------------------------------------------------------------------------


def _manifest_or_none(rank_dir: Path) -> dict[str, Any] | None:
    try:
        manifest = _read_json(rank_dir / layout.MANIFEST, "the dump's index")
    except DumpError:
        return None
    return manifest if isinstance(manifest, dict) else None


def _utc_stamp(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def move_earlier_run_aside(dump_dir: Path, rank: int, process_uid: str) -> Path | None:
    """Keeps an earlier run's dump before this process first writes `<dump_dir>/rank<R>/`: a dump there that another
    process wrote (its manifest's `process_uid` is not ours: a run restarted into the same directory) is moved, in
    one atomic rename, to `runs/<its run id>/rank<R>/` (`runs/<its run id>.2/` and on where that is taken; an
    unreadable or pre-run-id dump is named `unknown-<time of its last write>`). Returns where it went; None when
    there was nothing to move.

    Raises:
        OSError: the move failed; the earlier dump is then where it was (write nothing over it).
    """
    rank_dir = dump_dir / layout.rank_dir_name(rank)
    if not rank_dir.is_dir():
        return None
    manifest = _manifest_or_none(rank_dir)
    if manifest is not None and manifest.get("process_uid") == process_uid:
        return None  # this process's own dump (another backend of it wrote it)
    if not any(rank_dir.iterdir()):
        return None
    run_id = manifest.get("run_id") if manifest is not None else None
    run_id = safe_run_id(run_id) if isinstance(run_id, str) else ""
    if not run_id:
        newest = rank_dir / layout.MANIFEST if (rank_dir / layout.MANIFEST).is_file() else rank_dir
        run_id = f"unknown-{_utc_stamp(newest.stat().st_mtime)}"
    for attempt in itertools.count(1):
        parent = dump_dir / layout.earlier_run_dir(run_id if attempt == 1 else f"{run_id}.{attempt}")
        target = parent / rank_dir.name
        if target.exists():
            continue
        parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(rank_dir, target)  # atomic; the whole earlier dump moves or none of it
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and attempt < 100:
                continue  # another process took that name meanwhile
            raise
        return target
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One run of a dump directory: its id (None for a dump written before runs had ids), the directory holding
    its rank directories, whether it is the latest (at the top of the dump directory), and from its manifests the
    ranks, when it started, when it last flushed and how often."""

    run_id: str | None
    path: Path
    latest: bool
    ranks: tuple[int, ...]
    started_at: str | None
    written_at: str | None
    flushes: int | None


def _run_entry(path: Path, ranks: dict[int, Path], latest: bool) -> RunEntry:
    manifests = [m for m in (_manifest_or_none(d) for d in ranks.values()) if m is not None]

    def texts(key: str) -> list[str]:
        return [m[key] for m in manifests if isinstance(m.get(key), str)]

    run_ids = texts("run_id")
    flushes = [m["flushes"] for m in manifests if isinstance(m.get("flushes"), int)]
    return RunEntry(
        run_id=run_ids[0] if run_ids else None,
        path=path,
        latest=latest,
        ranks=tuple(ranks),
        started_at=min(texts("run_started_at"), default=None),
        written_at=max(texts("written_at"), default=None),
        flushes=max(flushes, default=None),
    )


def list_runs(path: str | os.PathLike) -> list[RunEntry]:
    """The runs of a dump directory, oldest first and the latest (the one at `rank<R>/`) last.

    Raises:
        DumpError: the directory holds no dump of any run.
    """
    root = Path(path)
    if not root.is_dir():
        rank_dirs(root)  # raises the error that says what is wrong: missing, or not a directory
    earlier = []
    runs_dir = root / layout.RUNS_DIR
    if runs_dir.is_dir() and _resolves_inside(root, runs_dir):
        for child in sorted(runs_dir.iterdir()):
            if child.is_dir() and _resolves_inside(root, child):
                try:
                    earlier.append(_run_entry(child, rank_dirs(child), latest=False))
                except DumpError:
                    continue  # not a run (a folder of someone's own)
    earlier.sort(key=lambda run: (run.started_at or run.written_at or "", run.path.name))
    try:
        latest = [_run_entry(root, rank_dirs(root), latest=True)]
    except DumpError:
        latest = []
    if not earlier and not latest:
        raise DumpError(_no_dump(root))
    return earlier + latest


# ---- reading --------------------------------------------------------------------------------------------------------


#: The largest JSON file `load_report` reads: a dump's graph.json is kilobytes to a few megabytes; a bigger one is
#: not ours, and reading it would only exhaust memory.
MAX_JSON_BYTES = 512 * 2**20


def _read_json(path: Path, what: str) -> Any:
    try:
        if not path.is_file():  # a FIFO or a device would block or never end; a directory is not JSON
            raise DumpError(f"{path} is missing: {what}" if not path.exists() else f"{path} is not a regular file")
        if path.stat().st_size > MAX_JSON_BYTES:
            raise DumpError(f"{path} is over {MAX_JSON_BYTES // 2**20} MB: not a file thunderfx_debug wrote")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DumpError(f"{path} is missing: {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DumpError(f"{path} cannot be read ({e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        # json's messages may end in "at" themselves ("Unterminated string starting at").
        raise DumpError(f"{path} is damaged: not valid JSON ({e.msg.removesuffix(' at')} at line {e.lineno}, column "
                        f"{e.colno})") from None
    except RecursionError:
        raise DumpError(f"{path} is damaged: its JSON is nested too deeply to be a dump") from None


#: What every command that reads a dump takes, said where a path given is not one.
WHAT_TO_PASS = "pass the THUNDERFX_DEBUG_DIR of a run (it holds rank0/, rank1/, ...) or one of its rank dirs"


def _is_dump(directory: Path) -> bool:
    try:
        return (directory / layout.MANIFEST).is_file() or any(
            child.name.startswith("rank") and child.name[4:].isdigit() and (child / layout.MANIFEST).is_file()
            for child in itertools.islice(directory.iterdir(), 1000))
    except OSError:
        return False


def _no_dump(root: Path) -> str:
    """Why `root` (an existing directory) is no dump, and what to pass instead: dumps right below it, or its
    earlier runs, where it has some."""
    try:  # a look one level down, bounded: the directory given may be a home directory
        below = sorted(child for child in itertools.islice(root.iterdir(), 1000) if child.is_dir()
                       and not child.is_symlink() and not child.name.startswith("rank") and _is_dump(child))
    except OSError:
        below = []
    if below:
        names = ", ".join(str(child) for child in below[:3]) + (f" (and {len(below) - 3} more)" if len(below) > 3
                                                                   else "")
        return f"{root} holds no dump itself; the dumps below it: {names}: pass one of them"
    runs = root / layout.RUNS_DIR
    if runs.is_dir() and any(_is_dump(run) for run in itertools.islice(runs.iterdir(), 1000) if run.is_dir()):
        return (f"{root} holds no latest run (no manifest.json in a rank<N>/ directory), only earlier ones under "
                f"{layout.RUNS_DIR}/; pass one of those (thunderfx-debug runs {root} lists them)")
    return f"{root} holds no dump: no manifest.json in it nor in a rank<N>/ directory under it; {WHAT_TO_PASS}"


def rank_dirs(path: str | os.PathLike) -> dict[int, Path]:
    """The rank directories of a dump: `path` itself when it is one, else its `rank<R>` children."""
    root = Path(path)
    if not root.exists():
        raise DumpError(f"{root} does not exist; {WHAT_TO_PASS}")
    if not root.is_dir():
        raise DumpError(f"{root} is not a directory; {WHAT_TO_PASS}")
    if (root / layout.MANIFEST).exists():
        name = root.name
        return {int(name[4:]) if name.startswith("rank") and name[4:].isdigit() else 0: root}
    ranks = {}
    for child in root.iterdir():
        if child.is_dir() and child.name.startswith("rank") and child.name[4:].isdigit():
            if (child / layout.MANIFEST).exists() and _resolves_inside(root, child):
                ranks[int(child.name[4:])] = child
    if not ranks:
        raise DumpError(_no_dump(root))
    return dict(sorted(ranks.items()))


def load_report(path: str | os.PathLike, rank: int | None = None) -> Report:
    """Reads a dump back into a Report, without importing thunder and without executing anything from it.

    Args:
        path: a dump directory (THUNDERFX_DEBUG_DIR of a run) or one of its `rank<R>` directories.
        rank: which rank to read from a multi-rank dump (default: the lowest).

    Raises:
        DumpError: the directory holds no dump, a file is damaged, or the dump has another schema version.
    """
    ranks = rank_dirs(path)
    if rank is None:
        rank = next(iter(ranks))
    if rank not in ranks:
        raise DumpError(f"{path} has no dump of rank {rank}; it has ranks {sorted(ranks)}")
    return _load_rank(ranks[rank])


def load_reports(path: str | os.PathLike) -> dict[int, Report]:
    """Every rank of a dump, by rank."""
    return {rank: _load_rank(directory) for rank, directory in rank_dirs(path).items()}


def _load_rank(rank_dir: Path) -> Report:
    manifest = _read_json(_inside(rank_dir, layout.MANIFEST, str(rank_dir)), "the dump's index")
    if not isinstance(manifest, dict):
        raise DumpError(f"{rank_dir / layout.MANIFEST} is damaged: expected a JSON object")
    version = manifest.get("schema_version")
    if version not in READABLE_SCHEMA_VERSIONS or isinstance(version, bool):
        versions = manifest.get("versions")
        writer = versions.get("thunderfx-debug") if isinstance(versions, dict) else None
        older = ", ".join(str(v) for v in READABLE_SCHEMA_VERSIONS if v != SCHEMA_VERSION)
        raise DumpError(
            f"{rank_dir} was written with dump schema version {version!r}; this thunderfx_debug reads version "
            f"{SCHEMA_VERSION} (and older: {older}). Open it with the thunderfx_debug version that wrote it "
            f"({writer if isinstance(writer, str) else 'unknown'})."
        )
    _check_meta_types(manifest, rank_dir / layout.MANIFEST)
    entries = manifest.get("graphs", [])
    if not isinstance(entries, list):
        raise DumpError(f"{rank_dir / layout.MANIFEST}: 'graphs' must be a list")
    graphs = []
    for i, entry in enumerate(entries):
        where = f"{rank_dir / layout.MANIFEST}: graphs[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise DumpError(f"{where} must be an object with a 'path'")
        graph_path = _inside(rank_dir, entry["path"], where)
        data = _read_json(graph_path, "listed in manifest.json")
        graphs.append(_with_traces(rank_dir, GraphRecord.from_json(data, str(graph_path)), str(graph_path)))
    meta = {k: v for k, v in manifest.items() if k not in ("graphs", "schema_version")}
    meta["dump_dir"] = str(rank_dir)
    report = Report(graphs=tuple(graphs), meta=meta, schema_version=version)
    if "collectives" in meta:  # read now, so that a damaged log is an error of the load, naming the file
        CollectiveLog.from_json(meta["collectives"], f"{rank_dir / layout.MANIFEST}: collectives")
    return report


#: The facts of the manifest that renderers read, with the JSON types they must have.
_META_TYPES: dict[str, type | tuple[type, ...]] = {
    "rank": int,
    "world_size": int,
    "pid": int,
    "flushes": int,
    "run_id": str,
    "run_started_at": str,
    "process_uid": str,
    "last_flush": dict,
    "hostname": str,
    "written_at": str,
    "argv": list,
    "versions": dict,
    "device": dict,
    "config": dict,
    "thunder_options": dict,
    "environment": dict,
    "warnings": list,
    "reporting_failures": list,
    "collectives": dict,
}


def _check_meta_types(manifest: dict[str, Any], where: Path) -> None:
    for key, kind in _META_TYPES.items():
        value = manifest.get(key)
        if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is int)):
            raise DumpError(f"{where}: {key!r} must be a JSON {_json_type_name(kind)}, found {value!r:.80}")


def _json_type_name(kind: type | tuple[type, ...]) -> str:
    return {int: "integer", str: "string", list: "array", dict: "object"}.get(kind, str(kind))  # type: ignore[arg-type]


def _resolves_inside(root: Path, path: Path) -> bool:
    """Whether `path`, symbolic links followed, lies inside `root` (a link in a dump may point anywhere)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def inside_dump(rank_dir: str | os.PathLike, relative: str) -> Path:
    """The file a dump's JSON names by `relative`, checked to stay inside `rank_dir`: a relative path of plain names
    (no '..', not absolute; `layout.safe_relative`) that does not leave the directory through a symbolic link.

    Raises:
        ValueError: the path would lead outside the dump.
    """
    rank_dir = Path(rank_dir)
    path = rank_dir / layout.safe_relative(relative)
    if not _resolves_inside(rank_dir, path):
        raise ValueError(f"{relative!r} leads outside the dump through a symbolic link")
    return path


def _inside(rank_dir: Path, relative: str, where: str) -> Path:
    try:
        return inside_dump(rank_dir, relative)
    except ValueError as e:
        raise DumpError(f"{where}: {e}") from None


def _with_traces(rank_dir: Path, graph: GraphRecord, where: str) -> GraphRecord:
    """The graph with its splits' final traces, read from the files their records name (`files`)."""
    splits = []
    for split in graph.splits:
        found = {}
        for label in ("fwd_trace", "bwd_trace"):
            relative = split.files.get(label)
            if relative is not None:
                path = _inside(rank_dir, relative, f"{where}: {split.name}.files.{label}")
                try:
                    # A missing (or not regular, or huge) trace file loses the trace text, not the report.
                    ok = path.is_file() and path.stat().st_size <= MAX_JSON_BYTES
                    found[label] = path.read_text(encoding="utf-8") if ok else None
                except (OSError, UnicodeDecodeError):
                    found[label] = None
        splits.append(dataclasses.replace(split, **found) if found else split)
    return dataclasses.replace(graph, splits=tuple(splits))
