"""Which run a process belongs to: the run id that every rank of one job derives alike, without communicating.

A dump directory holds the latest run at `rank<R>/` and earlier runs under `runs/<run id>/rank<R>/` (see
`dump.files.move_earlier_run_aside`). The run id comes from what the launcher tells every process of a job:

- under SLURM: `slurm<SLURM_JOB_ID>` (with `.<SLURM_STEP_ID>` inside an `srun` step) and, for a requeued job,
  `requeue<SLURM_RESTART_COUNT>`;
- under torchrun (TORCHELASTIC_RESTART_COUNT is set): the rendezvous id TORCHELASTIC_RUN_ID (a fresh uuid for
  `--standalone` and single-node jobs, the `--rdzv-id` of multi-node ones) unless it is torchrun's default `none` or
  the SLURM job id again, then `restart<TORCHELASTIC_RESTART_COUNT>`: a worker group that torchrun restarts after a
  failure is a new run. With the rendezvous id `none` and no SLURM job, the workers of one node share their parent,
  torchrun's agent: `torchrun-<host>-<agent pid>`;
- otherwise (a plain `python train.py`, or processes started by the user's own launcher): the UTC time at which
  the process built its first ReportingBackend, the host and the pid, `20261201T093000Z-host-4242`; ranks started
  that way get one run id each.

The id keeps only characters that are safe in a file name (`layout.safe_relative`). Each process also gets a random
`process_uid`, so that a dump is known to be its own even where the launcher reuses run ids or pids.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import platform
import re
import uuid
from collections.abc import Mapping

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
MAX_RUN_ID_CHARS = 120


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """The run a process belongs to (`run_id`), when it started recording (`started_at`, ISO 8601 UTC), and
    the random id of the process itself (`process_uid`)."""

    run_id: str
    started_at: str
    process_uid: str


def safe_run_id(text: str) -> str:
    """`text` as a name that can be a directory of a dump: unsafe characters become "_", no leading dot.

    Example:
        >>> safe_run_id("job 17/a:b"), safe_run_id("..x")
        ('job_17_a_b', 'x')
    """
    return _UNSAFE.sub("_", text).lstrip(".")[:MAX_RUN_ID_CHARS]


def derive_run_id(environ: Mapping[str, str], *, now: datetime.datetime, host: str, pid: int, parent_pid: int) -> str:
    """The run id of a process with this environment (see the module docstring).

    Example:
        >>> when = datetime.datetime(2026, 12, 1, 9, 30, tzinfo=datetime.timezone.utc)
        >>> derive_run_id({"TORCHELASTIC_RUN_ID": "5f0c", "TORCHELASTIC_RESTART_COUNT": "1"}, now=when, host="h",
        ...               pid=7, parent_pid=1)
        '5f0c-restart1'
        >>> derive_run_id({"SLURM_JOB_ID": "123", "SLURM_RESTART_COUNT": "2"}, now=when, host="h", pid=7, parent_pid=1)
        'slurm123-requeue2'
        >>> derive_run_id({}, now=when, host="node-1", pid=4242, parent_pid=1)
        '20261201T093000Z-node-1-4242'
    """
    parts: list[str] = []
    job = environ.get("SLURM_JOB_ID", "").strip()
    if job:
        step = environ.get("SLURM_STEP_ID", "").strip()
        parts.append(f"slurm{job}" + (f".{step}" if step else ""))
        requeues = environ.get("SLURM_RESTART_COUNT", "").strip()
        if requeues and requeues != "0":
            parts.append(f"requeue{requeues}")
    restarts = environ.get("TORCHELASTIC_RESTART_COUNT")
    if restarts is not None:
        rendezvous = environ.get("TORCHELASTIC_RUN_ID", "").strip()
        if rendezvous and rendezvous != "none":
            if rendezvous != job:
                parts.append(rendezvous)
        elif not job:
            parts.append(f"torchrun-{host}-{parent_pid}")
        parts.append(f"restart{restarts.strip() or 0}")
    if not parts:
        parts = [now.strftime("%Y%m%dT%H%M%SZ"), host, str(pid)]
    return safe_run_id("-".join(parts)) or f"run-{pid}"


def this_run() -> RunIdentity:
    """The run of this process, derived once (when its first ReportingBackend is built) and shared by every backend
    in it; a forked child derives its own."""
    return _identity_of_process(os.getpid())


@functools.cache
def _identity_of_process(pid: int) -> RunIdentity:
    now = datetime.datetime.now(datetime.timezone.utc)
    run_id = derive_run_id(os.environ, now=now, host=platform.node() or "host", pid=pid, parent_pid=os.getppid())
    return RunIdentity(run_id, now.isoformat(timespec="seconds"), uuid.uuid4().hex[:16])
