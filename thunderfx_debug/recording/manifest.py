"""The facts of a run that go into `manifest.json` and `Report.meta`: versions, settings, rank, environment, and
warnings about the environment: a component that runs on a torch it was not built for, a device shared with other
processes.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from thunderfx_debug.settings.safety import ReportingFailures

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


_BUILT_FOR_TORCH = re.compile(r"[-_]torch(?P<major>\d)(?P<minor>\d{1,2})$")


def _torch_requirement(requirement: str):
    """The specifier of a `Requires-Dist` entry on torch that applies without extras (None otherwise)."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # packaging comes with pip and setuptools; without it only wheel names are read
        return None
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement:
        return None
    if parsed.name.lower() != "torch" or not parsed.specifier:
        return None
    if parsed.marker is not None and not parsed.marker.evaluate({"extra": ""}):
        return None
    return parsed.specifier


def version_warnings(torch_version: str, distributions: Iterable[tuple[str, str, list[str]]]) -> list[str]:
    """Warnings for installed components that were built for, or require, another torch than the running one.

    `distributions` are (name, version, Requires-Dist entries) as package metadata gives them. A component is
    built for another torch when its name says so (nvFuser's wheels are named for the torch they were built for:
    `nvfuser-cu130-torch210` is for torch 2.10) or its requirement on torch excludes the running version.

    Example:
        >>> version_warnings("2.11.0+cu130", [("nvfuser-cu130-torch210", "0.2.36", []),
        ...                                   ("lightning-thunder", "0.2.6", ["torch>=2.7.1"])])
        ['nvfuser-cu130-torch210 0.2.36 was built for torch 2.10 and runs with torch 2.11.0+cu130: results may be wrong']
    """
    running = re.findall(r"\d+", torch_version.split("+")[0])[:2]
    release = torch_version.split("+")[0]
    warnings, seen = [], set()
    for name, version, requirements in distributions:
        key = name.lower().replace("_", "-")
        if key in seen or key == "torch":
            continue
        seen.add(key)
        built = _BUILT_FOR_TORCH.search(key)
        if built and [built["major"], built["minor"]] != running:
            warnings.append(f"{name} {version} was built for torch {built['major']}.{built['minor']} and runs with "
                            f"torch {torch_version}: results may be wrong")
            continue
        for requirement in requirements:
            specifier = _torch_requirement(requirement)
            if specifier is not None and not specifier.contains(release, prereleases=True):
                warnings.append(f"{name} {version} requires torch{specifier} and runs with torch {torch_version}: "
                                "results may be wrong")
                break
    return warnings


@functools.cache
def installed_version_warnings() -> tuple[str, ...]:
    """`version_warnings` of this process's installed distributions (read once: package metadata does not change
    while a run trains)."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ()
    distributions = ((d.metadata["Name"] or "", d.version or "", list(d.requires or []))
                     for d in importlib.metadata.distributions())
    return tuple(version_warnings(torch_version, distributions))


_NVML_PROCESS = re.compile(r"process\s+(?P<pid>\d+)\s+uses\s+(?P<mb>[\d.]+)\s+MB")


def device_sharing(listing: str | None = None, pid: int | None = None) -> dict[str, Any] | None:
    r"""Which processes use this process's CUDA device now (NVML, through `torch.cuda.list_gpu_processes`), and a
    warning where others do. None on CPU runs (CUDA never initialised: nothing is initialised here for this).

    `listing` and `pid` stand for NVML's listing and this process's id, for tests. Inside a container NVML may
    list process ids of the host's namespace, where this process's own id is not found: then only a count beyond one
    says that others share the device.

    Example:
        >>> device_sharing("GPU:0\nprocess      4242 uses     1500.000 MB GPU memory\n"
        ...                "process      7 uses     9000.000 MB GPU memory", pid=4242)["warning"]
        'the device (GPU:0) was shared with 1 other process (pid 7 with 9000 MB) when the dump was written: timings may include their work'
    """
    if listing is None:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        listing = torch.cuda.list_gpu_processes(torch.cuda.current_device())
    pid = os.getpid() if pid is None else pid
    device = listing.splitlines()[0].strip() if listing.strip() else "?"
    processes = [(int(m["pid"]), float(m["mb"])) for m in _NVML_PROCESS.finditer(listing)]
    facts: dict[str, Any] = {"device": device, "processes": [{"pid": p, "mb": mb} for p, mb in processes]}
    if not device.startswith("GPU:"):  # NVML missing: torch says so in one line
        facts["unknown"] = listing.strip()[:200]
        return facts
    others = [(p, mb) for p, mb in processes if p != pid]
    if len(others) == len(processes):  # our own id is not listed (another pid namespace): one of them is us
        others = others[1:] if others else []
        facts["note"] = "this process's id is not in NVML's list (another pid namespace): counted as one of them"
    if others:
        facts["warning"] = (
            f"the device ({device}) was shared with {len(others)} other process{'' if len(others) == 1 else 'es'} "
            f"({', '.join(f'pid {p} with {mb:.0f} MB' for p, mb in others)}) when the dump was written: timings may "
            "include their work")
    return facts


def device_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        facts["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return facts


def environment_checks(failures: ReportingFailures) -> dict[str, Any]:
    """Warnings about the environment (`environment_warnings`), the device's sharing and inductor's cache counters,
    each read guarded: a failing check loses that fact only."""
    facts: dict[str, Any] = {"environment_warnings": []}
    with failures.guard("checking the installed components' torch versions"):
        facts["environment_warnings"] += installed_version_warnings()
    with failures.guard("listing the processes on the device"):
        sharing = device_sharing()
        if sharing is not None:
            facts["device_sharing"] = sharing
            if "warning" in sharing:
                facts["environment_warnings"].append(sharing["warning"])
    with failures.guard("reading inductor's cache counters"):
        from thunderfx_debug.thunder.compile_events import cache_counters

        facts["compile_caches"] = cache_counters()
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
        **environment_checks(failures),
        "reporting_failures": [{"what": f["what"], "error": f["error"]} for f in failures.failures],
        "reporting_failures_count": failures.total,
        "flushes": flushes,
    }
