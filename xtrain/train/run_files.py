"""What a run writes into its folder for a person to look at (the main process): its curves as a
picture (``curves.png``, redrawn at an evaluation, at most once every ``REDRAW_S`` seconds, and at
the end, from the run's history, so a resumed run continues the same curves), its history as it
goes (``history.jsonl``: a line per logging window and per evaluation, appended as each closes, so
a page can draw the curves while the run trains; a resumed run's file is its checkpoint's history,
then goes on), its evaluations' sample answers (``eval_samples.json``) and its data check
(``data_check.json``, the dry run's report of the rows it loaded). ``xtrain report`` and ``xtrain
studio`` read them. None of it may end a run: a failure is one warning line."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import atomic, structured
from xtrain.train.curves import History, panels

if TYPE_CHECKING:
    from collections.abc import Callable

    from xtrain.tasks.contract import Curve
    from xtrain.tasks.data_report import DataReport

CURVES = "curves.png"
SAMPLES = "eval_samples.json"  # {"evaluations": [{"step": N, "samples": [Prediction as a dict]}]}
DATA_CHECK = "data_check.json"  # tasks.data_report.DataReport as a dict
# xtrain quickstart's eval prompts answered by the base model and the result (commands/quickstart.py):
# {"rows": [{"prompt", "base", "trained", "reference"}], "metrics": {name: {"base", "trained"}}}
ANSWERS = "answers.json"
# one JSON object a line: {"kind": "log" | "eval", "step": N, ...what the window or evaluation
# logged}; each line written whole in one append, so a reader sees whole lines and at most a
# partial last one, which it leaves for later
HISTORY = "history.jsonl"
LOG, EVAL = "log", "eval"
# a drawing costs a few tenths of a second of CPU: a real run's evaluations (minutes apart) each
# redraw it; a short run's many evaluations do not spend that time on pictures nobody opens yet
REDRAW_S = 30.0


def read_samples(out: Path) -> list[dict[str, Any]]:
    """The evaluations' samples a run wrote, oldest first ([] where there are none or the file is
    not one of ours)."""
    try:
        data = structured.load_json((out / SAMPLES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    found = data.get("evaluations") if isinstance(data, dict) else None
    rows = [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []
    return [e for e in rows if isinstance(e.get("step"), int) and isinstance(e.get("samples"), list)]


def history_line(text: str) -> tuple[str, dict[str, float]] | None:
    """One line of ``history.jsonl`` as (its kind, its row with ``step``); None for anything else
    (a partial or damaged line, an edit by hand)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("kind") not in (LOG, EVAL):
        return None
    kind = data.pop("kind")
    rows = History.of({"log_history": [data]}).log_history  # numbers only, with a numeric step
    return (kind, rows[0]) if rows else None


def read_history(out: Path) -> History | None:
    """The history a run wrote as it went (None: no ``history.jsonl``); a partial last line is
    left out."""
    try:
        text = (out / HISTORY).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    history = History()
    for line in text.split("\n")[:-1]:  # the part after the last newline is not whole yet
        found = history_line(line)
        if found is not None:
            (history.log_history if found[0] == LOG else history.eval_history).append(found[1])
    return history


def _history_text(history: History) -> str:
    rows = [(r["step"], 0, LOG, r) for r in history.log_history]
    rows += [(r["step"], 1, EVAL, r) for r in history.eval_history]
    return "".join(_line(kind, row) for _, _, kind, row in sorted(rows, key=lambda r: r[:2]))


def _line(kind: str, row: dict[str, Any]) -> str:
    return json.dumps({"kind": kind, **row}, ensure_ascii=False, allow_nan=True) + "\n"


def _length(history: History) -> int:
    """How much a history holds: a drawing of it is stale once it grew."""
    return len(history.losses) + len(history.log_history) + len(history.eval_history)


def title_of(out: Path, task: str, model: str) -> str:
    """The picture's title: the run's folder, its task and its model (a local one by its folder's
    name, not its whole path)."""
    shown = Path(model).name if Path(model).is_dir() else model
    return f"{out.name}: {task} on {shown}"


class RunFiles:
    """The files of one run's main process; each call returns its warning lines (a failure said
    once per kind of file, the run going on)."""

    def __init__(self, out: Path, curves: tuple[Curve, ...], title: str) -> None:
        self.out, self.curves, self.title = out, curves, title
        self.warned: set[str] = set()
        self.drawn: tuple[float, int] | None = None  # (when, the history's length) of the last drawing

    @property
    def picture(self) -> Path | None:
        path = self.out / CURVES
        return path if path.is_file() else None

    def started(
        self, report: DataReport | None, start_step: int, history: History | None = None
    ) -> list[str]:
        """The data check saved; ``history.jsonl`` started over with ``history`` (the checkpoint's
        a resumed run goes on from; a new run's is empty); the samples of evaluations after
        ``start_step`` dropped (a resumed run evaluates them again; a new run in the folder starts
        the file over)."""
        notes = self._safely("the data check", lambda: self._data_check(report))
        text = _history_text(history or History())
        notes += self._safely("the history", lambda: atomic.write_text(self.out / HISTORY, text))
        if not start_step:  # a new run: an earlier run's picture is not this one's
            notes += self._safely("the curves", lambda: (self.out / CURVES).unlink(missing_ok=True))
        kept = [e for e in read_samples(self.out) if start_step and e.get("step", 0) <= start_step]
        return notes + self._safely("the eval samples", lambda: self._write_samples(kept))

    def logged(self, row: dict[str, float]) -> list[str]:
        """A logging window's row (``step`` and what it logged) appended to ``history.jsonl``."""
        return self._safely("the history", lambda: self._append(LOG, row))

    def evaluated(self, step: int, samples: list[dict[str, Any]], history: History) -> list[str]:
        """An evaluation's samples kept (with the earlier ones'), its row appended to the
        history, the curves redrawn."""
        notes = []
        if history.eval_history and history.eval_history[-1].get("step") == step:
            notes += self._safely("the history", lambda: self._append(EVAL, history.eval_history[-1]))
        if samples:
            kept = [e for e in read_samples(self.out) if e.get("step", 0) < step]
            entry = {"step": step, "samples": samples}
            notes += self._safely("the eval samples", lambda: self._write_samples([*kept, entry]))
        if self.drawn is not None and time.monotonic() - self.drawn[0] < REDRAW_S:
            return notes  # drawn a moment ago: the end draws the rest
        return notes + self.draw(history)

    def finished(self, history: History) -> list[str]:
        """The curves drawn at the end, unless the last drawing already holds the whole history."""
        if self.drawn is not None and self.drawn[1] == _length(history):
            return []
        return self.draw(history)

    def draw(self, history: History) -> list[str]:
        """``curves.png`` from the history, once the run has trained a window (before its first,
        an evaluation at step 0 has nothing to draw against)."""
        if not (history.losses or history.log_history):
            return []
        self.drawn = (time.monotonic(), _length(history))
        return self._safely("the curves", lambda: self._draw(history))

    def _draw(self, history: History) -> None:
        from xtrain.train.plot import png

        atomic.write_bytes(self.out / CURVES, png(panels(history, self.curves), self.title))

    def _append(self, kind: str, row: dict[str, Any]) -> None:
        with open(self.out / HISTORY, "a", encoding="utf-8") as f:
            f.write(_line(kind, row))  # one write of a whole line; flushed as the file closes

    def _data_check(self, report: DataReport | None) -> None:
        if report is not None:
            atomic.write_text(self.out / DATA_CHECK, json.dumps(asdict(report), indent=1, default=str))

    def _write_samples(self, evaluations: list[dict[str, Any]]) -> None:
        if evaluations or (self.out / SAMPLES).exists():
            text = json.dumps({"evaluations": evaluations}, indent=1, ensure_ascii=False, default=str)
            atomic.write_text(self.out / SAMPLES, text)

    def _safely(self, what: str, write: Callable[[], None]) -> list[str]:
        try:
            write()
        except Exception as e:  # noqa: BLE001 - a picture or a side file never ends a run
            if what in self.warned:
                return []
            self.warned.add(what)
            hint = " (pip install matplotlib)" if isinstance(e, ImportError) else ""
            why = f"{type(e).__name__}: {e}{hint}"
            return [f"warning: {what} not written to {self.out}: {why}; training goes on"]
        return []
