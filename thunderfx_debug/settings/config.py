"""The backend's settings: parsed and validated in one place, before training starts.

Each setting can be given to `ReportingBackend(...)` as a keyword argument or through its environment variable;
the environment variable wins, so a run can be re-pointed without touching code, and a warning names both where it
replaces an argument given with another value. A bad value raises `ConfigError` naming the variable (or argument),
the value, and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from thunderfx_debug.records import DEVIATION

log = logging.getLogger("thunderfx_debug")


class ConfigError(ValueError):
    """A setting of thunderfx_debug has a value it cannot use."""


class TimingLevel(enum.IntEnum):
    """How finely the run is timed; each level includes the coarser ones."""

    OFF = 0
    GRAPH = 1
    SPLIT = 2
    FUSION = 3


class Inputs(str, enum.Enum):
    """What repro scripts get as inputs: the recorded metadata, or the tensors themselves."""

    META = "meta"
    REAL = "real"


class OnError(str, enum.Enum):
    """What happens when Thunder fails on a graph: the error propagates, or the graph runs with inductor."""

    RAISE = "raise"
    FALLBACK = "fallback"


class CheckLevel(enum.IntEnum):
    """What the correctness sentinel compares with eager on checked calls; `fusion` includes `split`."""

    OFF = 0
    SPLIT = 1
    FUSION = 2


class TriageLevel(enum.IntEnum):
    """What the flush-time triage times against inductor: nothing, each Thunder split, or its fusion regions too."""

    OFF = 0
    SPLIT = 1
    FUSION = 2


class ReproKind(str, enum.Enum):
    """The pieces repro scripts are written for."""

    GRAPH = "graph"
    SPLIT = "split"
    FUSION = "fusion"


@dataclasses.dataclass(frozen=True)
class Config:
    dump_dir: Path | None = None
    repro: frozenset[ReproKind] = frozenset()
    inputs: Inputs = Inputs.META
    inputs_max_mb: float = 256.0
    timing: TimingLevel = TimingLevel.GRAPH
    timing_every: int = 50
    timing_warmup: int = 5
    timing_share: float = 100.0  # percent of the training's wall time timing's sampled calls may take (100: no limit)
    ranks: frozenset[int] | None = None  # None: all ranks record
    on_error: OnError = OnError.RAISE
    strict: bool = False
    nvtx: bool = False
    recompile_warn_threshold: int = 8
    flush_every: float = 600.0  # seconds between automatic flushes during training; 0: none
    check: CheckLevel = CheckLevel.OFF
    check_every: int = 50
    check_share: float = 100.0  # percent of the training's wall time the checks may take (100: no limit)
    triage: TriageLevel = TriageLevel.OFF
    deviation: float = DEVIATION  # Thunder/inductor time ratio beyond which a triaged piece deviates
    triage_timeout: float = 600.0  # seconds a triaged piece may take in its process of its own, compiles included
    minimize: bool = False  # at flush, shrink every piece the sentinel flagged to its minimal failing script
    minimize_budget: float = 120.0  # seconds of minimizing per piece
    # percent of the device's memory that stays free beyond the training's high-water mark before anything of the
    # tool's starts on the device during training (the triage's children compiling ahead); 100: nothing does
    device_margin: float = 25.0

    def records_rank(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def to_json(self) -> dict[str, Any]:
        return {
            "dump_dir": str(self.dump_dir) if self.dump_dir else None,
            "repro": sorted(kind.value for kind in self.repro),
            "inputs": self.inputs.value,
            "inputs_max_mb": self.inputs_max_mb,
            "timing": self.timing.name.lower(),
            "timing_every": self.timing_every,
            "timing_warmup": self.timing_warmup,
            "timing_share": self.timing_share,
            "ranks": "all" if self.ranks is None else sorted(self.ranks),
            "on_error": self.on_error.value,
            "strict": self.strict,
            "nvtx": self.nvtx,
            "recompile_warn_threshold": self.recompile_warn_threshold,
            "flush_every": self.flush_every,
            "check": self.check.name.lower(),
            "check_every": self.check_every,
            "check_share": self.check_share,
            "triage": self.triage.name.lower(),
            "deviation": self.deviation,
            "triage_timeout": self.triage_timeout,
            "minimize": self.minimize,
            "minimize_budget": self.minimize_budget,
            "device_margin": self.device_margin,
        }


def _did_you_mean(words: list[str], allowed: list[str]) -> str:
    """" (did you mean 'split'?)" for the words close to an allowed value (a plural, a typo); "" for none."""
    close = [match[0] for word in words if (match := difflib.get_close_matches(word, allowed, n=1, cutoff=0.7))]
    return f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""


def _choice(options: Mapping[str, Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        key = text.strip().lower()
        if key not in options:
            raise ValueError(f"allowed: {', '.join(options)}{_did_you_mean([key], list(options))}")
        return options[key]

    return parse


def _parse_repro(text: str) -> frozenset[ReproKind]:
    items = [item.strip().lower() for item in text.split(",") if item.strip()]
    if items in ([], ["none"]):
        return frozenset()
    if items == ["all"]:
        return frozenset(ReproKind)
    known = [kind.value for kind in ReproKind]
    unknown = [item for item in items if item not in known]
    if unknown:
        raise ValueError(f"allowed: none, all, or a comma list of {', '.join(known)}; unknown: {unknown}"
                         + _did_you_mean(unknown, ["none", "all", *known]))
    return frozenset(ReproKind(item) for item in items)


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"allowed: a whole number >= {minimum}") from None
        if value < minimum:
            raise ValueError(f"allowed: a whole number >= {minimum}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("allowed: a number of megabytes >= 0") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("allowed: a number of megabytes >= 0")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("allowed: a number of seconds >= 0 (0: no automatic flushes)") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("allowed: a number of seconds >= 0 (0: no automatic flushes)")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("allowed: a percentage > 0 and <= 100, such as 1") from None
    if not 0 < value <= 100:
        raise ValueError("allowed: a percentage > 0 and <= 100, such as 1")
    return value


def _margin_percent(text: str) -> float:
    allowed = "allowed: a percentage of the device's memory >= 0 and <= 100, such as 25 (100: nothing starts early)"
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(allowed) from None
    if not 0 <= value <= 100:
        raise ValueError(allowed)
    return value


def ratio_above_one(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"allowed: a time ratio > 1, such as {DEVIATION}") from None
    if not 1 < value < float("inf"):
        raise ValueError(f"allowed: a time ratio > 1, such as {DEVIATION}")
    return value


def _budget_seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("allowed: a number of seconds > 0, such as 120") from None
    if not 0 < value < float("inf"):
        raise ValueError("allowed: a number of seconds > 0, such as 120")
    return value


def _parse_ranks(text: str) -> frozenset[int] | None:
    if text.strip().lower() == "all":
        return None
    try:
        ranks = frozenset(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise ValueError("allowed: all, or a comma list of ranks such as 0,3") from None
    if not ranks or min(ranks) < 0:
        raise ValueError("allowed: all, or a comma list of ranks >= 0 such as 0,3")
    return ranks


def _parse_bool(text: str) -> bool:
    return _choice({"0": False, "1": True, "false": False, "true": True, "no": False, "yes": True})(text)


def _parse_dir(text: str) -> Path | None:
    text = text.strip()
    if not text:
        return None
    # Absolute now: a relative directory means the one the run started in, even if the script changes directory later.
    path = Path(text).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ValueError("allowed: a directory (this path exists and is not one)")
    return path


# field -> (environment variable, parser of its text form)
_SETTINGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "dump_dir": ("THUNDERFX_DEBUG_DIR", _parse_dir),
    "repro": ("THUNDERFX_DEBUG_REPRO", _parse_repro),
    "inputs": ("THUNDERFX_DEBUG_INPUTS", _choice({i.value: i for i in Inputs})),
    "inputs_max_mb": ("THUNDERFX_DEBUG_INPUTS_MAX_MB", _positive_float),
    "timing": ("THUNDERFX_DEBUG_TIMING", _choice({t.name.lower(): t for t in TimingLevel})),
    "timing_every": ("THUNDERFX_DEBUG_TIMING_EVERY", _int_at_least(1)),
    "timing_warmup": ("THUNDERFX_DEBUG_TIMING_WARMUP", _int_at_least(0)),
    "timing_share": ("THUNDERFX_DEBUG_TIMING_SHARE", _percent),
    "ranks": ("THUNDERFX_DEBUG_RANKS", _parse_ranks),
    "on_error": ("THUNDERFX_DEBUG_ON_ERROR", _choice({o.value: o for o in OnError})),
    "strict": ("THUNDERFX_DEBUG_STRICT", _parse_bool),
    "nvtx": ("THUNDERFX_DEBUG_NVTX", _parse_bool),
    "recompile_warn_threshold": ("THUNDERFX_DEBUG_RECOMPILE_WARN", _int_at_least(1)),
    "flush_every": ("THUNDERFX_DEBUG_FLUSH_EVERY", _seconds),
    "check": ("THUNDERFX_DEBUG_CHECK", _choice({c.name.lower(): c for c in CheckLevel})),
    "check_every": ("THUNDERFX_DEBUG_CHECK_EVERY", _int_at_least(1)),
    "check_share": ("THUNDERFX_DEBUG_CHECK_SHARE", _percent),
    "triage": ("THUNDERFX_DEBUG_TRIAGE", _choice({t.name.lower(): t for t in TriageLevel})),
    "deviation": ("THUNDERFX_DEBUG_DEVIATION", ratio_above_one),
    "triage_timeout": ("THUNDERFX_DEBUG_TRIAGE_TIMEOUT", _budget_seconds),
    "minimize": ("THUNDERFX_DEBUG_MINIMIZE", _parse_bool),
    "minimize_budget": ("THUNDERFX_DEBUG_MINIMIZE_BUDGET", _budget_seconds),
    "device_margin": ("THUNDERFX_DEBUG_DEVICE_MARGIN", _margin_percent),
}

OWN_OPTIONS = frozenset(_SETTINGS)
ENV_PREFIX = "THUNDERFX_DEBUG_"


def unknown_variables(environ: Mapping[str, str]) -> dict[str, str | None]:
    """THUNDERFX_DEBUG_* variables that are no setting (a typo, most likely) -> the closest setting's variable."""
    known = [variable for variable, _ in _SETTINGS.values()]
    suffixes = [variable[len(ENV_PREFIX):] for variable in known]  # the shared prefix would make every name close

    def closest(name: str) -> str | None:
        match = difflib.get_close_matches(name[len(ENV_PREFIX):], suffixes, n=1, cutoff=0.75)
        return ENV_PREFIX + match[0] if match else None

    return {name: closest(name) for name in sorted(environ) if name.startswith(ENV_PREFIX) and name not in known}


def misspelt_option(name: str) -> str | None:
    """The thunderfx_debug option `name` is a near miss of (a constructor argument that is neither ours nor a
    `thunder.jit` argument, but for one letter or two ours), None where it is no near miss."""
    match = difflib.get_close_matches(name, sorted(OWN_OPTIONS), n=1, cutoff=0.8)
    return match[0] if match else None


def _from_argument(field: str, value: Any) -> Any:
    """Normalises a constructor argument: text goes through the same parser as the environment variable."""
    variable, parse = _SETTINGS[field]
    if value is None and field in ("dump_dir", "ranks"):
        return None
    if isinstance(value, bool) and field in ("strict", "nvtx", "minimize"):
        return value
    if field == "dump_dir" and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if field == "repro" and isinstance(value, (list, tuple, set, frozenset)):
        value = ",".join(v.value if isinstance(v, ReproKind) else v for v in value) if value else "none"
    if field == "ranks" and isinstance(value, (list, tuple, set, frozenset)):
        value = ",".join(str(v) for v in value)
    if isinstance(value, enum.Enum):
        value = value.name.lower() if isinstance(value, TimingLevel | CheckLevel | TriageLevel) else value.value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ConfigError(f"ReportingBackend({field}={value!r}): expected the same text as {variable} takes")
    try:
        return parse(value)
    except ValueError as e:
        raise ConfigError(f"ReportingBackend({field}={value!r}) is not valid ({e})") from None


def _warn_if_overridden(field: str, argument: Any, variable: str, text: str, value: Any) -> None:
    """An explicit argument that the environment replaces is worth a warning naming both (a run re-pointed by a
    variable left set in the shell is otherwise a silent surprise); an argument equal to the variable's value is not."""
    try:
        if _from_argument(field, argument) == value:
            return
    except ConfigError:
        pass  # an argument this version refuses is overridden all the same
    log.warning("thunderfx_debug: %s=%r overrides ReportingBackend(%s=%r): the environment variable wins (unset it "
                "to use the argument)", variable, text, field, argument)


def load_config(arguments: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Builds the Config from constructor `arguments` and `environ` (default: os.environ); the environment wins,
    with a warning naming both where it replaces an argument given with another value.

    Example:
        >>> load_config({"timing": "fusion"}, environ={"THUNDERFX_DEBUG_TIMING_EVERY": "10"}).timing_every
        10
    """
    arguments = dict(arguments or {})
    environ = os.environ if environ is None else environ
    unknown = set(arguments) - OWN_OPTIONS
    if unknown:
        raise ConfigError(f"unknown thunderfx_debug options {sorted(unknown)}; known: {sorted(OWN_OPTIONS)}")
    for name, closest in unknown_variables(environ).items():
        # Not an error (a newer thunderfx_debug may know it), but a setting that silently does nothing misleads.
        log.warning(
            "thunderfx_debug: %s is not a thunderfx_debug setting and is ignored%s",
            name,
            f" (did you mean {closest}?)" if closest else f"; known: {', '.join(environ_names().values())}",
        )
    values: dict[str, Any] = {}
    for field, (variable, parse) in _SETTINGS.items():
        if variable in environ:
            values[field] = _from_environ(field, environ)
            if field in arguments:
                _warn_if_overridden(field, arguments[field], variable, environ[variable], values[field])
        elif field in arguments:
            values[field] = _from_argument(field, arguments[field])
    config = Config(**values)
    at_flush = [f"{_SETTINGS[field][0]}={text}" for field, text in (
        ("triage", config.triage.name.lower() if config.triage is not TriageLevel.OFF else None),
        ("minimize", "1" if config.minimize else None),
        ("repro", ",".join(sorted(k.value for k in config.repro)) if config.repro else None)) if text]
    if at_flush and config.dump_dir is None:
        # Not an error (the same environment may serve a run that sets its directory in code), but a setting that
        # silently does nothing misleads.
        log.warning("thunderfx_debug: %s %s nothing without a dump directory: %s at a flush, which writes the dump "
                    "(set THUNDERFX_DEBUG_DIR, or ReportingBackend(dump_dir=...))", " and ".join(at_flush),
                    "does" if len(at_flush) == 1 else "do",
                    "it works" if len(at_flush) == 1 else "they work")
    if config.minimize and config.check is CheckLevel.OFF:
        log.warning("thunderfx_debug: THUNDERFX_DEBUG_MINIMIZE=1 shrinks the pieces the correctness sentinel flags, "
                    "and THUNDERFX_DEBUG_CHECK is off: nothing will be minimized (set THUNDERFX_DEBUG_CHECK=split "
                    "or fusion)")
    return config


def setting(field: str, environ: Mapping[str, str] | None = None) -> Any:
    """One setting as the environment (default: os.environ) gives it, else its default, for a command that takes one
    setting of a run (`thunderfx-debug bench`'s THUNDERFX_DEBUG_DEVIATION); a bad value is a ConfigError, as in
    `load_config`.

    Example:
        >>> setting("deviation", {}), setting("deviation", {"THUNDERFX_DEBUG_DEVIATION": "1.5"})
        (1.2, 1.5)
    """
    environ = os.environ if environ is None else environ
    variable, _ = _SETTINGS[field]
    return _from_environ(field, environ) if variable in environ else getattr(Config(), field)


def _from_environ(field: str, environ: Mapping[str, str]) -> Any:
    variable, parse = _SETTINGS[field]
    try:
        return parse(environ[variable])
    except ValueError as e:
        raise ConfigError(f"{variable}={environ[variable]!r} is not valid ({e})") from None


def environ_names() -> dict[str, str]:
    """Setting name -> environment variable, for documentation and the manifest."""
    return {field: variable for field, (variable, _) in _SETTINGS.items()}
