"""`thunderfx-debug verify`: every script a dump's records list runs in long-lived workers and only those; each
script's verdict is its own RESULT line and exit status; a script that takes its worker down runs again alone, a
slow one is killed at the timeout, and the next script finds the worker as it started (Dynamo's caches, inductor's
settings, the RNG, grad mode, sys.argv); verify.json and verify.md say what each found; exit status 0, 1 or 2.

The scripts here are small stand-ins written over a checked-in dump's repro scripts (real scripts of real runs are
verified in tests/test_zoo.py and tests/test_repro_regions.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import CUDA, dump_fixtures
from thunderfx_debug import load_report
from thunderfx_debug.commands.cli import main

# What a stand-in does, by the script it replaces (the fixture dump lists these 7 scripts).
RESULT = "print('RESULT {line}'); import sys; sys.stdout.flush(); raise SystemExit({status})\n"
STATE = """
import os, sys, torch, torch._dynamo, torch._inductor.config as inductor
print("pid", os.getpid(), "argv", sys.argv[1:], "cwd", os.getcwd() == os.path.dirname(os.path.abspath(__file__)))
print("state", inductor.fallback_random, torch.is_grad_enabled(), torch.get_default_dtype(), torch.rand(1).item())
print("env", os.environ.get("THUNDERFX_DEBUG_REPRO"), os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))
try:
    import thunderfx_debug
except ImportError as e:
    print("import:", e)
# what a script may leave behind
inductor.fallback_random = True
torch.set_grad_enabled(False)
torch.set_default_dtype(torch.float64)
torch.manual_seed(123)
sys.argv.append("--left-behind")
"""
STAND_INS = {
    "graph0/graph0_inductor_1/graph0_inductor_1_repro_inductor.py": STATE + RESULT.format(line="OK (exit 0)", status=0),
    "graph0/graph0_thunder_0/graph0_thunder_0_repro_inductor.py": STATE + RESULT.format(
        line="MISMATCH (exit 1): results differ", status=1),
    "graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py": "import os\nos.abort()\n",
    "graph0/graph0_thunder_2/graph0_thunder_2_repro_inductor.py": STATE + RESULT.format(
        line="NOT COMPARABLE (exit 5): values differ", status=5),
    "graph0/graph0_thunder_2/graph0_thunder_2_repro_thunder.py": STATE + RESULT.format(line="OK (exit 0)", status=0),
    "graph1/graph1_thunder_0/graph1_thunder_0_repro_inductor.py": "import time\ntime.sleep(120)\n",
    "graph1/graph1_thunder_0/graph1_thunder_0_repro_thunder.py": STATE + "print('no verdict')\n",
}
NOT_A_SCRIPT = "open(__file__ + '.ran', 'w').write('executed')\n"  # a trace: must never run


@pytest.fixture
def dump(tmp_path):
    import shutil

    root = tmp_path / "dump"
    shutil.copytree(dump_fixtures() / "normal", root)
    rank = root / "rank0"
    for path, code in STAND_INS.items():  # the fixture lists the scripts and does not keep them
        (rank / path).parent.mkdir(parents=True, exist_ok=True)
        (rank / path).write_text(code)
    for trace in rank.rglob("*_trace.py"):
        trace.write_text(NOT_A_SCRIPT)
    (rank / "graph0" / "stray_repro_thunder.py").write_text(NOT_A_SCRIPT)  # in the dump, listed nowhere
    return root


def _verify(capsys, *args):
    try:
        status = main(["verify", *map(str, args), "--no-progress"])
    except SystemExit as e:  # argparse's errors
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def test_every_listed_script_runs_in_a_shared_worker_and_says_what_it_found(dump, capsys, monkeypatch):
    monkeypatch.setenv("THUNDERFX_DEBUG_REPRO", "all")  # the run's settings do not reach the scripts
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # then the caches go under the dump
    status, out, err = _verify(capsys, dump, "--jobs", "1", "--timeout", "20")
    assert status == 1, err
    data = json.loads((dump / "verify.json").read_text())
    by_name = {Path(s["path"]).name: s for s in data["scripts"]}
    assert set(by_name) == {Path(p).name for p in STAND_INS}  # the listed scripts, nothing else
    assert not list(dump.rglob("*.ran"))  # traces and unlisted files are never executed
    verdicts = {name: (s["verdict"], s["exit_status"], s["ran"]) for name, s in by_name.items()}
    assert verdicts == {
        "graph0_inductor_1_repro_inductor.py": ("OK", 0, "worker"),
        "graph0_thunder_0_repro_inductor.py": ("MISMATCH", 1, "worker"),
        "graph0_thunder_0_repro_thunder.py": ("KILLED", -6, "alone"),  # took its worker down, run again alone
        "graph0_thunder_2_repro_inductor.py": ("NOT_COMPARABLE", 5, "worker"),
        "graph0_thunder_2_repro_thunder.py": ("OK", 0, "worker"),
        "graph1_thunder_0_repro_inductor.py": ("TIMEOUT", None, "timeout"),
        "graph1_thunder_0_repro_thunder.py": ("NO_RESULT", 0, "worker"),
    }
    entry = by_name["graph0_thunder_0_repro_inductor.py"]
    assert entry["line"] == "RESULT MISMATCH (exit 1): results differ"
    assert entry["piece"] == "graph0/thunder_0" and entry["kind"] == "split_inductor"
    assert entry["path"] == "rank0/graph0/graph0_thunder_0/graph0_thunder_0_repro_inductor.py"
    assert "took its worker down" in by_name["graph0_thunder_0_repro_thunder.py"]["note"]
    logs = {name: (dump / s["log"]).read_text() for name, s in by_name.items() if s["verdict"] not in ("KILLED", "TIMEOUT")}
    states = [line for text in logs.values() for line in text.splitlines() if line.startswith("state ")]
    # Every script, the first in a worker or not, finds what a fresh interpreter has, and a generator seeded afresh
    # (not the seed 123 the script before it left).
    import torch

    left_behind = torch.Generator().manual_seed(123)
    draw = f"{torch.rand(1, generator=left_behind).item()}"
    assert len(states) == 5 and all(s.startswith("state False True torch.float32 ") for s in states), states
    assert all(not s.endswith(draw) for s in states)
    for text in logs.values():
        assert "argv [] cwd True" in text and "env None " in text and str(dump / "verify" / "cache") in text
        assert "import: No module named 'thunderfx_debug'" in text
    pids = {line.split()[1] for text in logs.values() for line in text.splitlines() if line.startswith("pid ")}
    assert len(pids) == 3  # one worker before the abort, one after, one after the timeout
    report = (dump / "verify.md").read_text()
    assert report.index("## Failures") < report.index("## Counts")
    assert report.index("MISMATCH") < report.index("TIMEOUT")  # failures first, the worst first
    assert "rerun: `python " in report and "graph0_thunder_0_repro_inductor.py`" in report
    assert "| split_inductor |" in report and out == report
    # Past three failing scripts, how many of each verdict, in the plural.
    assert ("A dump is clean when every script is OK or NOT COMPARABLE: 4 are not (1 MISMATCH, 1 KILLED, 1 TIMEOUT, "
            "1 NO RESULT, listed under Failures).") in report


def test_a_dump_whose_scripts_are_ok_or_not_comparable_verifies_clean(dump, capsys):
    status, out, err = _verify(capsys, dump, "--only", "*thunder_2*", "--only", "graph0/inductor_1")
    assert status == 0, out + err
    assert "A dump is clean when every script is OK or NOT COMPARABLE: this one is." in out
    data = json.loads((dump / "verify.json").read_text())
    assert data["clean"] and {s["verdict"] for s in data["scripts"]} == {"OK", "NOT_COMPARABLE"}
    assert len(data["scripts"]) == 3 and data["counts"]["split_inductor"] == {"NOT_COMPARABLE": 1, "OK": 1}


def test_verdicts_read_as_the_scripts_print_them_and_the_scripts_that_keep_a_dump_from_clean_are_named(dump, capsys):
    """"NOT COMPARABLE" as the scripts print it, in the progress lines and verify.md alike (verify.json keeps the
    token, for programs); one failing script is "1 is not", named with its verdict."""
    status = main(["verify", str(dump), "--only", "*/graph0_thunder_2_repro_inductor.py", "--only",
                   "*/graph0_thunder_0_repro_inductor.py"])
    out, err = capsys.readouterr()  # with progress lines: stderr is no terminal here
    assert status == 1, err
    progress = [line for line in err.splitlines() if line.startswith("verifying: ")]
    assert len(progress) == 2 and any(line.endswith("(graph0_thunder_2_repro_inductor.py: NOT COMPARABLE)")
                                      for line in progress), err
    assert "NOT_COMPARABLE" not in out + err
    assert ("A dump is clean when every script is OK or NOT COMPARABLE: 1 is not "
            "(MISMATCH: rank0/graph0/graph0_thunder_0/graph0_thunder_0_repro_inductor.py).") in out
    assert "| NOT COMPARABLE |" in out.replace(" MISMATCH |", "")
    assert {s["verdict"] for s in json.loads((dump / "verify.json").read_text())["scripts"]} == {
        "MISMATCH", "NOT_COMPARABLE"}


def test_bad_arguments_and_damaged_dumps_are_one_line_and_exit_status_2(dump, capsys, tmp_path):
    rank = dump / "rank0"
    (tmp_path / "empty").mkdir()
    cases = [
        ([tmp_path / "nothing"], "does not exist; pass the THUNDERFX_DEBUG_DIR of a run"),
        ([tmp_path / "empty"], ("holds no dump: no manifest.json in it nor in a rank<N>/ directory under it; pass "
                                "the THUNDERFX_DEBUG_DIR of a run (it holds rank0/, rank1/, ...) or one of its rank "
                                "dirs")),
        ([tmp_path], f"{tmp_path} holds no dump itself; the dumps below it: {dump}: pass one of them"),
        ([dump, "--only", "*nvFusion*"], "no script of"),
        ([dump, "--jobs", "0"], "not a whole number of at least 1"),
        ([dump, "--timeout", "-1"], "give a number of seconds > 0"),
        ([dump, "--rank", "3"], "has no rank 3"),
    ]
    if not CUDA:
        cases.append(([dump, "--gpus", "0"], "no CUDA device"))
    for args, message in cases:
        status, out, err = _verify(capsys, *args)
        assert status == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    # A listed script missing, or replaced by a link to code outside the dump: nothing runs.
    target = rank / "graph0" / "graph0_thunder_2" / "graph0_thunder_2_repro_thunder.py"
    outside = tmp_path / "outside.py"
    outside.write_text(NOT_A_SCRIPT)
    target.unlink()
    status, out, err = _verify(capsys, dump)
    assert status == 2 and "which is missing: the dump is damaged and nothing was run" in err, err
    target.symlink_to(outside)
    status, out, err = _verify(capsys, dump)
    assert status == 2 and "the dump is damaged" in err and not list(tmp_path.rglob("*.ran")), err
    assert not (dump / "verify.json").exists()
    # A damaged record is the loader's one-line error.
    (rank / "graph0" / "graph.json").write_text("{")
    status, out, err = _verify(capsys, dump)
    assert status == 2 and "is damaged: not valid JSON" in err


def test_the_scripts_listed_are_the_records_repro_scripts(dump):
    from thunderfx_debug.commands import verify

    rank = dump / "rank0"
    scripts = verify.scripts_of({rank: load_report(rank)}, dump)
    assert len(scripts) == len(STAND_INS) and all(not s.problem and not s.cuda for s in scripts)
    kinds = {s.kind for s in scripts}
    assert kinds == {"split_inductor", "split_thunder"}
    assert verify.select(scripts, ["graph1/*"]) == [s for s in scripts if s.piece.startswith("graph1/")]


@pytest.mark.cuda
def test_a_device_assert_takes_down_only_its_worker_and_the_script_runs_again_alone(dump, capsys):
    rank = dump / "rank0"
    assert_script = ("import torch\nx = torch.zeros(4, device='cuda')\nx[torch.tensor([9], device='cuda')] = 1\n"
                     "torch.cuda.synchronize()\n")
    (rank / "graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py").write_text(assert_script)
    status, out, err = _verify(capsys, dump, "--only", "graph0/*", "--jobs", "1", "--timeout", "60")
    data = {Path(s["path"]).name: s for s in json.loads((dump / "verify.json").read_text())["scripts"]}
    broken = data["graph0_thunder_0_repro_thunder.py"]
    assert broken["ran"] == "alone" and broken["verdict"] != "OK"
    assert data["graph0_thunder_2_repro_thunder.py"]["verdict"] == "OK"  # the next worker's device is fine


def test_a_dump_given_by_a_relative_path_verifies_as_by_its_absolute_one(dump, capsys, monkeypatch):
    """`thunderfx-debug verify thunderfx_debug_demo`, as the demo suggests: the workers run each script in its own
    folder, and a path relative to where the command was typed still names the script, its log and the caches."""
    monkeypatch.chdir(dump.parent)
    status, out, err = _verify(capsys, dump.name, "--only", "*thunder_2*", "--only", "graph0/inductor_1")
    assert status == 0, out + err
    data = json.loads((dump / "verify.json").read_text())
    assert [s["verdict"] for s in data["scripts"]] == ["OK", "NOT_COMPARABLE", "OK"]
    assert all((dump / s["log"]).read_text().count("state ") == 1 for s in data["scripts"])
