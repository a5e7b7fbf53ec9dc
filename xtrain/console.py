"""The rich Console every command prints through.

On a terminal: rich as usual (colour, live progress). Sent to a file or a pipe (SLURM logs, CI,
``| tee``, ``> run.log`` in PowerShell): no ANSI codes and lines as long as their content, so a
path or a number is never wrapped or cut with "…" at rich's default 80 columns.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

PLAIN_WIDTH = 4096  # "as wide as the content": rich needs a number


def make_console(stderr: bool = False, **kwargs: Any) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    kwargs.setdefault("highlight", False)
    if not terminal and "force_terminal" not in kwargs:
        kwargs.setdefault("width", PLAIN_WIDTH)
        kwargs.setdefault("color_system", None)
        kwargs.setdefault("soft_wrap", True)
    return Console(stderr=stderr, **kwargs)
