"""What a worker tells xtrain's launcher about how it ended: one channel, one file per rank.

A launcher (``xtrain train``'s ``launch``, ``python -m xtrain.run --processes N``) names a
private folder in ``XTRAIN_REPORT_DIR``; a rank that ends with a user-facing error writes
``rank-N.json`` there (``record``: the one line, its exit code, and whether this rank printed
it already), and the launcher reads them all (``read``), lowest rank first. Who prints stays
the worker's rule (``xtrain.run``: rank 0, or every rank of a group that never formed); the
launcher says a line itself only when no rank did."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from xtrain.atomic import write_text
from xtrain.errors import XtrainError

REPORT_ENV = "XTRAIN_REPORT_DIR"


@dataclass(frozen=True)
class Report:
    """How one rank ended: its one line (``message``, ``hint``), ``exit_code``, and ``printed``:
    whether the rank said it itself (the launcher then adds nothing)."""

    rank: int
    message: str
    hint: str | None
    exit_code: int
    printed: bool

    def error(self, exit_code: int | None = None) -> XtrainError:
        """The line as an ``XtrainError`` (``exit_code``: the launcher's, e.g. a stop's)."""
        code = self.exit_code if exit_code is None else exit_code
        return XtrainError(self.message, self.hint, exit_code=code)


def launcher_listens() -> bool:
    """Whether one of xtrain's launchers started this process and reads its report (it then says
    itself what a second Ctrl+C left: the ranks are killed before they could)."""
    return bool(os.environ.get(REPORT_ENV))


def record(error: XtrainError, rank: int, printed: bool) -> None:
    """This rank's ending, for xtrain's launcher (nothing when no launcher of xtrain's asked);
    ``rank``: this process's (its ``LaunchContext``)."""
    folder = os.environ.get(REPORT_ENV)
    if not folder:
        return
    report = Report(rank, error.message, error.hint, error.exit_code, printed)
    with contextlib.suppress(OSError):  # the launcher then says it itself
        write_text(Path(folder) / f"rank-{rank}.json", json.dumps(asdict(report)))


def read(folder: str | Path) -> list[Report]:
    """The ranks' reports in ``folder``, lowest rank first (an unreadable one is skipped: the
    launcher then speaks for that rank)."""
    reports = []
    for path in Path(folder).glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = json.loads(path.read_text(encoding="utf-8"))
            reports.append(
                Report(
                    int(data["rank"]),
                    str(data["message"]),
                    data.get("hint"),
                    int(data["exit_code"]),
                    bool(data["printed"]),
                )  # fmt: skip
            )
    return sorted(reports, key=lambda r: r.rank)


def said(reports: list[Report]) -> Report | None:
    """The first report a rank printed itself (the launcher then repeats nothing)."""
    return next((r for r in reports if r.printed), None)
