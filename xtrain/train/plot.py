"""A run's curves drawn as one PNG (matplotlib's Agg canvas: no display, no pyplot state): the
panels of ``train/curves.py`` in a grid, two a row. Imported only where a picture is drawn (the
loop's main process at an evaluation and at the end): matplotlib costs ~0.5 s to import."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from xtrain.train.curves import EVAL, SMOOTHED, Panel

if TYPE_CHECKING:
    from matplotlib.axes import Axes

WIDTH, HEIGHT, DPI = 5.6, 3.3, 100  # a panel's inches; 1120 px wide with two a row
TRAIN_COLOR, EVAL_COLOR = "#1f77b4", "#d62728"


PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _draw(ax: Axes, panel: Panel) -> None:
    """One panel: a quantity's train line thin under its smoothed line, its evaluations as
    points joined by dashes; several quantities (a reward function each) a colour each."""
    names = list(dict.fromkeys(line.name for line in panel.lines))
    smooth = any(line.kind == SMOOTHED for line in panel.lines)
    for line in panel.lines:
        xs, ys = [x for x, _ in line.points], [y for _, y in line.points]
        own = PALETTE[names.index(line.name) % len(PALETTE)] if len(names) > 1 else None
        if line.kind == EVAL:
            ax.plot(xs, ys, "o--", color=own or EVAL_COLOR, lw=1.4, ms=5, label=line.label)
        elif line.kind == SMOOTHED:
            ax.plot(xs, ys, "-", color=TRAIN_COLOR, lw=2.2, label=line.label)
        else:
            ax.plot(xs, ys, "-", marker="." if len(xs) < 3 else None, color=own or TRAIN_COLOR,
                    lw=1 if smooth else 1.6, alpha=0.35 if smooth else 1.0, label=line.label)  # fmt: skip
    last = max(x for line in panel.lines for x, _ in line.points)
    pad = max(last, 1.0) * 0.03  # every panel from step 0 (they line up down the grid), its ends seen
    ax.set_xlim(-pad, last + pad)
    ax.set_title(panel.title, fontsize=11)
    ax.set_xlabel("optimizer step", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    if panel.log_scale:
        ax.set_yscale("log")
    else:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useOffset=False)
    if len(panel.lines) > 1:
        ax.legend(fontsize=8, framealpha=0.8)


def png(panels: list[Panel], title: str) -> bytes:
    """The panels in a grid under ``title``, as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 1 if len(panels) == 1 else 2
    rows = max(1, -(-len(panels) // cols))
    fig = Figure(figsize=(WIDTH * cols, HEIGHT * rows + 0.5), dpi=DPI, layout="constrained")
    fig.suptitle(title, fontsize=12)
    grid = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, panel in zip(grid, panels, strict=False):
        _draw(ax, panel)
    for ax in grid[len(panels) :]:
        ax.set_visible(False)
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()
