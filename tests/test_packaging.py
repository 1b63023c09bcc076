"""The distributions `python -m build` makes: a wheel with the package, its metadata and the license; an sdist with
the package, the license and the test suite whole (with what the tests need), so that pytest runs from it."""

from __future__ import annotations

import email.parser
import importlib.util
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import thunderfx_debug

ROOT = Path(__file__).resolve().parent.parent


def _source_files(folder: str) -> set[str]:
    """Files of `folder` as the source tree has them, without Python's caches."""
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    if importlib.util.find_spec("build") is None:
        pytest.skip("the build package is not installed (the test extras install it)")
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the test extras' setuptools, no download; the wheel is built from the sdist, as by default.
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return wheel, sdist


def test_wheel_has_the_package_metadata_and_license_only(dists):
    wheel, _ = dists
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
    assert "thunderfx-debug = thunderfx_debug.cli:main" in entry_points
    requires = metadata.get_all("Requires-Dist")
    assert any(r.startswith("lightning-thunder==") for r in requires)
    assert any(r.startswith("tlparse") and 'extra == "test"' in r for r in requires)


def test_sdist_ships_the_tests_whole(dists):
    _, sdist = dists
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/")[0]
        names = {n.removeprefix(root + "/") for n in archive.getnames()}
    for folder in ("tests", "benchmarks", "thunderfx_debug"):
        assert _source_files(folder) <= names, sorted(_source_files(folder) - names)[:10]
    assert {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
