"""Compare: several runs, or a chain's stages, as the report shows them side by side (its
sections: the lineage, the plan, the curves overlaid or a chain's one after another, the
evaluations before and after), redrawn while any of them trains (``live.many_stream``).

``SECTIONS`` is the list the view draws, in order, each ``(key, title, section)`` with
``section(runs, chained) -> HTML``: the report's own functions, the benchmark scores of ``xtrain
eval`` among them (``report.sections.benchmarks``: each run's ``benchmarks/`` files). A new table
beside them is one more entry here, a function of the same shape reading its files from the run
folders (and its file in ``live.WATCHED`` for the view to redraw when it changes); the page needs
no change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from xtrain.errors import XtrainError
from xtrain.report import page, sections
from xtrain.report.html import Raw, join, note, section, tag
from xtrain.report.runs import RunView, in_order, read_run
from xtrain.studio.runs import config_value, record_of, relative
from xtrain.studio.security import inside

Section = Callable[[list[RunView], bool], Raw]
SECTIONS: list[tuple[str, str, Section]] = [
    ("curves", "Curves", page.curves),
    ("evaluation", "Evaluation", lambda runs, chained: sections.evaluation(runs)),
    ("benchmarks", "Benchmarks", sections.benchmarks),
    ("plan", "Plan", lambda runs, chained: sections.plan(runs)),
    ("lineage", "Lineage", sections.lineage),
]


def folders(root: Path, paths: list[str]) -> list[Path]:
    """The runs named (relative to the runs folder), each inside it."""
    if not paths:
        raise XtrainError("no run chosen to compare", "tick two runs or more, or a run of a chain")
    return [inside(root, p) for p in dict.fromkeys(paths)]


def chain_of(root: Path, path: str) -> list[str]:
    """A run and the stages it continues that are under the runs folder, oldest first."""
    folder = inside(root, path)
    found = []
    for entry in record_of(folder).get("lineage") or []:
        source = Path(str(entry.get("source", ""))) if isinstance(entry, dict) else None
        if source is None:
            continue
        for candidate in (source, source.parent):
            try:
                found.append(relative(root, candidate))
                break
            except ValueError:  # not under the runs folder
                continue
    return [*dict.fromkeys(found), relative(root, folder)]


def _views(runs: list[Path]) -> tuple[list[RunView], list[str]]:
    views, missing = [], []
    seen: dict[str, int] = {}
    for folder in runs:
        try:
            view = read_run(folder)
        except XtrainError as e:
            missing.append(f"{folder.name}: {e.message}")
            continue
        if "task" not in view.record:
            view.record = {**view.record, "task": config_value(folder, "model", "task") or "?"}
        seen[view.name] = seen.get(view.name, 0) + 1
        if seen[view.name] > 1:
            view.name = f"{view.name} ({seen[view.name]})"
        views.append(view)
    return views, missing


def compare_html(runs: list[Path]) -> str:
    """The sections of ``runs`` (in a chain's order when they form one)."""
    views, missing = _views(runs)
    parts = [tag("p", f"left out, {line}", class_="warn") for line in missing]
    if not views:
        return str(join([*parts, note("Nothing to compare yet: no run has logged a step.")]))
    views, chained = in_order(views)
    kind = "the stages of one chain, in order" if chained else f"{len(views)} runs"
    parts.insert(0, tag("p", kind, class_="dim"))
    for key, title, make in SECTIONS:
        try:
            parts.append(make(views, chained))
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            parts.append(section(key, title, note(f"not shown: {e}")))
    return str(join(parts))
