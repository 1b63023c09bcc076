"""The HTML report in a real headless Chromium (Debian's `chromium` package, installed by .ci/run): it renders
without console messages (our page has no script, so any console line is a CSP violation, a blocked load or an
error), its DOM holds the charts, a screenshot is not blank, and nothing runs past the right edge of a laptop's
window (1366 px): neither the fixtures' pages nor the page of a real run with dropout and many checked pieces, whose
correctness table is measured in the browser. Skipped, saying why, without a chromium binary.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from thunderfx_debug.commands.cli import main
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


# ---- a real dump of a model with dropout and many pieces, at a laptop's width ---------------------------------------

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

#: Measures the page in the browser and writes what it found into the DOM, for --dump-dom to bring back: the window's
#: width and the page's, each row of the correctness table, the colour of its headline badge and of an alarm badge.
#: It goes into a copy of the page made for the measuring only (the page itself forbids scripts: see render.html).
PROBE = """<script>
addEventListener("load", () => {
  const alarm = document.createElement("span");
  alarm.className = "flag";
  document.body.appendChild(alarm);
  const badge = document.querySelector(".verdict");
  const found = {
    window: innerWidth, page: document.documentElement.scrollWidth,
    rows: [...document.querySelectorAll("table.checks tr")].map(r => r.getBoundingClientRect().height),
    badge: badge ? getComputedStyle(badge).backgroundColor : null, alarm: getComputedStyle(alarm).backgroundColor,
  };
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>"""

#: A row of the correctness table taller than this (about six lines of its text) is mostly empty space.
MAX_ROW_PX = 100


def measure(page: Path, tmp_path: Path) -> dict:
    """What PROBE finds in `page` at LAPTOP_WIDTH x 900."""
    import html
    import json

    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    probed = tmp_path / f"probed_{page.name}"
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    done = chromium(probed, "--dump-dom", f"--window-size={LAPTOP_WIDTH},900", "--hide-scrollbars", cwd=tmp_path)
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout)
    assert found, done.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.fixture(scope="module")
def gpt2_page(tmp_path_factory) -> tuple[Path, Path]:
    """(the page, the dump) of the zoo's tiny GPT-2 with its dropout (benchmarks/zoo.py, as a user runs it): two
    steps on CPU with every call checked at fusion level and every repro script written. ThunderFX splits GPT-2 at
    every Conv1D: 21 checked pieces, of which the dropout's cannot be compared with eager. About 40 s."""
    import importlib.util
    import sys

    if importlib.util.find_spec("transformers") is None:
        pytest.skip("the zoo's models need transformers (pip install transformers)")
    out = tmp_path_factory.mktemp("zoo")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "zoo.py"), "--device", "cpu", "--models", "gpt2-dropout",
                           "--check", "fusion", "--steps", "2", "--no-verify", "--dump", str(out / "dump")],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    dump = out / "dump" / "gpt2-dropout"
    page = out / "gpt2.html"
    assert main(["html", str(dump), "-o", str(page)]) == 0
    return page, dump


def test_a_real_dump_with_many_pieces_reads_at_a_laptops_width(gpt2_page, tmp_path):
    """The correctness table of a run with dropout fits 1366 px without scrolling sideways, its rows are a line or
    three, not a column of words; the headline of a run with no mismatch is not the alarm; each piece links its
    script."""
    from thunderfx_debug import load_report
    from thunderfx_debug.render import correctness

    page, dump = gpt2_page
    pieces = correctness.checked_pieces(load_report(dump))  # the dump is what this test is about
    statuses = [p.status for p in pieces]
    assert len(pieces) >= 15 and "mismatch" not in statuses and "not compared" in statuses, statuses
    found = measure(page, tmp_path)
    assert found["window"] == LAPTOP_WIDTH and found["page"] <= found["window"], found
    rows = found["rows"][1:]  # under the header: a row per piece and a line under those not compared whole
    assert len(rows) >= len(pieces) and max(rows) < MAX_ROW_PX, rows
    assert found["badge"] is not None and found["badge"] != found["alarm"], found
    shot = tmp_path / "laptop.png"
    chromium(page, f"--screenshot={shot}", f"--window-size={LAPTOP_WIDTH},5000", "--hide-scrollbars", cwd=tmp_path)
    assert right_edge_colour(shot.read_bytes()) == 0
    section = page.read_text().split("<h3>Correctness</h3>", 1)[1].split("<h3>", 1)[0]
    links = re.findall(r'<a href="([^"]+)"', section)
    assert len(links) == len(pieces)  # each piece's script (the dump has one for every piece)
    assert all((page.parent / href).resolve().is_file() for href in links), links


def test_a_long_parameter_name_breaks_in_the_correctness_table_and_its_numbers_do_not(tmp_path):
    """A Hugging Face gradient's name is one unbreakable word of a hundred characters: its row breaks it and the
    table still fits a laptop's width, and the error column keeps each number on its line (a row of two or three
    lines at most)."""
    import dataclasses

    from thunderfx_debug import load_report
    from thunderfx_debug.records import Check, SplitKind
    from thunderfx_debug.render.html import render_html

    report = load_report(FIXTURES / "normal" / "rank0")
    name = "grad:model.language_model.layers.0.mlp.experts.gate_up_proj.weight_" + "x" * 60
    check = Check(calls=3, mismatches=2, compared=9, first_mismatch_call=2, worst_call=2, worst_abs_error=1.234e-05,
                  worst_rel_error=4.567e-03, worst_ratio=29.7, rtol=1.3e-6, atol=1e-5, allowed=4.16e-07,
                  worst_output=name, reference="float64 eager")
    graphs = [dataclasses.replace(g, splits=tuple(dataclasses.replace(s, check=check) if s.kind is SplitKind.THUNDER
                                                  else s for s in g.splits)) for g in report.graphs]
    page = tmp_path / "long.html"
    page.write_text(render_html({0: dataclasses.replace(report, graphs=tuple(graphs))}))
    found = measure(page, tmp_path)
    assert found["page"] <= found["window"] == LAPTOP_WIDTH, found
    assert max(found["rows"][1:]) < 60, found["rows"]


def test_the_measure_catches_tall_rows_a_wide_page_and_an_alarm(tmp_path):
    """The measure above can fail: a table whose column of explanations is a few words wide, a page wider than the
    window, an alarm-coloured headline."""
    page = tmp_path / "bad.html"
    words = "forward outputs depend on random ops, which Thunder and eager draw differently; " * 4
    page.write_text('<!DOCTYPE html><html><head><style>.flag{background:#c0392b}</style></head><body>'
                    '<span class="flag verdict">no mismatch</span><table class="checks" style="width:2000px"><tr>'
                    f'<td style="width:1900px">piece</td><td style="width:60px">{words}</td></tr></table>'
                    "</body></html>")
    found = measure(page, tmp_path)
    assert found["page"] > found["window"] and max(found["rows"]) > MAX_ROW_PX and found["badge"] == found["alarm"]
