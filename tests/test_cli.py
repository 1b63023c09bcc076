"""`thunderfx-debug summary | html | diff | bench` on the checked-in dump fixtures: they work, and user mistakes
(missing dir, not a dump, damaged JSON, other schema version, a path leaving the dump, unwritable output) end with
one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from thunderfx_debug.commands.cli import build_parser, main
from thunderfx_debug.dump.files import load_report
from conftest import dump_fixtures

FIXTURES = dump_fixtures()
NORMAL = FIXTURES / "normal"
TWO_RANK = FIXTURES / "two_rank"
DAMAGED = FIXTURES / "damaged"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_single_rank(capsys):
    code, out, err = run(capsys, "summary", str(NORMAL))
    assert code == 0 and not err
    report = load_report(NORMAL)
    assert out == str(report)
    assert all(g.compile_id in out for g in report.graphs)


def test_summary_multi_rank_shows_both_ranks(capsys):
    code, out, _ = run(capsys, "summary", str(TWO_RANK))
    assert code == 0
    assert "2 ranks" in out and "rank 1 against rank 0" in out
    code, only_one, _ = run(capsys, "summary", str(TWO_RANK), "--rank", "1")
    assert code == 0 and only_one == str(load_report(TWO_RANK, rank=1))


def test_html_writes_one_self_contained_file(tmp_path, capsys):
    out = tmp_path / "pages" / "report.html"
    code, printed, _ = run(capsys, "html", str(TWO_RANK), "-o", str(out))
    assert code == 0 and printed.strip() == str(out)
    page = out.read_text()
    assert 'id="rank0"' in page and 'id="rank1"' in page
    assert "<script" not in page and "<link" not in page and "@import" not in page
    # Links are relative to the page and resolve to the dump's files.
    hrefs = [h for h in _hrefs(page) if not h.startswith("#")]
    assert hrefs
    for href in hrefs:
        assert not os.path.isabs(href) and (out.parent / href).resolve().is_file(), href


def test_html_default_output_is_in_the_dump(tmp_path, capsys):
    dump = tmp_path / "dump"
    shutil.copytree(NORMAL, dump)
    code, printed, _ = run(capsys, "html", str(dump))
    assert code == 0 and Path(printed.strip()) == dump / "report.html" and (dump / "report.html").is_file()


def _hrefs(page: str) -> list[str]:
    import re
    from urllib.parse import unquote

    return [unquote(h) for h in re.findall(r'href="([^"]*)"', page)]


def test_diff_between_runs(capsys):
    code, out, err = run(capsys, "diff", str(NORMAL), str(TWO_RANK / "rank1"))
    assert code == 0 and not err
    assert "split removed: graph0/inductor_1" in out and "graph removed: graph1" in out
    code, same, _ = run(capsys, "diff", str(NORMAL), str(NORMAL), "--all")
    assert code == 0 and "SLOWER" not in same and "FASTER" not in same and "WITHIN NOISE" in same


def test_bench_triages_earlier_results(tmp_path, capsys, monkeypatch):
    """--results: no script runs, so no GPU needed; the dump gets the script names the results belong to."""
    dump = tmp_path / "dump"
    shutil.copytree(NORMAL, dump)
    graph_json = dump / "rank0" / "graph0" / "graph.json"
    data = json.loads(graph_json.read_text())
    split = next(s for s in data["splits"] if s["name"] == "thunder_0")
    split["files"].update(repro_thunder="graph0/graph0_thunder_0/graph0_thunder_0_repro_thunder.py",
                          repro_inductor="graph0/graph0_thunder_0/graph0_thunder_0_repro_inductor.py")
    fusion = split["fusions"][0]
    fusion.update(name="nvFusion0", executor="nvfuser", files={
        "repro_nvfuser": "graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion0_forward_repro_nvfuser.py",
        "repro_inductor": "graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion0_forward_repro_inductor.py"})
    graph_json.write_text(json.dumps(data))
    out = tmp_path / "triage.md"
    code, text, _ = run(capsys, "bench", str(dump), "--results", str(FIXTURES / "bench_results"), "-o", str(out))
    assert code == 0 and out.read_text() == text
    losses = text.split("## Where ThunderFX loses time")[1]
    assert "graph0/thunder_0/nvFusion0 forward" in losses and "graph0_thunder_0_nvFusion0_forward_repro_nvfuser.py" in losses
    # The scripts to hand over, as the user types them here: below the current directory, relative to it.
    script = "graph0/graph0_thunder_0/fusions/graph0_thunder_0_nvFusion0_forward_repro_nvfuser.py"
    monkeypatch.chdir(tmp_path)
    code, text, _ = run(capsys, "bench", "dump", "--results", str(FIXTURES / "bench_results"), "-o", str(out))
    assert code == 0 and f"`python dump/rank0/{script} --benchmark`" in text
    code, _, err = run(capsys, "bench", str(dump), "--results", str(FIXTURES / "bench_results"), "-o", str(out),
                       "--tolerance", "60%")
    assert code == 0 and "nvFusion0 forward" not in out.read_text().split("## Where ThunderFX loses time")[1].split("##")[0]
    code, text, _ = run(capsys, "bench", str(dump), "--results", str(FIXTURES / "bench_results"), "-o", str(out),
                        "--match", "nvFusion0")
    assert code == 0 and "1 piece compared" in text and "graph0/thunder_0 |" not in text
    code, _, err = run(capsys, "bench", str(dump), "--results", str(FIXTURES / "bench_results"), "--match", "zzz")
    assert code == 2 and "matches 'zzz'" in err


def test_bench_without_scripts_or_cuda_is_a_clear_error(capsys):
    code, _, err = run(capsys, "bench", str(TWO_RANK))  # recorded without repro scripts
    assert code == 2 and "THUNDERFX_DEBUG_REPRO" in err and "Traceback" not in err


def _unwritable(tmp_path: Path) -> str:
    if os.geteuid() == 0:
        return "/proc/thunderfx_debug_cannot_write_here/report.html"  # even root cannot create files in /proc
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return str(locked / "report.html")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["summary", "/nonexistent/dump"], "does not exist"),
        (["summary", "{empty}"], "holds no dump"),
        (["summary", str(DAMAGED / "bad_json")], "not valid JSON"),
        (["html", str(DAMAGED / "bad_json"), "-o", "{tmp}/x.html"], "not valid JSON"),
        (["summary", str(DAMAGED / "wrong_schema")], "schema version 999"),
        (["diff", str(NORMAL), str(DAMAGED / "wrong_schema")], "schema version 999"),
        (["summary", str(DAMAGED / "dotdot")], "'..'"),
        (["html", str(NORMAL), "-o", "{unwritable}"], "cannot write"),
        (["html", str(NORMAL), "-o", "{tmp}"], "is a directory"),
        (["summary", str(NORMAL), "--rank", "7"], "has no dump of rank 7"),
        (["bench", str(NORMAL), "--results", "/nonexistent/results"], None),
        (["bench", str(NORMAL), "--allow-cpu", "--gpus", "0,99"], "99 here; this process sees"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(tmp_path, capsys, argv, expected):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.format(empty=empty, tmp=tmp_path, unwritable=_unwritable(tmp_path)) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"thunderfx-debug {argv[0]}: ")
    if expected:
        assert expected in err


@pytest.mark.parametrize("command", [["summary"], ["html"], ["runs"], ["bench"], ["verify"], ["diff", str(NORMAL)]])
def test_every_command_given_no_dump_says_what_to_pass(tmp_path, capsys, command):
    """A directory with no dump, one that does not exist, and the folder above a dump: each command says what is
    wrong and what to pass instead (the dumps right below, where there are some)."""
    from thunderfx_debug.dump.files import WHAT_TO_PASS

    empty, above = tmp_path / "empty", tmp_path / "runs_of_a_week"
    empty.mkdir()
    shutil.copytree(NORMAL, above / "monday")
    nowhere = tmp_path / "nowhere"
    for path, expected in ((empty, f"{empty} holds no dump"), (nowhere, f"{nowhere} does not exist")):
        code, _, err = run(capsys, *command, str(path))
        assert code == 2 and err.startswith(f"thunderfx-debug {command[0]}: {expected}") and WHAT_TO_PASS in err, err
    code, _, err = run(capsys, *command, str(above))
    assert code == 2 and f"the dumps below it: {above / 'monday'}: pass one of them" in err, err


@pytest.mark.parametrize("argv, expected", [
    (["bench", str(NORMAL), "--tolerance", "lots"], "not a fraction"),
    (["bench", str(NORMAL), "--deviation", "0.9"], "a time ratio > 1"),
    (["bench", str(NORMAL), "--deviation", "1.3", "--tolerance", "0.1"], "not allowed with argument --deviation"),
    (["bench", str(NORMAL), "--gpus", "0,0"], "distinct GPU indices"),
    (["demo", "--steps", "0"], "not a whole number of at least 1"),
    (["summary"], "required: dir"),
    ([], "required: COMMAND"),
    (["sumary", str(NORMAL)], "invalid choice: 'sumary'"),
])
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and expected in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("thunderfx-debug") and "--help" in err


def test_bench_says_a_bad_deviation_setting_before_anything_else(capsys, monkeypatch):
    monkeypatch.setenv("THUNDERFX_DEBUG_DEVIATION", "abc")
    code, _, err = run(capsys, "bench", str(NORMAL), "--results", "/nonexistent/results")
    assert code == 2 and "THUNDERFX_DEBUG_DEVIATION='abc'" in err and "--deviation" in err, err
    monkeypatch.setenv("THUNDERFX_DEBUG_DEVIATION", "1.5")
    code, _, err = run(capsys, "bench", str(NORMAL), "--results", "/nonexistent/results")
    assert code == 2 and "--results /nonexistent/results" in err, err  # a good one lets the next check speak


def test_version_is_the_installed_distributions(capsys):
    import importlib.metadata

    try:
        installed = importlib.metadata.version("thunderfx-debug")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("thunderfx-debug runs from a source tree here, not installed (pip install -e . installs it)")
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"thunderfx-debug {installed}\n"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_demo_on_cuda_without_cuda_is_one_line(capsys):
    code, out, err = run(capsys, "demo", "--device", "cuda")
    assert code == 2 and not out
    assert err.count("\n") == 1 and "--device cuda:" in err and "leave --device out" in err


def test_demo_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, _, err = run(capsys, "demo", "--dir", str(tmp_path / "file"))
    assert code == 2 and err.count("\n") == 1 and "is not a directory" in err


def test_demo_writes_where_dir_says_and_points_to_the_next_commands(tmp_path, capsys, monkeypatch):
    """An explicit --dir wins over THUNDERFX_DEBUG_DIR, with a warning naming both; the dump is complete (it
    loads, and html and diff read it); then the demo names the commands to try next."""
    monkeypatch.setenv("THUNDERFX_DEBUG_DIR", str(tmp_path / "from_env"))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "demo", "--steps", "2", "--dir", "asked", "--no-progress")
    assert code == 0, err
    assert not (tmp_path / "from_env").exists()
    report = load_report(tmp_path / "asked")
    # stdout: the summary, what the demo did (on CPU: the executor it added, which a plain backend lacks), and the
    # commands to try next; stderr: progress and warnings only.
    assert out.startswith(str(report).rstrip("\n") + "\n")
    on_cpu = not __import__("torch").cuda.is_available()
    assert f"trained 2 steps on {'cpu' if on_cpu else 'cuda'}" in out
    assert ("ReportingBackend(executors=[torch_compile_ex" in out) == on_cpu
    assert "next, try:" not in err and "trained" not in err
    assert f"--dir asked overrides THUNDERFX_DEBUG_DIR={tmp_path / 'from_env'}" in err
    # The summary's own "next:" (the page, verify: the dump has every script), then what a demo adds.
    summary_next = str(report)[str(report).index("\nnext:\n"):].splitlines()[2:]
    demo_next = out[out.index("next, try:"):].splitlines()[1:]
    commands = [line.split("#")[0].split() for line in summary_next[:2] + demo_next]
    assert [c[1] for c in commands] == ["html", "verify", "demo", "diff", "bench"]
    asked = str(tmp_path / "asked")
    assert commands[0] == ["thunderfx-debug", "html", asked] and commands[1] == ["thunderfx-debug", "verify", asked]
    for command in commands:  # each one the command line takes as it is printed
        assert build_parser().parse_args(command[1:]).command == command[1]
    assert run(capsys, *commands[0][1:])[0] == 0 and (tmp_path / "asked" / "report.html").is_file()
    assert run(capsys, "diff", "asked", "asked")[0] == 0


def test_console_script_help_and_error():
    """The installed entry point: --help works for every command (and shows no doubled "%%"), and an error reaches
    the shell as status 2."""
    for command in ("demo", "summary", "html", "diff", "bench"):
        done = subprocess.run([sys.executable, "-m", "thunderfx_debug", command, "--help"], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and "usage: thunderfx-debug" in done.stdout
        assert "%%" not in done.stdout, command
    done = subprocess.run([sys.executable, "-m", "thunderfx_debug", "summary", str(DAMAGED / "bad_json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "not valid JSON" in done.stderr


def test_reading_commands_import_neither_torch_nor_thunder(tmp_path):
    """summary, html and diff work on a laptop without torch or thunder: they must not import them."""
    code = (
        "import sys\n"
        "from thunderfx_debug.commands.cli import main\n"
        f"assert main(['summary', {str(TWO_RANK)!r}]) == 0\n"
        f"assert main(['html', {str(TWO_RANK)!r}, '-o', {str(tmp_path / 'r.html')!r}]) == 0\n"
        f"assert main(['diff', {str(NORMAL)!r}, {str(TWO_RANK)!r}]) == 0\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'thunder'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.cuda
def test_bench_on_cuda_runs_nvfuser_and_inductor_scripts(tmp_path, capsys):
    """On a GPU with thunder and nvFuser: a tiny GPT recorded with split and fusion scripts, then bench on one
    split's pieces. Every compared piece must be measured (both scripts wrote their JSON), fusions included."""
    import torch

    from conftest import tiny_gpt, train
    from thunderfx_debug import ReportingBackend

    model, config = tiny_gpt(device="cuda", n_embd=64, block_size=64)
    backend = ReportingBackend(dump_dir=tmp_path / "dump", repro="split,fusion", timing="fusion", timing_every=2,
                               timing_warmup=1)
    train(torch.compile(model, backend=backend), model, config, steps=6, device="cuda")
    rank_dir = backend.flush()
    code, text, err = run(capsys, "bench", str(rank_dir), "--match", "graph0/thunder_0", "--timeout", "300")
    assert code == 0, err
    assert (rank_dir / "bench.md").read_text() == text
    results = sorted(p.name for p in (rank_dir / "bench").glob("*.json"))
    assert any("nvFusion" in name and name.endswith("_repro_nvfuser.json") for name in results), results
    measured = [json.loads((rank_dir / "bench" / name).read_text()) for name in results]
    assert all(m["forward_device_ms"] > 0 for m in measured), measured  # device time, measured on CUDA
    assert "| device |" in text
    assert "## Not measured" not in text, text


def test_bench_resume_runs_only_the_scripts_without_a_result(tmp_path, capsys):
    """An interrupted bench (the device command ran out of time) is resumed: kept results are not run again."""
    from thunderfx_debug.commands import bench

    dump = tmp_path / "dump"
    shutil.copytree(NORMAL, dump)
    rank_dir = dump / "rank0"
    scripts = bench.scripts_of(bench.plan(load_report(rank_dir)))
    assert len(scripts) >= 2
    fake = ("import json, sys\n"
            "open(__file__ + '.ran', 'w').write('x')\n"
            "json.dump({'forward_ms': 2.0}, open(sys.argv[3], 'w'))\n")
    for script in scripts:
        (rank_dir / script).write_text(fake)
    results = tmp_path / "results"
    results.mkdir()
    for script in scripts[1:]:
        (results / bench.result_name(script)).write_text(json.dumps({"forward_ms": 1.0}))
    code, text, err = run(capsys, "bench", str(dump), "--allow-cpu", "--resume", "--results-dir", str(results),
                          "-o", str(tmp_path / "triage.md"))
    assert code == 0, err
    assert f"{len(scripts) - 1} scripts already measured" in err
    ran = sorted(p.name for p in rank_dir.rglob("*.ran"))
    assert ran == [Path(scripts[0]).name + ".ran"]
    assert json.loads((results / bench.result_name(scripts[0])).read_text())["forward_ms"] == 2.0
    assert "2.000 | 1.000 | 2.00x" in text  # the new result against a kept one


def test_bench_times_one_script_per_gpu_at_a_time_on_every_gpu(tmp_path):
    """--gpus: each script runs once, pinned by CUDA_VISIBLE_DEVICES; a GPU never runs two scripts at once, and
    both GPUs work. The scripts report the device they saw as their forward time."""
    import threading
    import time

    from thunderfx_debug.commands import bench

    rank_dir = tmp_path / "rank0"
    rank_dir.mkdir()
    script = ("import json, os, sys, time\n"
              "time.sleep(0.3)\n"
              "json.dump({'forward_ms': float(os.environ['CUDA_VISIBLE_DEVICES'])}, open(sys.argv[3], 'w'))\n")
    names = [f"s{i}.py" for i in range(6)]
    for name in names:
        (rank_dir / name).write_text(script)
    busy, spans, lock = set(), [], threading.Lock()

    def run(name: str, device: str | None) -> bench.ScriptResult:
        with lock:
            assert device not in busy, f"GPU {device} given two scripts at once"
            busy.add(device)
        started = time.monotonic()
        result = bench.run_script(rank_dir, name, tmp_path, timeout_s=60, device=device)
        with lock:
            busy.discard(device)
            spans.append((device, started, time.monotonic()))
        return result

    results = bench.run_all(names + names[:2], run, devices=("3", "5"))  # a repeated script runs once
    assert sorted(results) == names and len(spans) == len(names)
    assert {r.forward_ms for r in results.values()} == {3.0, 5.0}  # the script saw the device it was given
    assert all(r.error is None for r in results.values())
    assert {device for device, _, _ in spans} == {"3", "5"}


def test_bench_warm_up_runs_each_script_once_in_its_folder_and_nothing_outside_the_dump(tmp_path):
    from thunderfx_debug.commands import bench

    rank_dir = tmp_path / "rank0"
    (rank_dir / "graph0").mkdir(parents=True)
    for name, code in (("ok.py", "open('ran', 'a').write('x')"), ("fails.py", "raise SystemExit(1)")):
        (rank_dir / "graph0" / name).write_text(code)
    (tmp_path / "outside.py").write_text("open('ran', 'a').write('x')")
    scripts = ["graph0/ok.py", "graph0/fails.py", "../outside.py", "graph0/missing.py"]
    assert bench.warm_up(rank_dir, scripts, jobs=2, timeout_s=60) == 1
    assert (rank_dir / "graph0" / "ran").read_text() == "x"  # once, in the script's own folder
    assert not (tmp_path / "ran").exists()


def test_demo_dir_precedence(tmp_path, caplog):
    """--dir given: it wins over THUNDERFX_DEBUG_DIR (a warning names both when they differ); not given: the
    variable, else ./thunderfx_debug_demo."""
    from thunderfx_debug.commands.demo import DEFAULT_DIR, demo_dump_dir

    env = {"THUNDERFX_DEBUG_DIR": str(tmp_path / "env")}
    with caplog.at_level("WARNING", logger="thunderfx_debug"):
        assert demo_dump_dir(None, environ=env) == tmp_path / "env"
        assert demo_dump_dir(None, environ={}) == Path(DEFAULT_DIR).absolute()
        assert demo_dump_dir(tmp_path / "env", environ=env) == tmp_path / "env"
        assert caplog.records == []
        assert demo_dump_dir(tmp_path / "flag", environ=env) == tmp_path / "flag"
    (warning,) = caplog.records
    assert f"--dir {tmp_path / 'flag'} overrides THUNDERFX_DEBUG_DIR={tmp_path / 'env'}" in warning.getMessage()
