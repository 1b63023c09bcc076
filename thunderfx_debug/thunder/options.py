"""Thunder options and executors, by name: for the manifest, and for repro scripts that rebuild the run's
executors in another process."""

from __future__ import annotations

from typing import Any


def describe_options(thunder_options: dict[str, Any]) -> dict[str, str]:
    """Thunder options as text for the manifest (executors by name)."""
    from thunder import resolve_executors

    described = {}
    for key, value in thunder_options.items():
        if key == "executors" and value is not None:
            described[key] = repr([ex.name for ex in resolve_executors(value)])
        else:
            described[key] = repr(value)
    return described


def executor_names(thunder_options: dict[str, Any]) -> list[str] | None:
    """The names of the run's executors (None when the run did not pass any: Thunder's defaults)."""
    from thunder import resolve_executors

    value = thunder_options.get("executors")
    return None if value is None else [ex.name for ex in resolve_executors(value)]


def executor_by_name(name: str):
    """A registered Thunder executor by its name; a repro script's way to get back the run's executors."""
    from thunder.extend import get_executor

    executor = get_executor(name)
    if executor is None:
        raise LookupError(
            f"Thunder has no executor named {name!r} in this process; a custom executor must be registered "
            "(imported) before this script builds its Thunder function"
        )
    return executor
