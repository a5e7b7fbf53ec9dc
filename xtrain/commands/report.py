"""`xtrain report RUN [RUN ...]`: one HTML page of a run, of several side by side, or of a chain's
stages in order (xtrain/report/ reads the runs and writes the page; nothing is loaded or sent)."""

from __future__ import annotations

from pathlib import Path

import typer


def report(
    runs: list[Path] = typer.Argument(
        ...,
        metavar="RUN",
        help="Run folders (run.output_dir); several are overlaid, a chain's stages put in order.",
    ),
    output: Path = typer.Option(
        None,
        "--output",
        "-o",
        help="The HTML file to write, or a folder for report.html (default: RUN/report.html; of "
        "several runs: LAST_RUN/report-N-runs.html).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace a file at --output that is not a report."),
) -> None:
    """One self-contained HTML page of a run (or several, or a chain's stages): its plan, data
    check, curves, evaluation before and after, and sample answers; opens from disk, offline."""
    from xtrain.console import make_console
    from xtrain.report import page
    from xtrain.report.runs import read_runs

    found, chained = read_runs(list(runs))
    path = page.write(page.output_path(found, output), page.render(found, chained), force)
    what = "chain of " if chained else ""
    count = f"{what}{len(found)} runs" if len(found) > 1 else "run"
    make_console().print(
        f"report of the {count}: {path} (open it in a browser)", soft_wrap=True, markup=False
    )
