"""The distributions `python -m build` makes: a wheel with the package, its metadata and the license; an sdist with
the package, the license, the docs the README links to and the test suite whole (with what the tests need, the docs
and .ci/run that tests/test_docs.py reads among it), so that pytest runs from it."""

from __future__ import annotations

import email.parser
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import thunderfx_debug

ROOT = Path(__file__).resolve().parent.parent


def _source_files(root: Path, folder: str) -> set[str]:
    """Files of `folder` as the source tree at `root` has them, without Python's caches."""
    return {p.relative_to(root).as_posix() for p in (root / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")}


def _checkout_with_a_demo_dump(into: Path) -> Path:
    """A copy of the source tree (the files git tracks; all of it, caches aside, in an unpacked sdist) with the dump
    the README's main job leaves in a checkout (`thunderfx-debug demo` writes ./thunderfx_debug_demo) and one a
    benchmark left (./dump): a build must take neither."""
    tree = into / "checkout"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            if name and (ROOT / name).is_file():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, tree / name)
    else:
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", "*.egg-info",
                                                                  "build", "dist"))
    for dump in ("thunderfx_debug_demo", "dump"):
        rank = tree / dump / "rank0" / "graph0"
        rank.mkdir(parents=True)
        (rank.parent / "manifest.json").write_text("{}\n")
        (rank / "graph0_repro_eager.py").write_text("print('a dump, not the package')\n")
    return tree


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    if importlib.util.find_spec("build") is None:
        pytest.skip("the build package is not installed (the test extras install it)")
    work = tmp_path_factory.mktemp("dist")
    tree = _checkout_with_a_demo_dump(work)
    out = work / "out"
    # --no-isolation: the test extras' setuptools, no download; the wheel is built from the sdist, as by default.
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return wheel, sdist, tree


def test_wheel_has_the_package_metadata_and_license_only(dists):
    wheel, _, _ = dists
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
        entry_points = archive.read(metadata_name.replace("METADATA", "entry_points.txt")).decode()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"thunderfx_debug"}
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert metadata["Name"] == "thunderfx-debug" and metadata["Version"] == thunderfx_debug.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3" in classifiers and len(classifiers) >= 8
    assert {url.split(",")[0] for url in metadata.get_all("Project-URL")} >= {"Homepage", "Source", "Issues"}
    assert "thunderfx-debug = thunderfx_debug.commands.cli:main" in entry_points
    requires = metadata.get_all("Requires-Dist")
    assert any(r.startswith("lightning-thunder==") for r in requires)
    assert any(r.startswith("tlparse") and 'extra == "test"' in r for r in requires)


def test_sdist_ships_the_tests_and_the_docs_whole(dists):
    _, sdist, tree = dists
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/")[0]
        names = {n.removeprefix(root + "/") for n in archive.getnames()}
    for folder in ("tests", "benchmarks", "thunderfx_debug", "docs"):
        assert _source_files(tree, folder) <= names, sorted(_source_files(tree, folder) - names)[:10]
    assert any(n.startswith("docs/") and n.endswith(".md") for n in names)
    assert not [n for n in names if n.startswith(("thunderfx_debug_demo/", "dump/"))]
    assert {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in", ".ci/run"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
