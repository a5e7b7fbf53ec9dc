"""What a preflight check says and where it runs: ``Note`` (one line, plain data), ``Where`` (the
launcher, a dry run, a training process) and ``Check``, the shape of every check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xtrain.planning.run import Run

if TYPE_CHECKING:
    from xtrain.launch.sharding import Kind
    from xtrain.tasks.data_report import DataReport


@dataclass(frozen=True)
class Note:
    """One line a check says: ``label`` (``Attention``, ``Weights``, ...) and its text, at a
    ``level``: info (the launcher shows it), warning or error (every side shows it), dim (an
    aside); ``data``: the data check's report, which the command renders as a block."""

    label: str
    text: str
    level: str = "info"  # info | warning | error | dim
    data: DataReport | str | None = None


@dataclass(frozen=True)
class Where:
    """Where the checks run: the launcher before any process starts (``launcher``), with a plan
    for this machine (``here``; False: a ``--facts`` snapshot's) and ``dry_run``; else a training
    process. ``sharding``: what the launch options or accelerate's config ask for (fsdp, zero2,
    zero3; ``sharding_from_options``: the options did)."""

    launcher: bool = False
    here: bool = True
    dry_run: bool = False
    sharding: Kind | None = None
    sharding_from_options: bool = False


WORKER = Where()


Check = Callable[[Run, Where], list[Note]]
