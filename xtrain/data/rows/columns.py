"""Which row format a causal-lm data set holds, and the columns it needs: ``row_format`` (the one
place that decides, ``formats.detect``) checks them at once, so a file without them gets one line
naming the format's columns, the closest column the file has (``difflib``) and the ``data.*`` key
the user set, instead of a line about another format's column. ``xtrain predict --data`` checks a
file against the run's format (``require``) and speaks of the run, not of ``data.*`` keys.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from xtrain.config.schema import DataConfig, given_keys
from xtrain.data.rows.formats import ALPACA_REQUIRED, SHAREGPT_COLUMN, chat_column, detect
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset

    from xtrain.config.schema import TrainConfig

FORMATS_DOC = "docs/training.md#data-formats"
# data.* keys that name a column a row format reads, and the format that reads it
COLUMN_KEYS = {
    "data.messages_column": "messages",
    "data.text_column": "text",
    "data.prompt_column": "prompt_response",
    "data.response_column": "prompt_response",
}


def needed(d: DataConfig, fmt: str, columns: list[str], answers: bool = True) -> list[tuple[str, str | None]]:
    """(column, the ``data.*`` key that names it or None) that rows of ``fmt`` need; ``answers``
    False: a prompt is enough (``xtrain predict``)."""
    if fmt == "alpaca":
        return [(c, None) for c in (ALPACA_REQUIRED if answers else ALPACA_REQUIRED[:1])]
    if fmt == "sharegpt":
        column = chat_column(d, fmt, columns)
        return [(column, None if column == SHAREGPT_COLUMN else "data.messages_column")]
    if fmt == "messages":
        return [(d.messages_column, "data.messages_column")]
    if fmt == "prompt_response":
        pairs = [(d.prompt_column or "prompt", "data.prompt_column")]
        return pairs + ([(d.response_column or "response", "data.response_column")] if answers else [])
    return [(d.text_column, "data.text_column")]


def _close(name: str, columns: list[str]) -> str | None:
    """The column most like ``name`` (difflib's ratio either way round: ``msgs`` for ``messages``)."""

    def score(column: str) -> float:
        return max(difflib.SequenceMatcher(None, a, b).ratio() for a, b in ((name, column), (column, name)))

    best = max(columns, key=score, default=None)
    return best if best is not None and score(best) >= 0.6 else None


def _given(cfg: TrainConfig) -> set[str]:
    """The ``data.*`` column keys the user set off their default (for a config built in code:
    those off their default too)."""
    given, default = given_keys(cfg), DataConfig()
    changed = {k for k in COLUMN_KEYS if getattr(cfg.data, k[5:]) != getattr(default, k[5:])}
    return changed if given is None else {k for k in changed if k in given}


def _guess(cfg: TrainConfig, columns: list[str]) -> str:
    """For ``auto`` rows that hold no format's columns: the format the user most likely meant (a
    column key they set, then a format with some of its columns, then one whose columns are
    misspelt), so its line names what is missing."""
    d = cfg.data
    for key in ("data.messages_column", "data.text_column"):
        if key in _given(cfg):
            return COLUMN_KEYS[key]
    order = ("alpaca", "prompt_response", "sharegpt", "messages", "text")
    for fmt in order:
        names = [c for c, _ in needed(d, fmt, columns)]
        if len(names) > 1 and any(c in columns for c in names):
            return fmt
    for fmt in order:
        if all(_close(c, columns) for c, _ in needed(d, fmt, columns)):
            return fmt
    return "text"


def missing(
    d: DataConfig, fmt: str, columns: list[str], source: str, given: set[str], run: str | None = None
) -> XtrainError | None:
    """The one line for rows of ``fmt`` without the columns they need (None: they have them):
    ``alpaca rows need 'output' (did you mean 'ouput'?)``. ``run``: ``xtrain predict``'s run,
    whose format the file must have (no ``data.*`` advice then)."""
    need = needed(d, fmt, columns, answers=run is None)
    lacking = [(c, k) for c, k in need if c not in columns]
    if not lacking:
        return None
    spare = [c for c in columns if c not in {n for n, _ in need}]
    parts = []
    for column, _ in lacking:
        close = _close(column, spare)
        parts.append(f"'{column}'" + (f" (did you mean '{close}'?)" if close else ""))
    what = f"{run} was trained on {fmt} rows: " if run else ""
    line = f"{what}{fmt} rows need {' and '.join(parts)}; {source} has {', '.join(columns) or 'no columns'}"
    if run:
        return XtrainError(line, f"give --data a file of {fmt} rows ({FORMATS_DOC})")
    set_key = next((k for c, k in lacking if k in given), None)
    if set_key is not None:
        value = getattr(d, set_key[5:])
        return XtrainError(line, f"{set_key}={value} names no column of it: set it to the one holding them")
    keys = [k for _, k in lacking if k is not None]
    rename = "rename the column in the file"
    if keys:
        rename = f"set {' and '.join(keys)} to the column{'s' if len(keys) > 1 else ''} of the file"
    how = "what the rows hold" if d.row_format == "auto" else "the format the rows have"
    return XtrainError(line, f"{rename}, or data.row_format to {how} ({FORMATS_DOC})")


def row_format(cfg: TrainConfig, train: Dataset, source: str = "the training data") -> str:
    """What the rows hold: ``data.row_format``, or for auto what the training data's columns hold
    (``formats.detect``: the one place that decides), its columns checked (``missing``)."""
    d = cfg.data
    columns = list(train.column_names)
    fmt = detect(d.row_format, columns, d.text_column, d.messages_column, d.prompt_column is not None)
    given = _given(cfg)
    if d.row_format == "auto" and any(c not in columns for c, _ in needed(d, fmt, columns)):
        fmt = _guess(cfg, columns)
    error = missing(d, fmt, columns, source, given)
    if error is not None:
        raise error
    return fmt


def require(cfg: TrainConfig, fmt: str, ds: Dataset, source: str, run: str | None = None) -> None:
    """``ds`` holds the columns the format ``fmt`` reads: the eval data of a run (``row_format``
    decided it from the training data), or ``xtrain predict --data``'s file (``run``: the run
    whose format it is)."""
    given = set() if run else _given(cfg)
    error = missing(cfg.data, fmt, list(ds.column_names), source, given, run)
    if error is not None:
        raise error
