"""Small inline SVG charts, built in Python: horizontal bars and a timeline of samples. No scripts, no fonts
beyond the browser's generic families, nothing fetched. Every text that reaches the SVG is escaped here.

Example:
    >>> svg = bar_chart([Bar("graph0 forward", 12.5, "forward"), Bar("graph0 backward", 20.1, "backward")], unit="ms")
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence

#: Colours by series key; unknown keys cycle through PALETTE.
COLOURS = {
    "forward": "#4e79a7", "backward": "#f28e2b", "thunder": "#4e79a7", "inductor": "#e15759", "nvfuser": "#59a14f",
    "torchcompile": "#b07aa1", "thunderfx": "#76b7b2", "outside fusions": "#9c755f", "straggler": "#c0392b",
}
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")

ROW = 20  # px per bar
LABEL_WIDTH = 320
BAR_WIDTH = 420
VALUE_WIDTH = 110


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def colour(key: str, index: int = 0) -> str:
    return COLOURS.get(key, PALETTE[index % len(PALETTE)])


@dataclasses.dataclass(frozen=True)
class Bar:
    """One bar: `label` at its left, `value` its length, `key` picks its colour, `tooltip` shows on hover."""

    label: str
    value: float
    key: str = ""
    tooltip: str = ""
    note: str = ""  # printed after the value, e.g. "23.4%"


def bar_chart(bars: Sequence[Bar], unit: str = "", title: str = "", value_format: str = "{:.3f}") -> str:
    """Horizontal bars scaled to the largest value; labels are cut to fit, full text in the tooltip."""
    if not bars:
        return ""
    top = max(max(b.value for b in bars), 1e-12)
    height = ROW * len(bars) + 8
    width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH
    parts = [_svg_open(width, height, title or "bar chart")]
    keys: list[str] = []
    for i, bar in enumerate(bars):
        if bar.key not in keys:
            keys.append(bar.key)
        y = 4 + i * ROW
        length = max(1.0, BAR_WIDTH * bar.value / top) if bar.value > 0 else 0.0
        tip = bar.tooltip or f"{bar.label}: {value_format.format(bar.value)} {unit}"
        label = bar.label if len(bar.label) <= 44 else bar.label[:20] + "…" + bar.label[-23:]
        value = f"{value_format.format(bar.value)} {unit}".strip() + (f"  {bar.note}" if bar.note else "")
        parts.append(
            f'<g class="bar"><title>{esc(tip)}</title>'
            f'<text x="{LABEL_WIDTH - 6}" y="{y + 14}" text-anchor="end">{esc(label)}</text>'
            f'<rect x="{LABEL_WIDTH}" y="{y + 2}" width="{length:.1f}" height="{ROW - 5}" '
            f'fill="{colour(bar.key, keys.index(bar.key))}"/>'
            f'<text x="{LABEL_WIDTH + length + 4:.1f}" y="{y + 14}">{esc(value)}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


@dataclasses.dataclass(frozen=True)
class Series:
    """A line of the timeline: points (x, y), e.g. (call number, ms)."""

    name: str
    points: tuple[tuple[float, float], ...]


def timeline(series: Sequence[Series], x_label: str = "call", y_label: str = "ms", title: str = "") -> str:
    """Samples over time: one polyline with dots per series, axes with min/max ticks, a legend below."""
    series = [s for s in series if s.points]
    if not series:
        return ""
    width, plot_h, left, top_pad = 860, 220, 70, 10
    legend_rows = (len(series) + 2) // 3
    height = top_pad + plot_h + 40 + legend_rows * 18
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    x0, x1 = min(xs), max(xs)
    y1 = max(ys) * 1.05 or 1.0
    span_x = (x1 - x0) or 1.0
    plot_w = width - left - 20

    def px(x: float) -> float:
        return left + plot_w * ((x - x0) / span_x if x1 > x0 else 0.5)

    def py(y: float) -> float:
        return top_pad + plot_h * (1 - y / y1)

    parts = [_svg_open(width, height, title or "timeline")]
    parts.append(f'<rect x="{left}" y="{top_pad}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>')
    for value in (0.0, y1 / 2, y1):
        parts.append(f'<text x="{left - 4}" y="{py(value) + 4:.1f}" text-anchor="end">{value:.3g}</text>')
    parts.append(f'<text x="{left - 4}" y="{top_pad + plot_h + 30}" text-anchor="end">{esc(y_label)}</text>')
    for value in sorted({x0, x1}):
        parts.append(f'<text x="{px(value):.1f}" y="{top_pad + plot_h + 16}" text-anchor="middle">{value:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{top_pad + plot_h + 30}" text-anchor="middle">'
                 f'{esc(x_label)}</text>')
    for i, s in enumerate(series):
        c = colour(s.name, i) if s.name in COLOURS else PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(s.points))
        parts.append(f'<g class="series"><title>{esc(s.name)}</title>')
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        for x, y in s.points:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{c}">'
                         f'<title>{esc(s.name)}: {y:.3f} {esc(y_label)} at {esc(x_label)} {x:g}</title></circle>')
        parts.append("</g>")
        lx, ly = left + (i % 3) * (plot_w / 3), top_pad + plot_h + 46 + (i // 3) * 18
        name = s.name if len(s.name) <= 40 else s.name[:18] + "…" + s.name[-20:]
        parts.append(f'<rect x="{lx:.1f}" y="{ly - 9}" width="10" height="10" fill="{c}"/>'
                     f'<text x="{lx + 14:.1f}" y="{ly}">{esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_open(width: float, height: float, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width:.0f}" '
            f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">'
            f"<title>{esc(title)}</title>")
