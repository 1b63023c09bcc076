"""The README and docs/ say what the code does: every relative link lands on a file (and heading) that exists, every
setting config.py reads is in the README's table with its true default, every command of the CLI's parser is in the
README's command table, the README stays short, its two quick-start commands are the ones .ci/run runs (each in a
venv of its own, which git ignores), and its use example, run as written on CPU, gets fusion regions."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from thunderfx_debug.commands.cli import build_parser
from thunderfx_debug.settings.config import Config, environ_names
from thunderfx_debug.commands.demo import CPU_FUSIONS_NOTE

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 150

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """`text` without fenced code blocks and code spans, where brackets and parentheses are code, not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces become hyphens.

    >>> _anchor("Correctness sentinel (THUNDERFX_DEBUG_CHECK)")
    'correctness-sentinel-thunderfx_debug_check'
    """
    text = _CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} +(.+?) *#*$", _FENCE.sub("", path.read_text()), re.MULTILINE)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in headings:  # a repeated heading gets -1, -2, ... as on GitHub
        anchor = _anchor(heading)
        anchors.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of the markdown file `path` that lead nowhere: to a file that is missing or outside `root`,
    or to a heading its target lacks. Links with a scheme (https:, mailto:) are not followed."""
    broken = []
    for target in _LINK.findall(_prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists() or not resolved.is_relative_to(root.resolve()):
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in _anchors(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return broken


def _section(text: str, heading: str) -> str:
    """The body of the `## heading` section of `text`, up to the next heading of level 2."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def _table(section: str) -> list[list[str]]:
    """The body rows of the first markdown table in `section`, cells stripped (an escaped `\\|` stays in its cell)."""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    cells = [[cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return [row for row in cells[2:]]


def _shown_default(value) -> str:
    """A setting's default as the README's table writes it (from `Config().to_json()`'s form of it)."""
    if value is None:
        return "unset"
    if value == []:
        return "none"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _quick_start_commands() -> list[str]:
    """The README's quick-start commands: the indented code lines of its Quick start section."""
    return [line.strip() for line in _section(README.read_text(), "Quick start").splitlines()
            if line.startswith("    ") and line.strip()]


def _ci_commands() -> list[str]:
    """What .ci/run runs at its top level: its lines that are neither comments, nor inside a block, nor blank."""
    return [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line and not line.startswith(("#", " ", "\t", "fi", "if ", "set ", "cd "))]


def test_every_relative_link_resolves():
    assert DOCS, "no docs/*.md"
    broken = {path.relative_to(ROOT).as_posix(): broken_links(path) for path in [README, *DOCS]}
    assert not {name: links for name, links in broken.items() if links}


def test_the_link_check_finds_a_broken_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Some `code` here\n")
    readme = tmp_path / "README.md"
    readme.write_text("[ok](docs/page.md) [ok](docs/page.md#some-code-here) [ok](#top) [ok](https://x.invalid/y)\n"
                      "`[code](not/a/link.md)`\n\n```\n[code](nor/this.md)\n```\n\n# Top\n"
                      "[gone](docs/gone.md) [no heading](docs/page.md#a-heading-it-lacks) [out](../outside.md)\n")
    (tmp_path.parent / "outside.md").write_text("# outside the root\n")
    assert broken_links(readme, root=tmp_path) == [
        "docs/gone.md: no such file", "docs/page.md#a-heading-it-lacks: no heading #a-heading-it-lacks in page.md",
        "../outside.md: no such file"]


def test_readme_links_every_docs_page():
    targets = _LINK.findall(_prose(README.read_text()))
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in targets}
    assert [path.name for path in DOCS if path.resolve() not in linked] == []


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the details belong in docs/"


def test_readme_settings_table_has_every_setting_with_its_true_default():
    rows = {row[0]: row for row in _table(_section(README.read_text(), "Settings"))}
    variables = environ_names()
    assert sorted(rows) == sorted(variables.values())
    defaults = Config().to_json()
    wrong = {variable: (rows[variable][-1], _shown_default(defaults[field])) for field, variable in variables.items()
             if rows[variable][-1].strip("`") != _shown_default(defaults[field])}
    assert not wrong, f"README default, config.py's default: {wrong}"
    assert all(len(row) == 3 and row[1] for row in rows.values())


def test_docs_settings_page_says_what_every_setting_takes():
    rows = {row[0] for row in _table(_section((ROOT / "docs" / "settings.md").read_text(), "What each variable takes"))}
    assert rows == set(environ_names().values())


def test_readme_command_table_has_every_command_of_the_parser():
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for text in (_section(README.read_text(), "Commands"), (ROOT / "docs" / "dump-and-commands.md").read_text()):
        listed = {row[0].strip("`").split()[1] for row in _table(text) if row[0].startswith("`thunderfx-debug ")}
        assert listed == set(commands.choices)


def test_quick_start_commands_are_the_ones_ci_runs():
    """Two commands, the main job and the tests, each found whole in .ci/run (a line that is the command, or the
    command and `|| exit 1`), in the README's order; each makes and activates a venv of its own."""
    readme, ci = _quick_start_commands(), _ci_commands()
    assert len(readme) == 2, readme
    demo, tests = readme
    assert demo.endswith("&& thunderfx-debug demo") and 'pip install -e ".[demo]"' in demo
    assert tests.endswith("&& python -m pytest -q -n 2 --dist loadfile") and 'pip install -e ".[test]"' in tests
    ran = [next((i for i, line in enumerate(ci) if line in (command, command + " || exit 1")), None)
           for command in readme]
    assert None not in ran, f".ci/run runs {ci}, the README says {readme}"
    assert ran == sorted(ran)
    venvs = [re.match(r"python3 -m venv (\S+) && \. (\S+)/bin/activate && ", command).groups() for command in readme]
    assert all(made == activated for made, activated in venvs) and venvs[0][0] != venvs[1][0], venvs


def test_quick_start_venvs_are_ignored_by_git():
    ignore = ROOT / ".gitignore"
    if not ignore.is_file():
        pytest.skip("no .gitignore: not a checkout (an unpacked sdist)")
    ignored = ignore.read_text().splitlines()
    for command in _quick_start_commands():
        venv = re.match(r"python3 -m venv (\S+)", command).group(1)
        assert f"/{venv}/" in ignored or f"{venv}/" in ignored, venv


def test_use_example_shows_the_cpu_executor_line_the_demo_prints():
    use = _section(README.read_text(), "Use")
    note = [line.strip() for line in CPU_FUSIONS_NOTE.splitlines()[1:]]  # the import and the backend line
    assert note[0] in use
    assert note[1].partition("= ")[2] in use  # ReportingBackend(executors=[torch_compile_ex, ...])


def test_use_example_runs_as_written_and_fuses_on_cpu(tmp_path):
    """The README's use example, with a model defined before it and a step after, in a fresh interpreter: it trains,
    and the torch.compile executor's fusion regions are in the report."""
    (block,) = re.findall(r"^```python\n(.*?)^```", _section(README.read_text(), "Use"), re.MULTILINE | re.DOTALL)
    assert len(block.strip().splitlines()) <= 5, block
    code = textwrap.dedent("""\
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        """) + block + textwrap.dedent("""\
        model(torch.randn(4, 8)).square().mean().backward()
        fusions = [f.name for g in backend.report().graphs for s in g.splits for f in s.fusions]
        print("FUSIONS", fusions)
        """)
    environ = {name: value for name, value in os.environ.items() if not name.startswith("THUNDERFX_DEBUG_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**environ, "THUNDERFX_DEBUG_STRICT": "1"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("FUSIONS")]
    assert "TorchCompile" in line, line
