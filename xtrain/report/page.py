"""``xtrain report``'s page: one self-contained HTML file (its style inline; no script, no font,
no image or link it would fetch), so it opens from disk in any browser, offline, on Windows too.
Sections: the lineage, the plan, the data check, the curves (inline SVG, a tooltip on every
point; several runs overlaid, a chain's stages one after another on one axis), the evaluation
before and after, the benchmark scores (lm-eval's, against the base or the start), the sample
answers. Where it is written: ``output_path`` (never over a file the report did not write,
unless told)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from xtrain import __version__, atomic, tasks
from xtrain.errors import XtrainError
from xtrain.report import sections
from xtrain.report.html import Raw, join, note, section, tag
from xtrain.report.runs import RunView
from xtrain.report.samples import samples
from xtrain.report.svg import chart
from xtrain.train.curves import EVAL, Line, Panel, panels

GENERATOR = '<meta name="generator" content="xtrain report">'  # how a page it wrote is known again
REPORT = "report.html"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
TRAIN_COLOR, EVAL_COLOR = "#1f77b4", "#d62728"
SECTIONS = (("lineage", "Lineage"), ("plan", "Plan"), ("data", "Data check"), ("curves", "Curves"),
            ("evaluation", "Evaluation"), ("benchmarks", "Benchmarks"),
            ("samples", "Sample answers"))  # fmt: skip

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1d1d1f;
margin:0 auto;max-width:1180px;padding:0 20px 40px;background:#fff}
h1{font-size:24px;margin:24px 0 4px}h2{font-size:19px;margin:32px 0 10px;border-bottom:1px solid #ddd;
padding-bottom:4px}h3{font-size:16px;margin:18px 0 6px}
nav a{margin-right:14px}code,pre{font:13px/1.4 ui-monospace,Consolas,"DejaVu Sans Mono",monospace}
pre.example{white-space:pre-wrap;word-break:break-word;background:#f6f6f8;padding:10px;border-radius:6px}
mark{background:#c8f0c8;text-decoration:underline}table{border-collapse:collapse;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top;word-break:break-word}
thead th{background:#f3f3f5}table.plan td:first-child{white-space:nowrap;font-weight:600}
table.samples td{max-width:380px}.note,.dim{color:#666}.warn{color:#a15c00}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:18px}
figure{margin:0;border:1px solid #e4e4e8;border-radius:6px;padding:8px}
figcaption{font-weight:600;margin:0 0 4px 4px}
svg{max-width:100%;height:auto}svg text{font:11px system-ui,sans-serif;fill:#444}svg .axis{font-size:12px}
svg .grid{stroke:#e6e6e6}svg .box{fill:none;stroke:#bbb}svg .stage{stroke:#888;stroke-dasharray:4 4}
svg .stage-name{font-size:11px;fill:#555}
.legend{font-size:12px;margin:2px 4px}.legend span{margin-right:12px;white-space:nowrap}
.swatch{display:inline-block;width:18px;height:0;border-top:3px solid;vertical-align:middle;margin-right:4px}
.call{font-size:13px}.reward{color:#555;font-size:13px}footer{margin-top:36px;color:#888;font-size:13px}
"""


def _stages(runs: list[RunView], chained: bool) -> list[float]:
    """Where each run's steps start on the shared axis: a chain's stages one after another."""
    starts, at = [], 0.0
    for run in runs:
        starts.append(at if chained else 0.0)
        at += run.steps
    return starts


def merged_panels(runs: list[RunView], chained: bool) -> list[Panel]:
    """Every run's panels (the task's own among them), the same title's lines in one panel, each
    line named by its run when there are several; a chain's stages shifted to follow each other."""
    by_title: dict[str, list[Line]] = {}
    for run, start in zip(runs, _stages(runs, chained), strict=True):
        task = tasks.all_tasks().get(run.task)
        for panel in panels(run.history, task.curves if task is not None else ()):
            for line in panel.lines:
                points = tuple((x + start, y) for x, y in line.points)
                shown = Line(points, line.kind, line.name, run.name if len(runs) > 1 else "")
                by_title.setdefault(panel.title, []).append(shown)
    return [Panel(title, tuple(lines)) for title, lines in by_title.items()]


def colors(panel: Panel, runs: list[str]) -> list[str]:
    """A colour per line, shared by a quantity's train and eval lines: of one run, one quantity in
    fixed colours (train blue, eval red) and several a colour each; of several ``runs``, each run
    its own colour in every panel (several quantities of a run: a colour per run and quantity)."""
    keys = list(dict.fromkeys((line.run, line.name) for line in panel.lines))
    if len(runs) <= 1 and len(keys) == 1:
        return [EVAL_COLOR if line.kind == EVAL else TRAIN_COLOR for line in panel.lines]
    if len(runs) > 1 and len(keys) == len({run for run, _ in keys}):  # one quantity a run
        return [PALETTE[runs.index(line.run) % len(PALETTE)] for line in panel.lines]
    return [PALETTE[keys.index((line.run, line.name)) % len(PALETTE)] for line in panel.lines]


def _legend(panel: Panel, shades: list[str]) -> Raw:
    items = []
    for line, color in zip(panel.lines, shades, strict=True):
        dash = "dashed" if line.kind == EVAL else "solid"
        swatch = tag("i", "", class_="swatch", style=f"border-top-color:{color};border-top-style:{dash}")
        items.append(tag("span", join([swatch, line.label])))
    return tag("div", join(items), class_="legend")


def curves(runs: list[RunView], chained: bool) -> Raw:
    found = merged_panels(runs, chained)
    starts = _stages(runs, chained)
    # a chain's panels span all its stages, so the stages line up from panel to panel
    stages = [(s, r.name) for s, r in zip(starts, runs, strict=True)] + [(starts[-1] + runs[-1].steps, "")]
    names = [r.name for r in runs] if len(runs) > 1 else []
    figures = []
    for panel in found:
        shades = colors(panel, names)
        figures.append(
            tag(
                "figure",
                join(
                    [
                        tag("figcaption", panel.title),
                        Raw(chart(panel, shades, stages if chained else None)),
                        _legend(panel, shades),
                    ]
                ),
            )
        )
    hint = "Hover a point for its step and value. "
    hint += "Train lines are the logging windows' means; eval points are the evaluations."
    body = (
        tag("div", join(figures), class_="charts") if figures else note("No curve: nothing was logged yet.")
    )
    return section("curves", "Curves", note(hint), body)


def _shown(make: Callable[[], Raw], key: str, title: str) -> Raw:
    """A section; one whose files hold what it cannot read (edited by hand) says so, the others
    show as they are."""
    try:
        return make()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
        return section(key, title, note(f"not shown: a run's files hold what this section cannot read ({e})"))


def render(runs: list[RunView], chained: bool) -> str:
    """The whole page."""
    names = ", ".join(r.name for r in runs)
    kind = f"a chain of {len(runs)} runs" if chained else (f"{len(runs)} runs" if len(runs) > 1 else "1 run")
    head = join([Raw('<meta charset="utf-8">'), Raw(GENERATOR),
                 Raw('<meta name="viewport" content="width=device-width, initial-scale=1">'),
                 tag("title", f"xtrain report: {names}"), tag("style", Raw(STYLE))])  # fmt: skip
    nav = tag("nav", join(tag("a", title, href=f"#{key}") for key, title in SECTIONS))
    where = join(tag("div", join([tag("b", r.name), ": ", tag("code", r.folder.resolve())])) for r in runs)
    parts = [
        lambda: sections.lineage(runs, chained), lambda: sections.plan(runs),
        lambda: sections.data_check(runs), lambda: curves(runs, chained),
        lambda: sections.evaluation(runs), lambda: sections.benchmarks(runs, chained), lambda: samples(runs),
    ]  # fmt: skip
    body = join([
        tag("h1", f"xtrain report: {names}"), tag("p", kind, class_="dim"), where, nav,
        *(_shown(make, key, title) for make, (key, title) in zip(parts, SECTIONS, strict=True)),
        tag("footer", f"written by xtrain {__version__} report on {time.strftime('%Y-%m-%d %H:%M')}"),
    ])  # fmt: skip
    return f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n<body>{body}</body>\n</html>\n'


def output_path(runs: list[RunView], chosen: Path | None) -> Path:
    """Where the page goes: ``chosen`` (a folder: report.html in it), else the run's folder (of
    several: the last one's, as report-N-runs.html)."""
    if chosen is not None:
        return chosen / REPORT if chosen.is_dir() else chosen
    name = REPORT if len(runs) == 1 else f"report-{len(runs)}-runs.html"
    return runs[-1].folder / name


def write(path: Path, text: str, force: bool) -> Path:
    """The page written atomically; a file there that the report did not write is kept (one line)
    unless ``force``."""
    if path.exists() and not force:
        try:
            ours = GENERATOR in path.read_text(encoding="utf-8", errors="replace")[:2000]
        except OSError:
            ours = False
        if not ours:
            raise XtrainError(
                f"{path} exists and is not a report xtrain wrote: it is left as it is",
                "choose another file with -o, or replace it with --force",
            )
    if not path.parent.is_dir():
        raise XtrainError(f"{path.parent} is not a folder", "choose a file in an existing folder with -o")
    try:
        return atomic.write_text(path, text)
    except OSError as e:  # a run folder on a read-only share, a full disk
        raise XtrainError(
            f"cannot write {path}: {e.strerror or e}", "choose a writable file with --output (-o)"
        ) from None
