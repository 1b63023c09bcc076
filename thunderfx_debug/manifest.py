"""The facts of a run that go into `manifest.json` and `Report.meta`: versions, settings, rank, environment."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import re
import sys
from collections.abc import Mapping
from typing import Any

from thunderfx_debug.safety import ReportingFailures

#: Environment variables whose names contain one of these words are recorded as "<redacted>".
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION", "PRIVATE")

#: Environment variables worth having in a report (prefixes); the rest of the environment is not recorded.
RELEVANT_PREFIXES = (
    "THUNDERFX_DEBUG_", "THUNDER", "NVFUSER", "TORCH", "PYTORCH", "CUDA", "NCCL", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_", "OMP_NUM_THREADS", "TRITON", "INDUCTOR", "HF_", "TRANSFORMERS",
)

REDACTED = "<redacted>"

_SECRET = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
# user:password@ in a URL (https://user:token@host/...), whatever the variable or argument is called.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]+@")


def _redact_value(value: str) -> str:
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{REDACTED}@", value)


def redacted_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The relevant environment variables (see RELEVANT_PREFIXES), with the values of credential-like names
    (SECRET_WORDS, e.g. HF_TOKEN, WANDB_API_KEY) replaced by '<redacted>' and credentials in URLs removed.

    Example:
        >>> redacted_environment({"HF_TOKEN": "hf_abc", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/root"})
        {'CUDA_VISIBLE_DEVICES': '0', 'HF_TOKEN': '<redacted>'}
    """
    environ = os.environ if environ is None else environ
    recorded = {}
    for name in sorted(environ):
        if not name.upper().startswith(RELEVANT_PREFIXES) and not _SECRET.search(name):
            continue
        recorded[name] = REDACTED if _SECRET.search(name) else _redact_value(environ[name])
    return recorded


def redacted_argv(argv: list[str]) -> list[str]:
    """The command line with the values of credential-like options redacted: `--hf-token X`, `--api-key=X`,
    `password=X` (Hydra style), and credentials in URLs.

    Example:
        >>> redacted_argv(["train.py", "--hf-token", "hf_abc", "--lr=3e-4", "wandb.api_key=xyz"])
        ['train.py', '--hf-token', '<redacted>', '--lr=3e-4', 'wandb.api_key=<redacted>']
    """
    redacted: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            redacted.append(REDACTED)
            hide_next = False
            continue
        name, equals, _ = arg.partition("=")
        if equals and _SECRET.search(name):
            redacted.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and _SECRET.search(arg):
            redacted.append(arg)
            hide_next = True
        else:
            redacted.append(_redact_value(arg))
    return redacted


@functools.cache
def _installed_version(package: str) -> str | None:
    """The installed version of `package` (read once per process: reading package metadata costs about a
    millisecond, and a periodic flush asks again and again)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "lightning-thunder", "nvfuser", "nvfuser-cu130-torch210", "triton", "thunderfx-debug"):
        versions[package] = _installed_version(package)
    # nvFuser may be importable without pip metadata (as the H200 bundle provides it).
    if versions.get("nvfuser") is None and "nvfuser_direct" in sys.modules:
        versions["nvfuser"] = str(getattr(sys.modules["nvfuser_direct"], "version", lambda: "unknown")())
    return versions


def device_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        facts["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return facts


def run_facts(*, rank: int, world_size: int, config: dict[str, Any], thunder_options: dict[str, str],
              warnings: list[str], failures: ReportingFailures, flushes: int) -> dict[str, Any]:
    """`Report.meta` of a live run: the facts given, and those of this process (host, argv, versions, device,
    environment) read now. `config` and `thunder_options` are already in their text form."""
    return {
        "rank": rank,
        "world_size": world_size,
        "hostname": platform.node(),
        "pid": os.getpid(),
        "argv": redacted_argv(list(sys.argv)),
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "device": device_facts(),
        "config": config,
        "thunder_options": thunder_options,
        "environment": redacted_environment(),
        "warnings": list(warnings),
        "reporting_failures": [{"what": f["what"], "error": f["error"]} for f in failures.failures],
        "reporting_failures_count": failures.total,
        "flushes": flushes,
    }
