"""A curves panel (``train/curves.py``) as inline SVG: axes with round ticks, a polyline per line,
the evaluations as points, and a tooltip on every point (the SVG ``<title>`` a browser shows on
hover: no script). A chain's stages are marked by a dashed line where each begins. Every text
from a run (its name, a metric's) is escaped."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from xtrain.train.curves import EVAL, SMOOTHED, TRAIN, Line, Panel

WIDTH, HEIGHT = 540, 290
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 14, 40
X_AXIS = "optimizer step"
HOVER_POINTS = 240  # a train line's hover targets, at most (thinned evenly)


@dataclass(frozen=True)
class Style:
    color: str
    kind: str  # TRAIN, SMOOTHED, EVAL

    def attributes(self, faint: bool) -> str:
        if self.kind == EVAL:
            return f'stroke="{self.color}" stroke-width="1.5" stroke-dasharray="5 3"'
        if self.kind == SMOOTHED:
            return f'stroke="{self.color}" stroke-width="2.4"'
        opacity = ' stroke-opacity="0.35"' if faint else ""
        return f'stroke="{self.color}" stroke-width="{1 if faint else 1.6}"{opacity}'


def number(v: float) -> str:
    """A tick's or a tooltip's number: whole numbers as they are, else 4 significant digits."""
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.3g}"
    return f"{v:.4g}"


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values ("nice numbers": 1, 2, 5 times a power of ten) inside [low, high]."""
    raw = (high - low) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    out, v = [], math.ceil(low / step - 1e-9) * step
    while v <= high + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


def _span(low: float, high: float, pad: float) -> tuple[float, float]:
    """The axis's range: the values', widened by ``pad`` of it (one value: around it)."""
    if high <= low:
        return low - (abs(low) or 1.0) / 2, high + (abs(high) or 1.0) / 2
    return low - (high - low) * pad, high + (high - low) * pad


class Frame:
    """Data coordinates to SVG pixels for one panel: steps across (their range exactly), values
    up (a little room above and below; a log scale by decades)."""

    def __init__(self, xs: tuple[float, float], ys: tuple[float, float], log: bool) -> None:
        self.log = log
        self.x0, self.x1 = _span(*xs, 0.0)
        self.xt = ticks(self.x0, self.x1)
        if log:
            self.y0, self.y1 = _span(math.log10(ys[0]), math.log10(ys[1]), 0.05)
            self.yt = [10.0**e for e in range(math.ceil(self.y0), math.floor(self.y1) + 1)]
        else:
            self.y0, self.y1 = _span(*ys, 0.05)
            self.yt = ticks(self.y0, self.y1)

    def x(self, v: float) -> float:
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        v = math.log10(v) if self.log else v
        return HEIGHT - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)

    def axes(self) -> list[str]:
        out = []
        bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
        for v in self.yt:
            y = self.y(v)
            out.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
            out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{number(v)}</text>')
        for v in self.xt:
            x = self.x(v)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}" class="grid"/>')
            out.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{number(v)}</text>')
        out.append(f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" class="box"/>')
        mid = (LEFT + right) / 2
        out.append(f'<text x="{mid:.1f}" y="{HEIGHT - 6}" text-anchor="middle" class="axis">{X_AXIS}</text>')
        return out


def _thinned(points: tuple[tuple[float, float], ...], most: int) -> list[tuple[float, float]]:
    if len(points) <= most:
        return list(points)
    every = len(points) / most
    return [points[int(i * every)] for i in range(most)] + [points[-1]]


def _line(frame: Frame, line: Line, style: Style, faint: bool) -> list[str]:
    pts = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in line.points)
    out = [f'<polyline fill="none" {style.attributes(faint)} points="{pts}"/>']
    if line.kind == SMOOTHED:
        return out  # its train line carries the hover points
    label = escape(line.label)
    shown = line.points if line.kind == EVAL else _thinned(line.points, HOVER_POINTS)
    for x, y in shown:
        tip = f"<title>{label}, step {number(x)}: {number(y)}</title>"
        if line.kind == EVAL or len(line.points) < 3:
            dot = f'r="3.5" fill="{style.color}"'
        else:
            dot = 'r="5" fill="#000" fill-opacity="0" pointer-events="all"'
        out.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" {dot}>{tip}</circle>')
    return out


def chart(panel: Panel, colors: list[str], stages: list[tuple[float, str]] | None = None) -> str:
    """The panel as an ``<svg>``: ``colors[i]`` draws ``panel.lines[i]``; ``stages``: (the step
    a stage begins at, its name) for a chain's stages on one axis, the last one's name empty: the
    step the chain ends at (the axis spans them all)."""
    # from step 0 (the run's start: every panel's steps line up), or a chain's first stage
    xs = [0.0, *(x for line in panel.lines for x, _ in line.points), *(s for s, _ in stages or [])]
    ys = [y for line in panel.lines for _, y in line.points]
    log = panel.log_scale
    frame = Frame((min(xs), max(xs)), (min(ys), max(ys)), log)
    smooth = {(line.run, line.name) for line in panel.lines if line.kind == SMOOTHED}
    body = frame.axes()
    for start, name in stages or []:
        if not name:
            continue
        x = frame.x(start)
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" class="stage"/>')
        body.append(f'<text x="{x + 4:.1f}" y="{TOP + 11}" class="stage-name">{escape(name)}</text>')
    for line, color in zip(panel.lines, colors, strict=True):
        faint = line.kind == TRAIN and (line.run, line.name) in smooth
        body += _line(frame, line, Style(color, line.kind), faint)
    title = escape(panel.title)
    return (
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{title}" xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>'
    )
