"""The HTML report in a real headless Chromium (Debian's `chromium` package, installed by .ci/run): it renders
without console messages (our page has no script, so any console line is a CSP violation, a blocked load or an
error), its DOM holds the charts, and a screenshot is not blank. Skipped, saying why, without a chromium binary.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from thunderfx_debug.cli import main
from conftest import dump_fixtures

FIXTURES = dump_fixtures()
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)),
                None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install chromium; .ci/run installs it)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--enable-logging=stderr", "--v=0", "--window-size=1280,2000"]


def chromium(page: Path, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, *extra, page.resolve().as_uri()], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def console_messages(stderr: str, page: Path) -> list[str]:
    """The page's console lines in Chromium's log ("INFO:CONSOLE(1)] "msg", source: file:///...")."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line and page.name in line]


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB or RGBA PNG (what Chromium writes), no PIL needed."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - bpp] if x >= bpp else 0
            up, corner = previous[x], previous[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def colours(png: bytes) -> tuple[int, float]:
    """Distinct colours (sampled) and the fraction of pixels that are not white."""
    width, height, rows = decode_png(png)
    bpp = len(rows[0]) // width
    seen, coloured, total = set(), 0, 0
    for row in rows[::3]:
        for x in range(0, width * bpp, 3 * bpp):
            pixel = row[x:x + 3]
            seen.add(pixel)
            coloured += pixel != b"\xff\xff\xff"
            total += 1
    return len(seen), coloured / total


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("pages")
    written = {}
    for name in ("normal", "two_rank"):
        page = out / f"{name}.html"
        assert main(["html", str(FIXTURES / name), "-o", str(page)]) == 0
        written[name] = page
    return written


@pytest.mark.parametrize("name", ["normal", "two_rank"])
def test_renders_without_console_messages_and_has_the_charts(pages, name, tmp_path):
    done = chromium(pages[name], "--dump-dom", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert console_messages(done.stderr, pages[name]) == []
    dom = done.stdout
    charts = re.findall(r'<svg[^>]*class="chart"', dom)
    assert len(charts) >= (6 if name == "two_rank" else 4), len(charts)
    assert dom.count("<rect") > 10 and "<polyline" in dom  # bars and the timeline were parsed as SVG


def test_console_check_catches_an_error(tmp_path):
    """The check above can fail: a page that logs an error and throws is caught."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><p>x</p><script>console.error("probe"); throw new Error("boom")</script>')
    done = chromium(page, "--dump-dom", cwd=tmp_path)
    messages = console_messages(done.stderr, page)
    assert any("probe" in m for m in messages) and any("boom" in m for m in messages)


def test_screenshot_is_not_blank(pages, tmp_path):
    shot = tmp_path / "shot.png"
    done = chromium(pages["two_rank"], f"--screenshot={shot}", "--window-size=900,900", cwd=tmp_path)
    assert shot.is_file(), done.stderr[-2000:]
    distinct, coloured = colours(shot.read_bytes())
    assert distinct >= 8 and coloured > 0.02, (distinct, coloured)
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    blank_shot = tmp_path / "blank.png"
    chromium(blank, f"--screenshot={blank_shot}", "--window-size=900,900", cwd=tmp_path)
    assert colours(blank_shot.read_bytes())[1] < 0.001  # the measure tells a blank page from ours


#: A laptop's screen: the page must fit its width (a chart or table wider than this is cut off at the right edge).
LAPTOP_WIDTH = 1366


def right_edge_colour(png: bytes, margin: int = 10) -> float:
    """The fraction of the screenshot's rows whose last `margin` pixels are not all white: something drawn there
    (content that runs past the right edge of the window is cut there)."""
    width, _, rows = decode_png(png)
    bpp = len(rows[0]) // width
    hit = sum(any(row[x:x + 3] != b"\xff\xff\xff" for x in range((width - margin) * bpp, width * bpp, bpp))
              for row in rows)
    return hit / len(rows)


@pytest.mark.parametrize("name", ["normal", "two_rank"])
def test_at_a_laptops_width_nothing_runs_past_the_right_edge(pages, name, tmp_path):
    shot = tmp_path / "laptop.png"
    chromium(pages[name], f"--screenshot={shot}", f"--window-size={LAPTOP_WIDTH},5000", "--hide-scrollbars",
             cwd=tmp_path)
    assert right_edge_colour(shot.read_bytes()) == 0
    wide = tmp_path / "wide.html"  # the measure catches a page that is too wide
    wide.write_text('<!DOCTYPE html><html><body><table style="width:2400px"><tr><td style="background:#4e79a7">'
                    'x</td></tr></table></body></html>')
    chromium(wide, f"--screenshot={shot}", f"--window-size={LAPTOP_WIDTH},600", "--hide-scrollbars", cwd=tmp_path)
    assert right_edge_colour(shot.read_bytes()) > 0
