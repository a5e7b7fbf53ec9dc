"""lm-eval's results as rows a person reads (``Score``: a task or group, a metric with its filter,
the value, its standard error, how many rows), a model's scores against another's (``change``), and
the compact form kept in ``train_result.json`` and read by ``xtrain report``. Pure data."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

NO_FILTER = "none"


@dataclass(frozen=True)
class Score:
    """One figure of a results table: ``task`` (a task or a group), ``metric`` (``filter``: lm-eval's
    filter of the answers, ``none`` for most tasks), its ``value``, ``stderr`` (None where lm-eval
    gives none) and the rows it is over (``n``; None for a group)."""

    task: str
    metric: str
    value: float
    stderr: float | None = None
    filter: str = NO_FILTER
    n: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.task, self.metric, self.filter

    @property
    def name(self) -> str:
        """``exact_match`` or ``exact_match (strict-match)``: the metric with a filter that is not none."""
        return self.metric if self.filter == NO_FILTER else f"{self.metric} ({self.filter})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Score | None:
        """A row as ``to_dict`` wrote it (None for one that is not: a file edited by hand)."""
        try:
            value = float(data["value"])
            stderr = data.get("stderr")
            n = data.get("n")
            return cls(
                str(data["task"]), str(data["metric"]), value,
                float(stderr) if isinstance(stderr, (int, float)) else None,
                str(data.get("filter", NO_FILTER)), int(n) if isinstance(n, int) else None,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None


def _number(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def scores(results: dict[str, Any]) -> list[Score]:
    """The rows of lm-eval's results (``simple_evaluate``'s answer): each task's and group's metrics
    in its order, ``metric,filter`` keys with their ``metric_stderr,filter`` beside them."""
    out = []
    samples = results.get("n-samples") or {}
    for task, found in (results.get("results") or {}).items():
        if not isinstance(found, dict):
            continue
        effective = (
            (samples.get(task) or {}).get("effective") if isinstance(samples.get(task), dict) else None
        )
        for key, raw in found.items():
            if "," not in key or "_stderr," in key:
                continue
            value = _number(raw)
            if value is None:
                continue
            metric, _, how = key.partition(",")
            stderr = _number(found.get(f"{metric}_stderr,{how}"))
            n = effective if isinstance(effective, int) else None
            out.append(Score(task, metric, value, stderr, how or NO_FILTER, n))
    return out


def rows_of(found: Any) -> list[Score]:
    """Compact rows as saved (``[Score.to_dict(), ...]``), the ones that are not rows left out."""
    rows = found if isinstance(found, list) else []
    return [s for s in (Score.from_dict(r) for r in rows if isinstance(r, dict)) if s is not None]


def change(score: Score | None, reference: Score | None) -> float | None:
    """``score`` minus ``reference`` (None where either is missing)."""
    if score is None or reference is None:
        return None
    return score.value - reference.value


def table(columns: list[list[Score]]) -> list[tuple[tuple[str, str, str], list[Score | None]]]:
    """Every (task, metric, filter) any column has, in first-seen order, with each column's score
    (None where a column lacks it)."""
    keys: dict[tuple[str, str, str], None] = {}
    for column in columns:
        for s in column:
            keys.setdefault(s.key, None)
    found = [{s.key: s for s in column} for column in columns]
    return [(key, [column.get(key) for column in found]) for key in keys]


def shown(score: Score | None, digits: int = 4) -> str:
    """``0.5250 ± 0.0790`` (the value and its standard error), ``-`` for none."""
    if score is None:
        return "-"
    text = f"{score.value:.{digits}f}"
    return text + (f" ± {score.stderr:.{digits}f}" if score.stderr is not None else "")


def shown_change(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"
