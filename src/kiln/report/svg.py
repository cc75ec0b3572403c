"""Charts as inline SVG strings: lines (with event markers) and horizontal bars, no scripts.

The report page must open offline and stay small, so charts are drawn here as plain SVG elements
with `<title>` tooltips rather than by a charting library. Series arrive already downsampled
(kiln.report.series); a chart draws what it is given. Axis ticks are "nice" numbers (1, 2, 5 x
10^k); a log axis is used where asked and only for positive values.
Not handled here: interaction (zoom, hover lines), stacked areas, dates on the x axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

# Colours that stay apart for the first ten series (a colour-blind-safe set) and then repeat.
PALETTE = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#000000", "#ee8866", "#44bb99")
WIDTH, HEIGHT = 720, 260
FEW_POINTS = 20  # series this short get a dot at each point
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 24, 36


@dataclass(frozen=True)
class Series:
    name: str
    x: Sequence[float]
    y: Sequence[float]
    dashed: bool = False


@dataclass(frozen=True)
class Marker:
    """A vertical line at x (a rollback, a loss spike) with its label as a tooltip."""

    x: float
    label: str
    colour: str = "#cc3311"


@dataclass
class Bars:
    """One group of horizontal bars: label -> value per series name (None: no bar, as for a step a source skips)."""

    labels: list[str]
    values: dict[str, list[float | None]] = field(default_factory=dict)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round values covering [low, high]: 0, 0.5, 1, ... or 0, 2000, 4000 ..."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        return [low]
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def log_ticks(low: float, high: float) -> list[float]:
    """Ticks for a log axis spanning 10^low to 10^high: 1, 2, 5 x 10^k, or only the powers of ten past 8 ticks."""
    ticks = [
        m * 10.0**k
        for k in range(math.floor(low), math.ceil(high) + 1)
        for m in (1, 2, 5)
        if low <= math.log10(m * 10.0**k) <= high
    ]
    return [t for t in ticks if math.log10(t).is_integer()] if len(ticks) > 8 else ticks


def tick_labels(ticks: list[float]) -> list[str]:
    """Short labels (fmt), or as many decimals as the tick spacing needs when short ones would repeat (61.2k, 61.2k)."""
    short = [fmt(t) for t in ticks]
    if len(set(short)) == len(short) or len(ticks) < 2:
        return short
    decimals = max(0, -math.floor(math.log10(min(b - a for a, b in zip(ticks, ticks[1:], strict=False)))))
    return [f"{t:.{decimals}f}" for t in ticks]


def fmt(value: float) -> str:
    """A tick label: 12k, 3.5M, 0.25, 1e-05."""
    v = abs(value)
    if v == 0:
        return "0"
    if v >= 1e9:
        return f"{value / 1e9:.3g}G"
    if v >= 1e6:
        return f"{value / 1e6:.3g}M"
    if v >= 1e4:
        return f"{value / 1e3:.3g}k"
    if v < 1e-3:
        return f"{value:.0e}"
    return f"{value:.4g}"


def line_chart(
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    markers: Sequence[Marker] = (),
    log_y: bool = False,
) -> str:
    """An SVG line chart; an empty string when no series has a point (the caller says why)."""
    drawn = [s for s in series if len(s.x)]
    if not drawn:
        return ""

    def visible(y: float) -> bool:  # a log axis has no place for 0 or below
        return math.isfinite(y) and (y > 0 or not log_y)

    ys = [y for s in drawn for y in s.y if visible(y)]
    xs = [x for s in drawn for x in s.x]
    if not ys:
        return ""
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if log_y:
        y0, y1 = math.log10(y0), math.log10(y1)
    if y1 == y0:  # a flat series: a band of 10% around it (or +-0.5 around 0)
        half = abs(y0) * 0.1 or 0.5
        y0, y1 = y0 - half, y1 + half
    if x1 == x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def px(x: float) -> float:
        return MARGIN_LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        v = math.log10(y) if log_y else y
        return MARGIN_TOP + (1 - (v - y0) / (y1 - y0)) * plot_h

    parts = [_frame(title, x_label, y_label)]
    for tick in nice_ticks(x0, x1):
        parts.append(
            f'<line class="grid" x1="{px(tick):.1f}" x2="{px(tick):.1f}" y1="{MARGIN_TOP}" '
            f'y2="{MARGIN_TOP + plot_h}"/><text class="tick" x="{px(tick):.1f}" y="{HEIGHT - MARGIN_BOTTOM + 14}" '
            f'text-anchor="middle">{fmt(tick)}</text>'
        )
    y_ticks = log_ticks(y0, y1) if log_y else nice_ticks(y0, y1)
    for tick, label in zip(y_ticks, tick_labels(y_ticks), strict=True):
        parts.append(
            f'<line class="grid" x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" y1="{py(tick):.1f}" '
            f'y2="{py(tick):.1f}"/><text class="tick" x="{MARGIN_LEFT - 4}" y="{py(tick) + 4:.1f}" '
            f'text-anchor="end">{label}</text>'
        )
    for i, s in enumerate(drawn):
        colour = PALETTE[i % len(PALETTE)]
        shown = [(px(x), py(y)) for x, y in zip(s.x, s.y, strict=True) if visible(y)]
        if not shown:
            continue
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in shown)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        if len(shown) == 1:  # one point draws no line: show it as a dot
            parts.append(
                f'<circle class="series" cx="{shown[0][0]:.1f}" cy="{shown[0][1]:.1f}" r="3" '
                f'fill="{colour}"><title>{escape(s.name)}</title></circle>'
            )
        else:
            parts.append(
                f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
                f'points="{points}"><title>{escape(s.name)}</title></polyline>'
            )
            if len(shown) <= FEW_POINTS:  # a line through a few measurements (evaluations) shows where they are
                parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>' for x, y in shown]
    for m in markers:
        if x0 <= m.x <= x1:
            parts.append(
                f'<line class="marker" x1="{px(m.x):.1f}" x2="{px(m.x):.1f}" y1="{MARGIN_TOP}" '
                f'y2="{MARGIN_TOP + plot_h}" stroke="{m.colour}" '
                f'stroke-width="1.5"><title>{escape(m.label)}</title></line>'
            )
    parts.append(_legend([(s.name, PALETTE[i % len(PALETTE)]) for i, s in enumerate(drawn)]))
    return _svg(title, "".join(parts))


def bar_chart(title: str, bars: Bars, value_label: str) -> str:
    """Horizontal bars, one row per label and one bar per series in it; empty when nothing to draw."""
    names = list(bars.values)
    if not bars.labels or not names:
        return ""
    top = max((v for vals in bars.values.values() for v in vals if v is not None), default=0) or 1
    row_h = 6 + 10 * len(names)
    label_w = min(260, 12 + 7 * max(len(label) for label in bars.labels))
    plot_w = WIDTH - label_w - MARGIN_RIGHT - 60
    height = MARGIN_TOP + row_h * len(bars.labels) + MARGIN_BOTTOM
    parts = [f'<text class="title" x="{WIDTH / 2}" y="14" text-anchor="middle">{escape(title)}</text>']
    for r, label in enumerate(bars.labels):
        y = MARGIN_TOP + r * row_h
        parts.append(
            f'<text class="tick" x="{label_w - 6}" y="{y + row_h / 2 + 3:.1f}" text-anchor="end">{escape(label)}</text>'
        )
        for i, name in enumerate(names):
            value = bars.values[name][r]
            if value is None:
                continue
            w = max(value / top * plot_w, 0.5 if value else 0)
            colour = PALETTE[i % len(PALETTE)]
            parts.append(
                f'<rect class="bar" x="{label_w}" y="{y + 3 + i * 10}" width="{w:.1f}" height="8" '
                f'fill="{colour}"><title>{escape(name)} {escape(label)}: {value:,.6g}</title></rect>'
                f'<text class="tick" x="{label_w + w + 4:.1f}" y="{y + 10 + i * 10}">{fmt(value)}</text>'
            )
    parts.append(
        f'<text class="axis" x="{label_w + plot_w / 2:.1f}" y="{height - 8}" '
        f'text-anchor="middle">{escape(value_label)}</text>'
    )
    if len(names) > 1:
        parts.append(_legend([(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)], y=height - 22))
    return _svg(title, "".join(parts), height)


def _frame(title: str, x_label: str, y_label: str) -> str:
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    return (
        f'<text class="title" x="{WIDTH / 2}" y="14" text-anchor="middle">{escape(title)}</text>'
        f'<rect class="plot" x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{WIDTH - MARGIN_LEFT - MARGIN_RIGHT}" '
        f'height="{plot_h}"/>'
        f'<text class="axis" x="{MARGIN_LEFT + (WIDTH - MARGIN_LEFT - MARGIN_RIGHT) / 2}" y="{HEIGHT - 4}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
        f'<text class="axis" transform="translate(12 {MARGIN_TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )


def _legend(entries: list[tuple[str, str]], y: float = MARGIN_TOP + 4) -> str:
    if len(entries) < 2:
        return ""
    parts, x = [], MARGIN_LEFT + 8
    for i, (name, colour) in enumerate(entries):
        width = 24 + 6 * len(name)
        if x + width > WIDTH - MARGIN_RIGHT - 60:  # what does not fit is named by its tooltip only
            parts.append(f'<text class="legend" x="{x}" y="{y + 5}">+{len(entries) - i} more</text>')
            break
        parts.append(
            f'<rect x="{x}" y="{y}" width="10" height="3" fill="{colour}"/><text class="legend" x="{x + 13}" '
            f'y="{y + 5}">{escape(name)}</text>'
        )
        x += width
    return "".join(parts)


def _svg(title: str, body: str, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" xmlns="http://www.w3.org/2000/svg">{body}</svg>'
    )
