"""Small inline SVG charts for the HTML run report: no scripts, fonts or files outside the
page, so the report opens anywhere (an air-gapped cluster, an attachment to a ticket)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["PALETTE", "Series", "chart"]

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip

W, H = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 56, 14, 30


@dataclass(frozen=True)
class Series:
    """One curve: a label, y per x, a colour; ``kind`` line, area (stacked) or bars."""

    label: str
    ys: Sequence[float]
    color: str
    kind: str = "line"


def _nice_max(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above ``v``."""
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    return next(step * mag for step in (1, 2, 2.5, 5, 10) if step * mag >= v)


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == 0 else f"{v:.2g}"


def chart(
    xs: Sequence[float],
    series: Sequence[Series],
    *,
    title: str,
    y_label: str,
    y_max: float | None = None,
    right: Sequence[Series] = (),
    right_label: str = "",
) -> str:
    """One SVG: ``series`` on the left axis (areas stacked in order), ``right`` (bars or
    lines) on a right axis of their own; x in seconds since the run started."""
    n = len(xs)
    x_max = (xs[-1] + (xs[1] - xs[0] if n > 1 else 1.0)) if n else 1.0
    stacked = [0.0] * n
    tops: list[list[float]] = []
    for s in series:
        if s.kind == "area":
            stacked = [a + b for a, b in zip(stacked, s.ys, strict=True)]
            tops.append(list(stacked))
        else:
            tops.append(list(s.ys))
    peak = max((v for t in tops for v in t), default=0.0)
    y_top = y_max if y_max is not None else _nice_max(peak)
    r_peak = max((v for s in right for v in s.ys), default=0.0)
    r_top = _nice_max(r_peak)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + pw * x / x_max

    def py(y: float, top: float) -> float:
        return TOP + ph * (1 - min(max(y / top, 0.0), 1.0))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 22}" '
        f'viewBox="0 0 {W} {H + 22}" role="img" aria-label="{escape(title)}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for i in range(5):
        y = y_top * i / 4
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(y, y_top):.1f}" y2="{py(y, y_top):.1f}" '
            f'stroke="#e4e4e4"/><text x="{LEFT - 4}" y="{py(y, y_top) + 4:.1f}" '
            f'text-anchor="end" font-size="10">{_fmt(y)}</text>'
        )
        if right:
            r = r_top * i / 4
            out.append(
                f'<text x="{LEFT + pw + 4}" y="{py(r, r_top) + 4:.1f}" font-size="10" '
                f'fill="#555">{_fmt(r)}</text>'
            )
    for i in range(6):
        x = x_max * i / 5
        out.append(
            f'<text x="{px(x):.1f}" y="{TOP + ph + 14}" text-anchor="middle" '
            f'font-size="10">{_fmt(x)} s</text>'
        )
    bar_w = max(pw / max(n, 1) * 0.8, 1.0)
    for s in right:
        if s.kind == "bars":
            for x, v in zip(xs, s.ys, strict=True):
                if v > 0:
                    y = py(v, r_top)
                    out.append(
                        f'<rect class="bar" x="{px(x):.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                        f'height="{TOP + ph - y:.1f}" fill="{s.color}" fill-opacity="0.45"/>'
                    )
        else:
            out.append(_polyline(xs, s.ys, s.color, px, lambda v: py(v, r_top), dash=True))
    below = [0.0] * n
    for s, top in zip(series, tops, strict=True):
        if s.kind == "area" and n:
            upper = [f"{px(x):.1f},{py(v, y_top):.1f}" for x, v in zip(xs, top, strict=True)]
            lower = [
                f"{px(x):.1f},{py(v, y_top):.1f}"
                for x, v in reversed(list(zip(xs, below, strict=True)))
            ]
            out.append(
                f'<polygon points="{" ".join(upper + lower)}" fill="{s.color}" '
                f'fill-opacity="0.75" stroke="none"/>'
            )
            below = top
        else:
            out.append(_polyline(xs, s.ys, s.color, px, lambda v: py(v, y_top)))
    legend = [*series, *right]
    lx = LEFT
    for s in legend:
        out.append(
            f'<rect x="{lx}" y="{H + 8}" width="10" height="10" fill="{s.color}"/>'
            f'<text x="{lx + 14}" y="{H + 17}" font-size="11">{escape(s.label)}</text>'
        )
        lx += 24 + 7 * len(s.label)
    out.append(
        f'<text x="12" y="{TOP + ph / 2:.0f}" font-size="11" transform="rotate(-90 12 '
        f'{TOP + ph / 2:.0f})" text-anchor="middle">{escape(y_label)}</text>'
    )
    if right_label:
        out.append(
            f'<text x="{W - 8}" y="{TOP + ph / 2:.0f}" font-size="11" transform="rotate(90 '
            f'{W - 8} {TOP + ph / 2:.0f})" text-anchor="middle">{escape(right_label)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _polyline(
    xs: Sequence[float],
    ys: Sequence[float],
    color: str,
    px: Callable[[float], float],
    py: Callable[[float], float],
    *,
    dash: bool = False,
) -> str:
    points = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, ys, strict=True))
    style = ' stroke-dasharray="4 3"' if dash else ""
    return f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5"{style}/>'
