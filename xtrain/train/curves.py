"""A run's curves as plain data: its history (the loss and what each logging window logged, its
evaluations) laid out in panels, drawn as a PNG by ``train/plot.py`` and as inline SVG by
``xtrain report``. No drawing library here.

The panels, in order: the training loss (each window's mean, a smoothed line over it, the eval
loss at its evaluations), the learning rate, the task's own (``Task.curves``: what its users
watch, e.g. GRPO's reward per reward function), then every other eval metric, a panel each, and
the benchmarks of ``eval.benchmarks`` (the start at step 0, the result at its last step). A
panel with no point is left out; non-finite values (a diverged loss) are not drawn.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from xtrain.tasks.contract import Curve

Point = tuple[float, float]
TRAIN, SMOOTHED, EVAL = "train", "smoothed", "eval"  # how a line is drawn
LOSS, LR, EVAL_LOSS = "loss", "lr", "eval_loss"
BENCHMARKS = "benchmarks (lm-eval)"  # eval.benchmarks' panel: a line per task and metric
SMOOTHING_SHARE = 0.1  # the smoothed loss averages about a tenth of the windows ... (``smoothed``)
MAX_SMOOTHING = 0.95  # ... at most with an exponential weight this heavy (long runs)
SMOOTH_FROM = 20  # windows: fewer are drawn as they are (a smoothed line would hide or lag them)
LOG_SPAN = 100.0  # positive values over more than this factor are drawn on a log scale (perplexity)


KINDS = {TRAIN: "train", SMOOTHED: "train, smoothed", EVAL: "eval"}


@dataclass(frozen=True)
class Line:
    points: tuple[Point, ...]  # (optimizer step, value), steps rising
    kind: str = TRAIN  # TRAIN (each window), SMOOTHED (over TRAIN) or EVAL (at evaluations)
    name: str = ""  # which of a panel's quantities: "" (its only one), "exact_match", "chosen"
    run: str = ""  # which run (``xtrain report`` of several)

    @property
    def label(self) -> str:
        """In the legend: "train", "exact_match eval", "run-2 train, smoothed"."""
        return " ".join(part for part in (self.run, self.name, KINDS[self.kind]) if part)


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[Line, ...]

    @property
    def log_scale(self) -> bool:
        """Its values are all positive and span more than ``LOG_SPAN`` (a perplexity falling from
        1000 to 3): on a linear scale the end of the curve would be a flat line at the bottom."""
        ys = [y for line in self.lines for _, y in line.points]
        return bool(ys) and min(ys) > 0 and max(ys) / min(ys) > LOG_SPAN


@dataclass
class History:
    """What a run's curves are drawn from: ``RunState``'s history (a checkpoint's, or
    ``train_result.json``'s). ``log_history``: each logging window's logged values by key, with
    its ``step``; a run older than it has ``losses`` only ([[step, loss], ...])."""

    losses: list[list[float]] = field(default_factory=list)
    log_history: list[dict[str, float]] = field(default_factory=list)
    eval_history: list[dict[str, float]] = field(default_factory=list)
    # eval.benchmarks' scores (``TrainResult.benchmarks``): the start at step 0, the result at its step
    benchmarks: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def of(cls, saved: Any) -> History:
        """From anything holding the three lists (``RunState``, ``TrainState``, ``TrainResult``)
        or a dict of them (``train_result.json``, which a person may have edited: only rows of the
        expected shape are kept, each with a numeric step, their values numbers)."""

        def get(name: str) -> list:
            value = saved.get(name) if isinstance(saved, dict) else getattr(saved, name, None)
            return list(value) if isinstance(value, list) else []

        losses = [
            list(r) for r in get("losses") if isinstance(r, list) and len(r) == 2 and all(map(_number, r))
        ]
        found = saved.get("benchmarks") if isinstance(saved, dict) else getattr(saved, "benchmarks", None)
        return cls(losses, _rows(get("log_history")), _rows(get("eval_history")), _benchmark_rows(found))

    @property
    def empty(self) -> bool:
        return not (self.losses or self.log_history or self.eval_history)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rows(found: list[Any]) -> list[dict[str, float]]:
    """The rows that are {key: number} with a numeric ``step``, their other values left out."""
    rows = [
        {k: v for k, v in r.items() if isinstance(k, str) and _number(v)}
        for r in found
        if isinstance(r, dict)
    ]
    return [r for r in rows if "step" in r]


def _benchmark_rows(found: Any) -> list[dict[str, float]]:
    """``TrainResult.benchmarks`` ({"step", "start": rows, "end": rows}) as points: the start at step
    0, the result at its step, a key per task and metric (``task/metric``); [] for anything else."""
    if not isinstance(found, dict) or not _number(found.get("step")):
        return []
    out = []
    for at, key in ((0, "start"), (found["step"], "end")):
        rows = found.get(key) if isinstance(found.get(key), list) else []
        point = {
            f"{r.get('task')}/{r.get('metric')}": r["value"]
            for r in rows
            if isinstance(r, dict) and _number(r.get("value")) and r.get("filter", "none") == "none"
        }
        if point:
            out.append({"step": at, **point})
    return out


def smoothed(values: Sequence[float]) -> list[float]:
    """An exponential moving average, debiased at the start (TensorBoard's smoothing), over about
    a tenth of the points (the span whose EMA weight is 1 - 2 / (span + 1)): a short run is
    barely smoothed, so the smoothed line does not lag a loss that falls fast."""
    span = max(1.0, SMOOTHING_SHARE * len(values))
    weight = min(MAX_SMOOTHING, 1 - 2 / (span + 1))
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last, norm = last * weight + (1 - weight) * v, norm * weight + (1 - weight)
        out.append(last / norm if norm else v)
    return out


def _finite(points: Iterable[tuple[Any, Any]]) -> tuple[Point, ...]:
    out = []
    for x, y in points:
        if _number(x) and _number(y) and math.isfinite(x) and math.isfinite(y):
            out.append((float(x), float(y)))
    return tuple(out)


def _series(rows: list[dict[str, float]], key: str) -> tuple[Point, ...]:
    return _finite((row["step"], row[key]) for row in rows if key in row)


def _matching(rows: list[dict[str, float]], pattern: str) -> list[tuple[str, str]]:
    """(key, its name in the legend) of every key of ``rows`` the pattern matches, in first-seen
    order: a ``*`` matches any part of a key, the first one's part names it (``rewards/*/mean``);
    a plain key is named by its last part (``rewards/chosen``: ``chosen``)."""
    if "*" not in pattern:
        return [(pattern, pattern.rsplit("/", 1)[-1])] if any(pattern in r for r in rows) else []
    head, *rest = pattern.split("*")
    rx = re.compile("^" + re.escape(head) + "(.+)" + ".+".join(re.escape(p) for p in rest) + "$")
    seen: dict[str, str] = {}
    for row in rows:
        for key in row:
            if key not in seen and key != "step" and (m := rx.match(key)):
                seen[key] = m.group(1)
    return list(seen.items())


def _side_lines(rows: list[dict[str, float]], patterns: tuple[str, ...], side: str) -> list[Line]:
    """The lines of one side (TRAIN windows or EVAL evaluations) of a task's panel."""
    found = [(key, name, p) for p in patterns for key, name in _matching(rows, p)]
    out = []
    for key, name, pattern in found:
        named = "*" in pattern or len(found) > 1
        if points := _series(rows, key):
            out.append(Line(points, side, name if named else ""))
    return out


def _loss_panel(h: History) -> Panel | None:
    train = _series(h.log_history, LOSS) or _finite((row[0], row[1]) for row in h.losses if len(row) == 2)
    lines = []
    if train:
        lines.append(Line(train, TRAIN))
        if len(train) >= SMOOTH_FROM:
            ys = smoothed([y for _, y in train])
            lines.append(Line(tuple(zip([x for x, _ in train], ys, strict=True)), SMOOTHED))
    if points := _series(h.eval_history, EVAL_LOSS):
        lines.append(Line(points, EVAL))
    return Panel("loss", tuple(lines)) if lines else None


def panels(history: History, curves: Sequence[Curve] = ()) -> list[Panel]:
    """The run's panels in order (module docstring); those without a point left out."""
    out = [p for p in (_loss_panel(history),) if p is not None]
    if lr := _series(history.log_history, LR):
        out.append(Panel("learning rate", (Line(lr, TRAIN),)))
    drawn = {EVAL_LOSS, "step"}
    for curve in curves:
        lines = _side_lines(history.log_history, curve.train, TRAIN)
        evals = _side_lines(history.eval_history, curve.eval, EVAL)
        drawn |= {k for p in curve.eval for k, _ in _matching(history.eval_history, p)}
        if lines or evals:
            out.append(Panel(curve.title, (*lines, *evals)))
    for key in dict.fromkeys(k for row in history.eval_history for k in row):
        if key not in drawn and (points := _series(history.eval_history, key)):
            out.append(Panel(f"{key.replace('_', ' ')} (eval)", (Line(points, EVAL),)))
    if lines := _side_lines(history.benchmarks, ("*",), EVAL):
        out.append(Panel(BENCHMARKS, tuple(lines)))
    return out
