"""`xtrain train --dry-run`'s data check: the task's ``check_data`` hook (``tasks/data_check.py``)
run on the first rows of the data, and its report rendered: a summary per data source and one
example as the model gets it, its trained (loss) tokens styled on a terminal and between
``[[`` and ``]]`` in a file or a pipe (``console.make_console``: no colour there), a special token
repeated many times (an image's placeholder) written once and followed by ``[... N more ...]``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from xtrain.tasks.data_report import DataReport, Example

TRAINED_STYLE = "bold green underline"
MARKS = ("[[", "]]")  # around the trained tokens where there is no styling
# after a special token the model gets many times over (an image's patches): how many more, dim
# on a terminal; the text itself is never cut, so this follows a special token only
CUT, CUT_STYLE = "[... {} more ...]", "dim"


def render(report: DataReport | str, console: Console) -> None:
    """The summary lines, the notes and the example."""
    from rich.markup import escape

    if isinstance(report, str):
        console.print(f"[bold]Data:[/] {escape(report)}", soft_wrap=True)
        return
    for i, s in enumerate(report.sources):
        fmt = f", {s.row_format}" if s.row_format else ""
        head = "[bold]Data:[/]" if i == 0 else "     "
        facts = "".join(f"; {f}" for f in s.facts(report.max_length))
        console.print(f"{head} {s.role} {escape(s.source)}: {s.rows()}{fmt}{escape(facts)}", soft_wrap=True)
    if not report.sources:
        console.print("[bold]Data:[/] nothing read here", soft_wrap=True)
    for note in report.notes:
        warning = note.removeprefix("warning: ")
        label = "[yellow]warning:[/]" if warning != note else "[dim]note:[/]"
        console.print(f"  {label} {escape(warning)}", soft_wrap=True)
    if report.encoding is not None:
        console.print(f"  {escape(report.encoding)}", soft_wrap=True)
    if report.example is not None:
        for line in example_lines(report.example, console.is_terminal):
            console.print(line, soft_wrap=True)


def example_lines(example: Example, styled: bool) -> list[Text]:
    """The example as rich ``Text`` lines: a heading, its other inputs, its tokens (trained ones
    styled, or marked), its label."""
    from rich.text import Text

    counts = f"{example.tokens} tokens, {example.trained} with loss" if example.pieces else "its label"
    how = "styled" if styled else f"between {MARKS[0]} {MARKS[1]}"
    out = [Text(f"\nExample, {example.where()} ({counts}; trained tokens {how}):", style="bold")]
    out += [Text(f"  {line}") for line in example.inputs]
    if example.pieces:
        text = Text()
        for piece in example.pieces:
            shown = piece.text + (CUT.format(piece.more) if piece.more and not styled else "")
            if not piece.trained:
                text.append(shown)
            elif styled:
                text.append(shown, style=TRAINED_STYLE)
            else:
                text.append(f"{MARKS[0]}{shown}{MARKS[1]}")
            if piece.more and styled:
                text.append(CUT.format(piece.more), style=CUT_STYLE)
        out.append(text)
    if example.label is not None:
        label = Text("  label: ")
        label.append(example.label if styled else f"{MARKS[0]}{example.label}{MARKS[1]}",
                     style=TRAINED_STYLE if styled else "")  # fmt: skip
        out.append(label)
    if example.note:
        out.append(Text(f"  ({example.note})", style="dim"))
    return out
