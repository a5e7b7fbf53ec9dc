"""The data check's report, plain data: what was read of each source (``SourceCheck``), the
whole ``DataReport`` and its one-line summary, and one example as the model gets it, in pieces
with and without loss (``Example``, ``Piece``). Built by ``data_check``; rendered by the CLI
(``xtrain/commands/render_data.py``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from xtrain.errors import XtrainError
from xtrain.structured import field_error


@dataclass(frozen=True)
class Piece:
    """Consecutive tokens of the example, decoded together: with loss (``trained``) or without.
    ``more``: the piece is one special token that the model gets ``more`` times again right
    after it (an image placeholder expanded into its patches), not written out."""

    text: str
    trained: bool
    more: int = 0


@dataclass
class Example:
    """One row as the model gets it."""

    source: str
    row: int
    pieces: list[Piece] = field(default_factory=list)  # the token sequence (inputs or labels)
    inputs: list[str] = field(default_factory=list)  # what else it reads: "image /data/0.png (32x32)"
    label: str | None = None  # a classifier's target: "positive (id 1)"
    note: str | None = None  # how the run uses it beyond this row (packing)
    tokens: int = 0
    trained: int = 0  # tokens with loss

    def where(self) -> str:
        return f"row {self.row} of {self.source}"


@dataclass
class SourceCheck:
    """What the check found in the first rows of one data source."""

    role: str  # train | eval
    source: str
    checked: int
    total: int | None = None  # None: more rows than checked (a full count would read it all)
    row_format: str | None = None
    lengths: list[int] = field(default_factory=list)  # tokens per checked row, before the cut
    truncated: int = 0  # rows data.max_length cuts
    dropped: int = 0  # rows left with nothing to learn after the cut (the run leaves them out)
    trained: int = 0  # tokens with loss in the checked rows, whole (0: not counted by the task)
    trained_kept: int = 0  # of those, what the cut at data.max_length leaves
    labels: dict[str, int] = field(default_factory=dict)  # label -> rows, among the checked
    images: list[int] = field(default_factory=list)  # images per checked row
    seconds: list[float] = field(default_factory=list)  # audio seconds per checked row

    def rows(self) -> str:
        if self.total is not None and self.total == self.checked:
            return f"{self.total} row{'s' if self.total != 1 else ''}"
        of = f"{self.total}" if self.total is not None else "more"
        return f"first {self.checked} of {of} rows"

    def facts(self, max_length: int) -> list[str]:
        """Short phrases: lengths and cuts, labels, media."""
        out = []
        if self.lengths:
            low, mid, high = min(self.lengths), int(statistics.median(self.lengths)), max(self.lengths)
            out.append(f"tokens per row {low}-{high} (median {mid})")
            cut = f"{self.truncated} longer than data.max_length={max_length}"
            if self.dropped:
                cut += f", {self.dropped} with nothing left to learn (the run leaves them out)"
            if self.truncated and self.trained:
                cut += f"; {self.trained_kept} of {self.trained} trained tokens kept"
            out.append(cut)
        if self.labels:
            top = sorted(self.labels.items(), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{k} {v}" for k, v in top[:8]) + (", ..." if len(top) > 8 else "")
            out.append(f"labels {shown}")
        if self.images:
            out.append(f"images per row {_span(self.images)}")
        if self.seconds:
            out.append(f"audio {min(self.seconds):.1f}-{max(self.seconds):.1f} s per clip")
        return out


@dataclass
class DataReport:
    """The data check's findings (plain data; ``xtrain/commands/data_report.py`` renders it)."""

    task: str
    max_length: int
    sources: list[SourceCheck] = field(default_factory=list)
    example: Example | None = None
    notes: list[str] = field(default_factory=list)  # what was not checked, and why
    encoding: str | None = None  # the dry run's word on the first run's encoding (cached, or how long)

    @classmethod
    def from_dict(cls, data: Any) -> DataReport:
        """The report as a run saved it (``asdict``: the run folder's ``data_check.json``), each
        field of each part typed; keys it does not know are left out, a value of another type is a
        ``ValueError`` naming the field (a file edited by hand)."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        found = _typed(cls, data, ("sources", "example"))
        found["sources"] = [_typed(SourceCheck, s) for s in _listed(data.get("sources", []), "sources")]
        example = data.get("example")
        if example is not None:
            if not isinstance(example, dict):
                raise ValueError("example: an object expected")
            pieces = [Piece(**_typed(Piece, p)) for p in _listed(example.get("pieces", []), "example.pieces")]
            found["example"] = Example(**{**_typed(Example, example, ("pieces",)), "pieces": pieces})
        found["sources"] = [SourceCheck(**s) for s in found["sources"]]
        return cls(**found)

    def summary(self) -> str:
        """One line: each source's rows and format, and the cut (the run's banner)."""
        parts = []
        for s in self.sources:
            fmt = f", {s.row_format}" if s.row_format else ""
            cut = f", {s.truncated} cut at data.max_length" if s.lengths else ""
            parts.append(f"{s.role} {s.source} ({s.rows()} checked{fmt}{cut})")
        return "; ".join(parts) or "not checked"


def nothing_to_learn(report: DataReport) -> XtrainError | None:
    """The one line for a source none of whose checked rows has a token left to learn (the run
    would stop with "no ... examples left"): the rows' lengths and the ``data.max_length`` that
    keeps them whole where the cut is why; None when every source has rows to learn from (some
    rows left out is the Data line's fact, not a refusal)."""
    for s in report.sources:
        if not s.checked or s.dropped < s.checked:
            continue
        rows = f"all {s.checked} rows" if s.total == s.checked else f"the first {s.checked} rows"
        where = f"data.{s.role} {s.source}"
        if not s.truncated or not s.lengths:
            return XtrainError(
                f"nothing to learn in {where}: {rows} have no token with loss (no answer the run trains on)",
                "give the rows answers (assistant turns, a response or output) or check data.train_on",
            )
        low, mid, high = min(s.lengths), int(statistics.median(s.lengths)), max(s.lengths)
        tokens = f"{low}" if low == high else f"{low}-{high} (median {mid})"
        cut = f"data.max_length={report.max_length} cuts off"
        why = (
            f"{cut} all their trained tokens"
            if s.truncated == s.checked
            else f"{s.truncated} are longer: {cut} their trained tokens, the others have none"
        )
        return XtrainError(
            f"nothing to learn in {where}: {rows} are {tokens} tokens long and {why} "
            f"(the run would stop: no {'training' if s.role == 'train' else 'eval'} examples left)",
            f"set data.max_length={high} to keep every checked row whole, or shorten the rows' prompts: "
            "long system turns, tool schemas",
        )
    return None


LOST_WARNING = 0.25  # the share of the trained tokens whose loss to the cut earns a warning


def cut_warnings(report: DataReport) -> list[str]:
    """A warning for each source whose cut at ``data.max_length`` loses over a quarter of its
    checked rows' trained tokens (the answers, cut off the end): the run trains, on less than the
    user meant, so the line gives the length that keeps them whole. All lost: ``nothing_to_learn``."""
    out = []
    for s in report.sources:
        if not s.trained or not s.lengths or s.trained_kept >= s.trained * (1 - LOST_WARNING):
            continue
        lost = 1 - s.trained_kept / s.trained
        out.append(
            f"warning: data.max_length={report.max_length} cuts {lost:.0%} of the trained tokens of "
            f"data.{s.role} {s.source} ({s.truncated} of {s.checked} checked rows are longer, up to "
            f"{max(s.lengths)} tokens): data.max_length={max(s.lengths)} keeps them whole"
        )
    return out


def _listed(value: Any, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{name}: a list of objects expected")
    return value


def _typed(kind: type, values: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of dataclass ``kind`` in ``values`` (but ``skip``), each checked against its type."""
    hints = get_type_hints(kind)
    out = {}
    for f in fields(kind):
        if f.name in values and f.name not in skip:
            why = field_error(values[f.name], hints[f.name])
            if why is not None:
                raise ValueError(f"{f.name}: {why}")
            out[f.name] = values[f.name]
    return out


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"
