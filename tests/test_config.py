"""Settings: every bad value is a ConfigError that names the variable (or argument), the value and what is allowed;
the environment wins over constructor arguments; the backend fails before training on an unwritable dump directory.

Most tests call `load_config` with an explicit environment (no Thunder compile); the few that build a
ReportingBackend only import Thunder.
"""

from __future__ import annotations

import logging
import re

from pathlib import Path

import pytest

from faults import read_only_or_skip
from thunderfx_debug.settings.config import (
    CheckLevel,
    Config,
    ConfigError,
    Inputs,
    OnError,
    OWN_OPTIONS,
    TimingLevel,
    environ_names,
    load_config,
    unknown_variables,
)

# variable -> values that must be refused
BAD_VALUES = {
    "THUNDERFX_DEBUG_REPRO": ["yes", "graph,bogus", "none,graph", "all,split", "fusions"],
    "THUNDERFX_DEBUG_INPUTS": ["", "tensors", "metadata", "real,meta"],
    "THUNDERFX_DEBUG_INPUTS_MAX_MB": ["", "-1", "nan", "inf", "lots", "1GB"],
    "THUNDERFX_DEBUG_TIMING": ["", "on", "4", "fusions", "graph,split"],
    "THUNDERFX_DEBUG_TIMING_EVERY": ["", "0", "-3", "2.5", "ten", "1e3"],
    "THUNDERFX_DEBUG_TIMING_WARMUP": ["", "-1", "1.5", "five"],
    "THUNDERFX_DEBUG_RANKS": ["", ",", "-1", "0,x", "all,0", "first"],
    "THUNDERFX_DEBUG_ON_ERROR": ["", "ignore", "fall back", "skip"],
    "THUNDERFX_DEBUG_STRICT": ["", "2", "maybe", "on"],
    "THUNDERFX_DEBUG_NVTX": ["", "2", "enabled"],
    "THUNDERFX_DEBUG_RECOMPILE_WARN": ["", "0", "-1", "many"],
    "THUNDERFX_DEBUG_FLUSH_EVERY": ["", "-1", "nan", "inf", "10m", "never"],
    "THUNDERFX_DEBUG_CHECK": ["", "on", "1", "fusions", "split,fusion", "graph"],
    "THUNDERFX_DEBUG_CHECK_EVERY": ["", "0", "-5", "2.5", "fifty"],
    "THUNDERFX_DEBUG_CHECK_SHARE": ["", "0", "-1", "100.5", "nan", "1%"],
    "THUNDERFX_DEBUG_TIMING_SHARE": ["", "0", "-1", "100.5", "inf", "2 %"],
    "THUNDERFX_DEBUG_TRIAGE": ["", "on", "graph", "fusions", "split,fusion"],
    "THUNDERFX_DEBUG_DEVIATION": ["", "1", "0.8", "-2", "nan", "inf", "20%"],
    "THUNDERFX_DEBUG_MINIMIZE": ["", "2", "on", "split"],
    "THUNDERFX_DEBUG_MINIMIZE_BUDGET": ["", "0", "-1", "nan", "inf", "2m"],
    "THUNDERFX_DEBUG_TRIAGE_TIMEOUT": ["", "0", "-5", "nan", "inf", "ten"],
    "THUNDERFX_DEBUG_DEVICE_MARGIN": ["", "-1", "100.5", "nan", "inf", "25%", "4GiB"],
}

# variable -> (text, field, parsed value)
GOOD_VALUES = [
    ("THUNDERFX_DEBUG_REPRO", "none", "repro", frozenset()),
    ("THUNDERFX_DEBUG_REPRO", "", "repro", frozenset()),
    ("THUNDERFX_DEBUG_REPRO", "ALL", "repro", frozenset({"graph", "split", "fusion"})),
    ("THUNDERFX_DEBUG_REPRO", " split , fusion ", "repro", frozenset({"split", "fusion"})),
    ("THUNDERFX_DEBUG_INPUTS", "Real", "inputs", Inputs.REAL),
    ("THUNDERFX_DEBUG_INPUTS_MAX_MB", "0", "inputs_max_mb", 0.0),
    ("THUNDERFX_DEBUG_INPUTS_MAX_MB", "0.5", "inputs_max_mb", 0.5),
    ("THUNDERFX_DEBUG_TIMING", "off", "timing", TimingLevel.OFF),
    ("THUNDERFX_DEBUG_TIMING", "FUSION", "timing", TimingLevel.FUSION),
    ("THUNDERFX_DEBUG_TIMING_EVERY", " 7 ", "timing_every", 7),
    ("THUNDERFX_DEBUG_TIMING_WARMUP", "0", "timing_warmup", 0),
    ("THUNDERFX_DEBUG_RANKS", "all", "ranks", None),
    ("THUNDERFX_DEBUG_RANKS", "3,0,3", "ranks", frozenset({0, 3})),
    ("THUNDERFX_DEBUG_ON_ERROR", "fallback", "on_error", OnError.FALLBACK),
    ("THUNDERFX_DEBUG_STRICT", "1", "strict", True),
    ("THUNDERFX_DEBUG_STRICT", "false", "strict", False),
    ("THUNDERFX_DEBUG_NVTX", "yes", "nvtx", True),
    ("THUNDERFX_DEBUG_RECOMPILE_WARN", "3", "recompile_warn_threshold", 3),
    ("THUNDERFX_DEBUG_FLUSH_EVERY", "0", "flush_every", 0.0),
    ("THUNDERFX_DEBUG_FLUSH_EVERY", " 600 ", "flush_every", 600.0),
    ("THUNDERFX_DEBUG_FLUSH_EVERY", "0.25", "flush_every", 0.25),
    ("THUNDERFX_DEBUG_CHECK", "off", "check", CheckLevel.OFF),
    ("THUNDERFX_DEBUG_CHECK", " Fusion ", "check", CheckLevel.FUSION),
    ("THUNDERFX_DEBUG_CHECK_EVERY", "1", "check_every", 1),
    ("THUNDERFX_DEBUG_CHECK_SHARE", " 1 ", "check_share", 1.0),
    ("THUNDERFX_DEBUG_CHECK_SHARE", "100", "check_share", 100.0),
    ("THUNDERFX_DEBUG_TIMING_SHARE", "0.5", "timing_share", 0.5),
    ("THUNDERFX_DEBUG_MINIMIZE", "1", "minimize", True),
    ("THUNDERFX_DEBUG_MINIMIZE_BUDGET", " 30.5 ", "minimize_budget", 30.5),
    ("THUNDERFX_DEBUG_TRIAGE_TIMEOUT", "90", "triage_timeout", 90.0),
    ("THUNDERFX_DEBUG_DEVICE_MARGIN", "0", "device_margin", 0.0),
    ("THUNDERFX_DEBUG_DEVICE_MARGIN", " 100 ", "device_margin", 100.0),
]


def test_every_setting_has_bad_values_tested():
    assert set(BAD_VALUES) | {"THUNDERFX_DEBUG_DIR"} == set(environ_names().values())


@pytest.mark.parametrize("variable,value", [(v, x) for v, values in BAD_VALUES.items() for x in values])
def test_bad_environment_value_names_variable_value_and_allowed(variable, value):
    with pytest.raises(ConfigError) as caught:
        load_config({}, environ={variable: value})
    message = str(caught.value)
    assert f"{variable}={value!r}" in message
    assert "allowed:" in message


@pytest.mark.parametrize("variable,value,meant", [
    ("THUNDERFX_DEBUG_REPRO", "splits", "'split'"),
    ("THUNDERFX_DEBUG_REPRO", "graph,fusions", "'fusion'"),
    ("THUNDERFX_DEBUG_TIMING", "fusions", "'fusion'"),
    ("THUNDERFX_DEBUG_INPUTS", "reel", "'real'"),
    ("THUNDERFX_DEBUG_TRIAGE", "spilt", "'split'"),
])
def test_a_value_close_to_an_allowed_one_gets_did_you_mean(variable, value, meant):
    with pytest.raises(ConfigError) as caught:
        load_config({}, environ={variable: value})
    assert str(caught.value).endswith(f"(did you mean {meant}?))"), str(caught.value)


def test_settings_that_work_at_a_flush_say_so_without_a_dump_directory(caplog, tmp_path):
    load_config({}, environ={"THUNDERFX_DEBUG_TRIAGE": "split"})
    assert [r.getMessage() for r in caplog.records] == [
        "thunderfx_debug: THUNDERFX_DEBUG_TRIAGE=split does nothing without a dump directory: it works at a flush, "
        "which writes the dump (set THUNDERFX_DEBUG_DIR, or ReportingBackend(dump_dir=...))"]
    caplog.clear()
    load_config({"repro": "split", "minimize": True, "check": "split"}, environ={})
    assert "THUNDERFX_DEBUG_MINIMIZE=1 and THUNDERFX_DEBUG_REPRO=split do nothing" in caplog.text
    caplog.clear()
    load_config({"dump_dir": tmp_path}, environ={"THUNDERFX_DEBUG_TRIAGE": "split", "THUNDERFX_DEBUG_REPRO": "all"})
    assert not caplog.records


@pytest.mark.parametrize("variable,text,field,expected", GOOD_VALUES)
def test_good_environment_values(variable, text, field, expected):
    assert getattr(load_config({}, environ={variable: text}), field) == expected


def test_defaults_without_arguments_or_environment():
    assert load_config({}, environ={}) == Config()


def test_dump_dir_that_is_a_file_is_refused(tmp_path):
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=rf"THUNDERFX_DEBUG_DIR={re.escape(repr(str(a_file)))}.*allowed: a directory"):
        load_config({}, environ={"THUNDERFX_DEBUG_DIR": str(a_file)})
    with pytest.raises(ConfigError, match=r"ReportingBackend\(dump_dir=.*allowed: a directory"):
        load_config({"dump_dir": a_file}, environ={})


def test_relative_dump_dir_is_made_absolute_when_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config({}, environ={"THUNDERFX_DEBUG_DIR": "dump"}).dump_dir == tmp_path / "dump"
    assert load_config({}, environ={"THUNDERFX_DEBUG_DIR": ""}).dump_dir is None  # empty means unset


@pytest.mark.parametrize(
    "field,argument,variable,text",
    [
        ("timing", "off", "THUNDERFX_DEBUG_TIMING", "fusion"),
        ("timing_every", 3, "THUNDERFX_DEBUG_TIMING_EVERY", "11"),
        ("repro", ["graph"], "THUNDERFX_DEBUG_REPRO", "none"),
        ("ranks", [0], "THUNDERFX_DEBUG_RANKS", "all"),
        ("strict", True, "THUNDERFX_DEBUG_STRICT", "0"),
        ("inputs", "real", "THUNDERFX_DEBUG_INPUTS", "meta"),
        ("dump_dir", "/tmp/from-argument", "THUNDERFX_DEBUG_DIR", "/tmp/from-env"),
    ],
)
def test_environment_wins_over_constructor_argument(field, argument, variable, text):
    from_argument = load_config({field: argument}, environ={})
    from_both = load_config({field: argument}, environ={variable: text})
    from_env = load_config({}, environ={variable: text})
    assert getattr(from_both, field) == getattr(from_env, field) != getattr(from_argument, field)


def test_an_argument_the_environment_overrides_is_warned_about_naming_both(caplog):
    with caplog.at_level("WARNING", logger="thunderfx_debug"):
        load_config({"timing": "split", "timing_every": 10},
                    environ={"THUNDERFX_DEBUG_TIMING": "fusion", "THUNDERFX_DEBUG_TIMING_EVERY": "10"})
    (warning,) = [r.getMessage() for r in caplog.records]  # timing_every agrees: no warning for it
    assert "THUNDERFX_DEBUG_TIMING='fusion' overrides ReportingBackend(timing='split')" in warning


def test_a_bad_constructor_argument_is_ignored_when_the_environment_sets_it():
    # The environment re-points a run without touching code, even code with a value this version refuses.
    assert load_config({"timing": "bogus"}, environ={"THUNDERFX_DEBUG_TIMING": "split"}).timing is TimingLevel.SPLIT


@pytest.mark.parametrize(
    "field,value",
    [
        ("timing", "sometimes"),
        ("timing", 7),
        ("timing_every", 0),
        ("timing_every", 2.5),
        ("timing_every", True),  # a bool is not a count
        ("timing_warmup", -1),
        ("inputs_max_mb", -5),
        ("inputs_max_mb", [1]),
        ("repro", ["graph", "everything"]),
        ("ranks", []),
        ("ranks", [0, -1]),
        ("ranks", {"a"}),
        ("on_error", "ignore"),
        ("strict", "perhaps"),
        ("inputs", object()),
    ],
)
def test_bad_constructor_argument_names_argument_and_value(field, value):
    with pytest.raises(ConfigError) as caught:
        load_config({field: value}, environ={})
    assert f"ReportingBackend({field}=" in str(caught.value)


def test_constructor_arguments_accept_enums_collections_and_paths(tmp_path):
    config = load_config(
        {
            "dump_dir": tmp_path,
            "timing": TimingLevel.SPLIT,
            "inputs": Inputs.REAL,
            "on_error": OnError.FALLBACK,
            "repro": ("graph", "fusion"),
            "ranks": {2, 0},
            "inputs_max_mb": 1,
            "strict": True,
        },
        environ={},
    )
    assert config == Config(
        dump_dir=tmp_path,
        timing=TimingLevel.SPLIT,
        inputs=Inputs.REAL,
        on_error=OnError.FALLBACK,
        repro=frozenset({"graph", "fusion"}),
        ranks=frozenset({0, 2}),
        inputs_max_mb=1.0,
        strict=True,
    )


def test_config_json_is_accepted_back_as_arguments(tmp_path):
    config = load_config({}, environ={"THUNDERFX_DEBUG_DIR": str(tmp_path), "THUNDERFX_DEBUG_RANKS": "1,4",
                                      "THUNDERFX_DEBUG_REPRO": "split", "THUNDERFX_DEBUG_TIMING": "fusion",
                                      "THUNDERFX_DEBUG_NVTX": "1"})
    assert load_config(config.to_json(), environ={}) == config


def test_unknown_own_option_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown thunderfx_debug options \['timming'\]; known: .*'timing'"):
        load_config({"timming": "split"}, environ={})


def test_misspelt_variable_is_warned_about_with_the_closest_name(caplog):
    environ = {"THUNDERFX_DEBUG_TIMMING": "fusion", "THUNDERFX_DEBUG_WHATEVER": "1", "THUNDERFX_DEBUG_TIMING": "off"}
    assert unknown_variables(environ) == {"THUNDERFX_DEBUG_TIMMING": "THUNDERFX_DEBUG_TIMING",
                                          "THUNDERFX_DEBUG_WHATEVER": None}
    with caplog.at_level(logging.WARNING, logger="thunderfx_debug"):
        assert load_config({}, environ=environ).timing is TimingLevel.OFF
    messages = [r.getMessage() for r in caplog.records]
    assert any("THUNDERFX_DEBUG_TIMMING" in m and "did you mean THUNDERFX_DEBUG_TIMING?" in m for m in messages)
    assert any("THUNDERFX_DEBUG_WHATEVER" in m and "known:" in m for m in messages)


def test_every_own_option_has_a_variable():
    assert set(environ_names()) == OWN_OPTIONS


# ---- settings checked when the backend is built (imports Thunder, compiles nothing) --------------------------------


def _backend(**options):
    from conftest import cpu_executors
    from thunderfx_debug import ReportingBackend

    return ReportingBackend(executors=cpu_executors(), **options)


def test_backend_fails_fast_on_a_dump_dir_that_cannot_be_created(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    # A directory under a regular file cannot be created, not even by root.
    monkeypatch.setenv("THUNDERFX_DEBUG_DIR", str(blocker / "dump"))
    with pytest.raises(ConfigError, match=r"THUNDERFX_DEBUG_DIR.*a_file/dump.*cannot be written"):
        _backend()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_dump_dir_in_a_virtual_filesystem_is_refused_for_what_it_is():
    """mkdir under /proc says "No such file or directory" of a folder whose parent plainly exists: the error says
    what that means instead."""
    with pytest.raises(ConfigError, match=r"/proc/thunderfx_debug_dump.*no directory can be made in /proc .*not an "
                                          r"ordinary writable folder"):
        _backend(dump_dir="/proc/thunderfx_debug_dump")


def test_backend_fails_fast_on_a_read_only_dump_dir(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    with read_only_or_skip(dump):
        with pytest.raises(ConfigError, match=r"cannot be written \((Read-only file system|Permission denied)\)"):
            _backend(dump_dir=dump)
    assert list(dump.iterdir()) == []  # the check left nothing behind


def test_backend_environment_wins_and_bad_rank_variable_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("THUNDERFX_DEBUG_TIMING", "off")
    monkeypatch.setenv("THUNDERFX_DEBUG_DIR", str(tmp_path / "from_env"))
    backend = _backend(dump_dir=tmp_path / "from_argument", timing="split", timing_every=9)
    assert backend.config.timing is TimingLevel.OFF and backend.config.timing_every == 9
    assert backend.config.dump_dir == tmp_path / "from_env" and (tmp_path / "from_env").is_dir()
    assert not (tmp_path / "from_argument").exists()
    assert "executors" in backend.thunder_options and "timing" not in backend.thunder_options

    monkeypatch.setenv("THUNDERFX_DEBUG_TIMING", "sideways")
    with pytest.raises(ConfigError, match=r"THUNDERFX_DEBUG_TIMING='sideways'.*allowed: off, graph, split, fusion"):
        _backend()
    monkeypatch.delenv("THUNDERFX_DEBUG_TIMING")
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ConfigError, match=r"RANK='zero' is not a rank"):
        _backend()
