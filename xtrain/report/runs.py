"""A run folder as ``xtrain report`` shows it, read from the files the run wrote (nothing is
loaded): ``train_result.json`` (its history, evaluations, how it ran), its newest checkpoint's
``xtrain_state.json`` (the config; the history of a run that has not finished, or its
``history.jsonl`` where that holds more: what it logged since its last checkpoint), the record saved
with its adapter (``xtrain_run.json``: its task, data settings, a chain's ``lineage``), and the
files kept for a person (``train/run_files.py``: the data check, the evaluations' samples; the
quickstart's before/after answers). Several runs that form a chain are put in its order."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError
from xtrain.runtime.lock import LOCK_NAME
from xtrain.train.checkpoint.layout import RESULT_FILE, STATE_FILE, list_checkpoints
from xtrain.train.curves import History
from xtrain.train.result import RUN_FILE
from xtrain.train.run_files import ANSWERS, DATA_CHECK, read_history, read_samples
from xtrain.trained import OUTPUT_FOLDERS, read_json_object

STARTED = (LOCK_NAME, DATA_CHECK, "logs", "checkpoints")  # what a run that has started leaves


@dataclass
class RunView:
    """One run folder, read."""

    folder: Path
    name: str  # how the report names it (its folder's name; made unique among several)
    result: dict[str, Any]  # train_result.json ({}: not finished)
    state: dict[str, Any]  # the newest checkpoint's xtrain_state.json ({}: none)
    record: dict[str, Any]  # xtrain_run.json saved with the adapter ({}: none yet)
    data_check: dict[str, Any] | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)  # [{"step", "samples": [...]}]
    answers: dict[str, Any] | None = None  # the quickstart's before/after answers
    live: History | None = None  # history.jsonl: what the run logged as it went (None: none)

    @property
    def finished(self) -> bool:
        return bool(self.result)

    @cached_property
    def history(self) -> History:
        saved = History.of(self.result if self.finished else self.state)
        if self.finished or self.live is None:
            return saved
        return self.live if _rows(self.live) >= _rows(saved) else saved

    def figure(self, key: str, default: float = 0) -> float:
        """A number the run recorded (its result's, else its newest checkpoint's); ``default``
        where it recorded none (or a file edited by hand holds something else)."""
        for found in (self.result.get(key), self.state.get(key)):
            if isinstance(found, (int, float)) and not isinstance(found, bool):
                return found
        return default

    @property
    def config(self) -> dict[str, dict[str, Any]]:
        found = self.state.get("config")
        return found if isinstance(found, dict) else {}

    def setting(self, section: str, key: str, default: Any = None) -> Any:
        part = self.config.get(section)
        return part.get(key, default) if isinstance(part, dict) else default

    @property
    def task(self) -> str:
        return str(self.record.get("task") or self.setting("model", "task") or "?")

    @property
    def model(self) -> str:
        return str(self.setting("model", "name_or_path") or "?")

    @property
    def steps(self) -> int:
        """The optimizer steps it trained (its end's, else its newest checkpoint's, or its
        history's where it logged further)."""
        logged = max((r["step"] for r in self.history.log_history), default=0)
        return int(max(self.figure("final_step", self.figure("step")), 0 if self.finished else logged))

    @property
    def lineage(self) -> list[dict[str, Any]]:
        """The chain it continues, oldest stage first (``xtrain_run.json``'s ``lineage``; [] for a
        run that started from a base model)."""
        found = self.record.get("lineage")
        return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def _rows(history: History) -> int:
    return len(history.log_history) + len(history.eval_history) or len(history.losses)


def _run_folder(path: Path) -> Path:
    """The run folder ``path`` names: itself, or the run holding it (an ``adapter/``, ``best/``)."""
    if path.name in OUTPUT_FOLDERS and (path.parent / RESULT_FILE).is_file():
        return path.parent
    return path


def _runs_inside(folder: Path) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and (p / RESULT_FILE).is_file())
    except OSError:
        return []


def read_run(path: str | Path) -> RunView:
    """The run in ``path``; one line when it is no run, or a run with no history yet."""
    folder = _run_folder(Path(path).expanduser())
    if not folder.is_dir():
        raise XtrainError(f"{folder} is not a folder", "pass a run's output folder (run.output_dir)")
    result = read_json_object(folder / RESULT_FILE)
    found = list_checkpoints(folder)
    state = read_json_object(found[-1][1] / STATE_FILE) if found else {}
    live = read_history(folder)
    if not result and not state and (live is None or live.empty):
        inside = _runs_inside(folder)
        if inside:
            shown = ", ".join(inside[:3]) + (", ..." if len(inside) > 3 else "")
            raise XtrainError(
                f"{folder} holds runs, it is not one ({shown})", f"name a run: {folder / inside[-1]}"
            )
        if any((folder / name).exists() for name in STARTED):
            raise XtrainError(
                f"{folder} has no history yet: the run has written no checkpoint and not finished",
                "report it after its first checkpoint (run.save_every) or its end",
            )
        raise XtrainError(
            f"{folder} is not an xtrain run (no {RESULT_FILE}, no checkpoints/)",
            "pass the run.output_dir of a training run",
        )
    for key in ("run_info", "outputs", "eval_metrics"):  # (a file edited by hand: other shapes left out)
        if not isinstance(result.get(key, {}), dict):
            result[key] = {}
    record = next((r for name in OUTPUT_FOLDERS if (r := read_json_object(folder / name / RUN_FILE))), {})
    check = read_json_object(folder / DATA_CHECK) or None
    answers = read_json_object(folder / ANSWERS) or None
    view = RunView(folder, folder.name, result, state, record, check, read_samples(folder), answers, live)
    if view.history.empty:
        raise XtrainError(
            f"{folder} has no history yet: no training step logged, no evaluation",
            "report it after its first logged step and checkpoint (run.log_every, run.save_every)",
        )
    return view


def _same(a: str | Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def same_folder(source: str, folder: Path) -> bool:
    """A lineage entry's ``source`` names the run in ``folder`` (its folder, or a result folder in it)."""
    return _same(source, folder) or _same(Path(source).parent, folder)


def continues(later: RunView, earlier: RunView) -> bool:
    """``later``'s lineage names ``earlier`` (its folder, or a result folder in it) as a source."""
    return any(
        isinstance(source := entry.get("source"), str) and same_folder(source, earlier.folder)
        for entry in later.lineage
    )


def in_order(runs: list[RunView]) -> tuple[list[RunView], bool]:
    """The runs as stages of a chain (each continuing one before it, ordered by how long its
    lineage is), and True; else as given, and False."""
    if len(runs) < 2 or not any(r.lineage for r in runs):
        return runs, False
    staged = sorted(runs, key=lambda r: len(r.lineage))
    chained = all(continues(b, a) for a, b in zip(staged, staged[1:], strict=False))
    return (staged, True) if chained else (runs, False)


def read_runs(paths: list[str | Path]) -> tuple[list[RunView], bool]:
    """The runs of ``paths`` (each read, each named uniquely), in a chain's order when they form
    one; the flag says whether they do."""
    runs = [read_run(p) for p in paths]
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name} ({seen[run.name]})"
    return in_order(runs)
