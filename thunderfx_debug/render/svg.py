"""Small inline SVG charts, built in Python: horizontal bars and a timeline of samples. No scripts, no fonts
beyond the browser's generic families, nothing fetched. Every text that reaches the SVG is escaped here.

Both charts have a labelled value axis with round ticks and a legend of their colours. The timeline keeps its axis
to the bulk of each series: a sample far above the rest of its series (an outlier, `outlier_limit`: a late compile,
an allocator warm-up) is drawn as a triangle at the top edge with its value beside it, instead of squeezing every
other sample into the bottom of the chart.

Example:
    >>> svg = bar_chart([Bar("graph0 forward", 12.5, "forward"), Bar("graph0 backward", 20.1, "backward")], unit="ms")
    >>> nice_ticks(0, 640)
    [0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0]
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
import statistics
from collections.abc import Sequence

from thunderfx_debug.render.text import plural

#: Colours by series key; unknown keys cycle through PALETTE.
COLOURS = {
    "forward": "#4e79a7", "backward": "#f28e2b", "thunder": "#4e79a7", "inductor": "#e15759", "nvfuser": "#59a14f",
    "torchcompile": "#b07aa1", "thunderfx": "#76b7b2", "outside fusions": "#9c755f", "straggler": "#c0392b",
}
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
OUTLIER_COLOUR = "#c0392b"

ROW = 20  # px per bar
LINE = 13  # px per line of a label that takes two
LABEL_WIDTH = 320
LABEL_CHARS = 46  # characters of a bar's label per line (12 px sans-serif in LABEL_WIDTH)
BAR_WIDTH = 420
VALUE_WIDTH = 170
LEGEND_ROW = 18


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def colour(key: str, index: int = 0) -> str:
    return COLOURS.get(key, PALETTE[index % len(PALETTE)])


def label_lines(text: str, limit: int, max_lines: int = 2) -> list[str]:
    """`text` in lines of at most `limit` characters, broken after spaces, underscores, dots and slashes (names such
    as `EXCEPTION_META_THUNDER_sdpa` or `graph0/thunder_0` break there), never inside a word; where it needs more
    than `max_lines`, the last line ends with "…" after a whole word (the full text is in the chart's tooltip).
    Only a single word longer than `limit` is cut inside.

    Example:
        >>> label_lines("kernel compiles seen by Dynamo (torch.compile, inductor backward)", 30)
        ['kernel compiles seen by ', 'Dynamo (torch.compile,…']
        >>> label_lines("EXCEPTION_META_THUNDER torch.nn.functional.scaled_dot_product_attention", 40)
        ['EXCEPTION_META_THUNDER torch.nn.', 'functional.scaled_dot_product_attention']
    """
    if len(text) <= limit:
        return [text]
    # Words end at spaces; a word longer than a line ends at its underscores, dots and slashes too.
    words = [piece for word in re.findall(r"\S+\s*|\s+", text)
             for piece in ([word] if len(word) <= limit else re.findall(r"[^_./]+[_./]*|[_./]+", word))]
    lines: list[str] = []
    current = ""
    for word in words:
        if len(current) + len(word) <= limit or not current:
            current += word
        else:
            lines.append(current)
            current = word
    lines.append(current)
    lines = [line if len(line) <= limit else line[: limit - 1] + "…" for line in lines]
    if len(lines) <= max_lines:
        return lines
    kept, last = lines[: max_lines - 1], lines[max_lines - 1]
    fitted = ""
    for word in re.findall(r"[^\s_./]+[\s_./]*|[\s_./]+", last):
        if len(fitted) + len(word) + 1 > limit:
            break
        fitted += word
    return kept + [(fitted or last[: limit - 1]).rstrip() + "…"]


def _short(text: str, limit: int) -> str:
    """`text` on one line of at most `limit` characters, cut after a whole word (see `label_lines`)."""
    return label_lines(text, limit, max_lines=1)[0]


def nice_ticks(low: float, high: float, count: int = 6, min_step: float = 0.0) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 times a power of ten, at least `min_step`) covering [low, high] with
    about `count` ticks.

    Example:
        >>> nice_ticks(1, 12), nice_ticks(0, 0.37), nice_ticks(2, 5, min_step=1)
        ([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0], [0.0, 0.1, 0.2, 0.3, 0.4], [2.0, 3.0, 4.0, 5.0])
    """
    if not high > low:
        return [float(low)]
    raw = max((high - low) / max(count - 1, 1), min_step)
    power = 10 ** math.floor(math.log10(raw))
    # The round step whose number of intervals comes closest to the one asked for (never below `min_step`).
    steps = [m * power for m in (1, 2, 5, 10) if m * power >= min_step]
    step = min(steps, key=lambda size: abs((high - low) / size - (count - 1)))
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [float(f"{k * step:.10g}") for k in range(first, last + 1)]


def _tick_text(value: float) -> str:
    return f"{value:.4g}"


def _legend(entries: Sequence[tuple[str, str]], x: float, y: float, width: float, per_row: int = 3,
            triangles: Sequence[tuple[str, str]] = ()) -> str:
    """Colour squares (and `triangles`, the outlier mark) with their names, `per_row` to a row from (x, y)."""
    parts = []
    marked = [(name, fill, False) for name, fill in entries] + [(name, fill, True) for name, fill in triangles]
    for i, (name, fill, triangle) in enumerate(marked):
        lx, ly = x + (i % per_row) * (width / per_row), y + (i // per_row) * LEGEND_ROW
        mark = (f'<path d="M{lx:.1f},{ly + 1} L{lx + 10:.1f},{ly + 1} L{lx + 5:.1f},{ly - 9} Z" fill="{fill}"/>'
                if triangle else f'<rect x="{lx:.1f}" y="{ly - 9}" width="10" height="10" fill="{fill}"/>')
        parts.append(f'<g class="legend">{mark}<text x="{lx + 14:.1f}" y="{ly}">{esc(_short(name, 52))}</text></g>')
    return "".join(parts)


def _legend_rows(entries: int, per_row: int = 3) -> int:
    return (entries + per_row - 1) // per_row


@dataclasses.dataclass(frozen=True)
class Bar:
    """One bar: `label` at its left, `value` its length, `key` picks its colour, `tooltip` shows on hover."""

    label: str
    value: float
    key: str = ""
    tooltip: str = ""
    note: str = ""  # printed after the value, e.g. "23.4%"


def bar_chart(bars: Sequence[Bar], unit: str = "", title: str = "", value_format: str = "{:.3f}",
              axis_label: str = "") -> str:
    """Horizontal bars scaled to the largest value, a value axis under them (`axis_label`, default `unit`) and a
    legend of the bar colours; labels are cut to fit, the full text is in the tooltip."""
    if not bars:
        return ""
    whole = all(float(b.value).is_integer() for b in bars)  # counts: no tick between two whole numbers
    ticks = nice_ticks(0.0, max(b.value for b in bars) or 1.0, count=5, min_step=1.0 if whole else 0.0)
    top = ticks[-1]
    keys = list(dict.fromkeys(bar.key for bar in bars))
    # A legend says what the colours mean; where each colour is one bar's own, or every bar's label already names
    # its colour's key, it would only repeat the labels.
    named = all(bar.key and bar.key.lower() in bar.label.lower() for bar in bars)
    one_each = len(bars) > 1 and len(keys) == len(bars)
    legend = [] if named or one_each else [(key, colour(key, i)) for i, key in enumerate(keys) if key]
    labels = [label_lines(bar.label, LABEL_CHARS) for bar in bars]
    row = ROW if all(len(lines) == 1 for lines in labels) else ROW + LINE
    plot_h = row * len(bars) + 4
    values = [f"{value_format.format(b.value)} {unit}".strip() + (f"  {b.note}" if b.note else "") for b in bars]
    # Room right of the bars for the longest value text (about 7 px a character at 12 px sans-serif).
    width = LABEL_WIDTH + BAR_WIDTH + max(VALUE_WIDTH, 7 * max(len(v) for v in values) + 12)
    height = plot_h + 40 + (_legend_rows(len(legend)) * LEGEND_ROW + 6 if legend else 0)
    parts = [_svg_open(width, height, title or "bar chart")]
    for value in ticks:  # grid and tick labels of the value axis
        x = LABEL_WIDTH + BAR_WIDTH * value / top
        parts.append(f'<line x1="{x:.1f}" y1="2" x2="{x:.1f}" y2="{plot_h}" stroke="#e4e4e4"/>'
                     f'<text x="{x:.1f}" y="{plot_h + 14}" text-anchor="middle">{_tick_text(value)}</text>')
    parts.append(f'<line x1="{LABEL_WIDTH}" y1="{plot_h}" x2="{LABEL_WIDTH + BAR_WIDTH}" y2="{plot_h}" stroke="#999"/>')
    parts.append(f'<text class="axis-label" x="{LABEL_WIDTH + BAR_WIDTH / 2:.1f}" y="{plot_h + 30}" '
                 f'text-anchor="middle">{esc(axis_label or unit)}</text>')
    for i, (bar, lines) in enumerate(zip(bars, labels)):
        y = 4 + i * row
        length = max(1.0, BAR_WIDTH * bar.value / top) if bar.value > 0 else 0.0
        tip = bar.tooltip or f"{bar.label}: {value_format.format(bar.value)} {unit}"
        value = f"{value_format.format(bar.value)} {unit}".strip() + (f"  {bar.note}" if bar.note else "")
        first = y + 14 + (row - ROW) / 2 - (LINE / 2 if len(lines) > 1 else 0)
        label = "".join(f'<tspan x="{LABEL_WIDTH - 6}" y="{first + k * LINE:.1f}">{esc(line)}</tspan>'
                        for k, line in enumerate(lines))
        parts.append(
            f'<g class="bar"><title>{esc(tip)}</title>'
            f'<text text-anchor="end">{label}</text>'
            f'<rect x="{LABEL_WIDTH}" y="{y + 2 + (row - ROW) / 2:.1f}" width="{length:.1f}" height="{ROW - 5}" '
            f'fill="{colour(bar.key, keys.index(bar.key))}"/>'
            f'<text x="{LABEL_WIDTH + length + 4:.1f}" y="{y + 14 + (row - ROW) / 2:.1f}">{esc(value)}</text></g>'
        )
    if legend:
        parts.append(_legend(legend, LABEL_WIDTH, plot_h + 52, BAR_WIDTH + VALUE_WIDTH, per_row=4))
    parts.append("</svg>")
    return "".join(parts)


@dataclasses.dataclass(frozen=True)
class Series:
    """A line of the timeline: points (x, y), e.g. (call number, ms)."""

    name: str
    points: tuple[tuple[float, float], ...]


#: Outliers are rare spikes: the largest share of a series' samples (one at least) that may be drawn as outliers.
OUTLIER_SHARE = 0.1


def outlier_limit(values: Sequence[float]) -> float:
    """The value above which a sample of a series is drawn as an outlier: 3 interquartile ranges above the upper
    quartile, and at least 1.5 times that quartile (so that a series of near-equal samples does not mark its
    ordinary jitter). Fewer than 4 samples: none is an outlier; nor where more than one sample and more than
    `OUTLIER_SHARE` of them lie above it (a level the run reached, such as steps three times slower from some call
    on, is drawn on the axis).

    Example (one late compile among steady steps; a fifth of the run at a higher level):
        >>> outlier_limit([1.0, 1.1, 0.9, 1.0, 1.05, 640.0]) < 640
        True
        >>> outlier_limit([1.0, 2.0, 3.0]) == float("inf")
        True
        >>> outlier_limit([1.0] * 8 + [3.0] * 2) == float("inf")
        True
    """
    if len(values) < 4:
        return math.inf
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    limit = max(q3 + 3 * (q3 - q1), 1.5 * q3)
    return math.inf if sum(v > limit for v in values) > max(1.0, OUTLIER_SHARE * len(values)) else limit


#: With `axis_from`, the axis reaches this many times the top of those series (room for the others above them).
AXIS_HEADROOM = 2.0


def timeline(series: Sequence[Series], x_label: str = "call", y_label: str = "ms", title: str = "",
             axis_from: Sequence[str] = ()) -> str:
    """Samples over time: a polyline with dots per series, both axes ticked and labelled (`x_label` under the
    x axis, `y_label` along the y axis), a legend below; outliers (see `outlier_limit`) sit on the top edge.
    `axis_from` names the series whose samples set the axis (up to `AXIS_HEADROOM` times their top): others' points
    above it are outliers too (a p90 spike does not flatten the median's line)."""
    series = [s for s in series if s.points]
    if not series:
        return ""
    width, plot_h, left, top_pad, right = 860, 220, 78, 24, 20
    plot_w = width - left - right
    limits = {s.name: outlier_limit([y for _, y in s.points]) for s in series}
    inliers = [y for s in series for _, y in s.points if y <= limits[s.name]]
    leading = [y for s in series if s.name in axis_from for _, y in s.points if y <= limits[s.name]]
    if leading:
        inliers = [y for y in inliers if y <= AXIS_HEADROOM * max(leading)]
    y_ticks = nice_ticks(0.0, max(inliers, default=0.0) or 1.0, count=5)
    y1 = y_ticks[-1]
    # Outliers of their own series that the other series' range does not already cover.
    outliers = [(s, x, y) for s in series for x, y in s.points if y > y1]
    xs = [x for s in series for x, _ in s.points]
    whole = all(float(x).is_integer() for x in xs)  # call numbers: no tick between two calls
    x_ticks = nice_ticks(min(xs), max(xs), count=8, min_step=1.0 if whole else 0.0)
    x_ticks = [t for t in x_ticks if min(xs) <= t <= max(xs)] or [min(xs)]
    x0, x1 = min(xs), max(xs)
    legend = [(s.name, _series_colour(s.name, i)) for i, s in enumerate(series)]
    marks = [(f"{plural(len(outliers), 'outlier')} above the axis, value beside it", OUTLIER_COLOUR)] if outliers else []
    height = top_pad + plot_h + 44 + _legend_rows(len(legend) + len(marks)) * LEGEND_ROW + 6

    def px(x: float) -> float:
        return left + plot_w * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def py(y: float) -> float:
        return top_pad + plot_h * (1 - min(y, y1) / y1)

    parts = [_svg_open(width, height, title or "timeline")]
    parts.append(f'<rect x="{left}" y="{top_pad}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>')
    for value in y_ticks:
        parts.append(f'<line x1="{left}" y1="{py(value):.1f}" x2="{left + plot_w}" y2="{py(value):.1f}" '
                     f'stroke="#e4e4e4"/><text x="{left - 5}" y="{py(value) + 4:.1f}" text-anchor="end">'
                     f'{_tick_text(value)}</text>')
    for value in x_ticks:
        parts.append(f'<line x1="{px(value):.1f}" y1="{top_pad + plot_h}" x2="{px(value):.1f}" '
                     f'y2="{top_pad + plot_h + 4}" stroke="#999"/><text x="{px(value):.1f}" '
                     f'y="{top_pad + plot_h + 16}" text-anchor="middle">{_tick_text(value)}</text>')
    parts.append(f'<text class="axis-label" x="{left + plot_w / 2:.1f}" y="{top_pad + plot_h + 32}" '
                 f'text-anchor="middle">{esc(x_label)}</text>')
    mid = top_pad + plot_h / 2
    parts.append(f'<text class="axis-label" x="16" y="{mid:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {mid:.1f})">{esc(y_label)}</text>')
    for i, s in enumerate(series):
        c = _series_colour(s.name, i)
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(s.points))
        parts.append(f'<g class="series"><title>{esc(s.name)}</title>')
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        for x, y in s.points:
            if y > y1:
                continue
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{c}">'
                         f'<title>{esc(s.name)}: {y:.3f} {esc(y_label)} at {esc(x_label)} {x:g}</title></circle>')
        parts.append("</g>")
    stacked: dict[int, int] = {}  # outliers at the same call: their values one under the other, in series colours
    for s, x, y in outliers:
        cx = px(x)
        row = stacked.get(round(cx), 0)
        stacked[round(cx)] = row + 1
        fill = _series_colour(s.name, [t.name for t in series].index(s.name))
        parts.append(f'<g class="outlier"><title>{esc(s.name)}: {y:.3f} {esc(y_label)} at {esc(x_label)} {x:g} '
                     f'(outlier, above the axis)</title>'
                     f'<path d="M{cx - 5:.1f},{top_pad + 8} L{cx + 5:.1f},{top_pad + 8} L{cx:.1f},{top_pad} Z" '
                     f'fill="{OUTLIER_COLOUR}"/>'
                     f'<text x="{cx + 7:.1f}" y="{top_pad + 9 + 13 * row}" fill="{fill}">{y:.4g}</text></g>')
    parts.append(_legend(legend, left, top_pad + plot_h + 54, plot_w, triangles=marks))
    parts.append("</svg>")
    return "".join(parts)


def _series_colour(name: str, index: int) -> str:
    return COLOURS[name] if name in COLOURS else PALETTE[index % len(PALETTE)]


def _svg_open(width: float, height: float, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width:.0f}" '
            f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">'
            f"<title>{esc(title)}</title>")
