"""Every run under the runs folder and where it stands, read from its files alone (a studio
started after the run finds it as the one that started it would).

A run is a folder xtrain trained into (``run.output_dir``): its lock while it runs
(``runtime.lock``), its checkpoints, ``train_result.json`` at the end, the end record of the last
launch (``runtime.run_control``) and the history it wrote as it went. A run the studio started has
its launch record beside (``launching.LAUNCH_RECORD``: the process it started, its command, its
log); a recipe's record sits in the recipe's folder, above its stages' folders. The status:

=========== ======================================================================================
running     its lock is held by a live process
starting    its launcher lives, the lock is not taken yet (the model or data loading, an earlier
            stage of its recipe still training)
finished    the last launch ended with 0, or the run holds its result
stopped     the last launch ended on a stop (a checkpoint was saved: Resume goes on from it)
failed      the last launch ended otherwise: its one line
interrupted checkpoints, no result, no record: killed (Resume goes on from the newest checkpoint)
=========== ======================================================================================
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xtrain import structured
from xtrain.model.start import OUTPUT_FOLDERS, RUN_FILE, read_json_object
from xtrain.runtime import lock, run_control
from xtrain.train.checkpoint.layout import RESULT_FILE, STATE_FILE, list_checkpoints
from xtrain.train.run_files import DATA_CHECK, HISTORY, history_line

LAUNCH_RECORD = "studio.json"  # the studio's record of the process it started (launching.py)
LOG = "train.log"
CONFIG = "config.yaml"
MARKS = (
    RESULT_FILE,
    "checkpoints",
    lock.LOCK_NAME,
    HISTORY,
    run_control.END_RECORD,
    LAUNCH_RECORD,
    DATA_CHECK,
)
DEPTH = 3  # folders below the runs folder searched for runs (a quickstart's run-N, a recipe's stages)
LOG_TAIL = 12_000  # characters of the log sent with a run


@dataclass(frozen=True)
class Launch:
    """The studio's launch record: the process it started, when, with what."""

    pid: int
    started: float
    argv: list[str]
    stages: list[str]  # the stages' folders, relative to the record's folder ("." for one run)
    log: str = LOG

    @classmethod
    def read(cls, folder: Path) -> Launch | None:
        return cls.read_file(folder / LAUNCH_RECORD)

    @classmethod
    def read_file(cls, path: Path) -> Launch | None:
        data = read_json_object(path)
        try:
            argv, stages = [str(a) for a in data["argv"]], [str(s) for s in data.get("stages") or ["."]]
            return cls(int(data["pid"]), float(data["started"]), argv, stages, str(data.get("log") or LOG))
        except (KeyError, TypeError, ValueError):
            return None

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=1)

    def alive(self) -> bool:
        """The started process still runs (not a later process with its number)."""
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= self.started + 5
        except (psutil.Error, OSError):
            return False


@dataclass
class Status:
    state: str  # running | starting | finished | stopped | failed | interrupted | not started | empty
    line: str = ""  # a failure's one line, or what a stop left
    step: int | None = None
    total: int | None = None
    stopping: bool = False  # a stop request waits to be honoured


def is_run(folder: Path) -> bool:
    return any((folder / mark).exists() for mark in MARKS)


def launch_of(folder: Path) -> tuple[Path, Launch] | None:
    """The launch record of the run in ``folder``: its own, or its recipe's one folder up."""
    for where in (folder, folder.parent):
        found = Launch.read(where)
        if found is not None and (where == folder or folder.name in found.stages):
            return where, found
    return None


def _progress(folder: Path) -> tuple[int | None, int | None]:
    """(the last step it logged, its total steps) from its files."""
    result = read_json_object(folder / RESULT_FILE)
    found = list_checkpoints(folder)
    state = read_json_object(found[-1][1] / STATE_FILE) if found else {}
    logged = _last_logged(folder)
    step = result.get("final_step", logged if logged is not None else state.get("step"))
    total = result.get("total_steps", state.get("total_steps"))
    if total is None:
        total = config_value(folder, "run", "max_steps")
    whole = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in (step, total)]
    return whole[0], whole[1]


def _last_logged(folder: Path) -> int | None:
    """The step of the last logging window in ``history.jsonl``, read from its end (a long run's
    history is not read whole every time a page asks)."""
    path, size = folder / HISTORY, 4096
    try:
        cut = path.stat().st_size > size
    except OSError:
        return None
    lines = tail(path, size).split("\n")
    for line in reversed(lines[1 if cut else 0 : -1]):  # whole lines only
        found = history_line(line)
        if found is not None and found[0] == "log":
            return int(found[1]["step"])
    return None


def status(folder: Path) -> Status:
    """Where the run in ``folder`` stands, from its files (module docstring)."""
    if not folder.exists():  # a recipe's stage not started yet
        launched = launch_of(folder)
        if launched is not None and launched[1].alive():
            return Status("starting", "waits for the stages before it")
        return Status("not started", "a stage before it did not finish: Resume the recipe")
    step, total = _progress(folder)
    stopping = run_control.stop_pending(folder)  # (said only while it runs: a run that ended first left it)
    if lock.live_holder(folder) is not None:
        return Status("running", step=step, total=total, stopping=stopping)
    launched = launch_of(folder)
    end = run_control.read_end(folder)
    if launched is not None and end is not None and end.ended < launched[1].started - 1:
        end = None  # the record of an earlier launch
    if launched is not None and end is None and launched[1].alive():
        if (folder / RESULT_FILE).is_file():  # a recipe's finished stage its resume skips
            return Status("finished", step=step, total=total)
        return Status("starting", step=step, total=total, stopping=stopping)
    if end is not None:
        state = "finished" if end.exit_code == 0 else "stopped" if end.stopped else "failed"
        return Status(state, end.line, step, total)
    if (folder / RESULT_FILE).is_file():
        return Status("finished", step=step, total=total)
    if list_checkpoints(folder):
        said = "it ended without a word (killed?): Resume goes on from its newest checkpoint"
        return Status("interrupted", said, step, total)
    if launched is not None:
        return Status("failed", last_error(launched[0] / launched[1].log), step, total)
    return Status("empty", step=step, total=total)


def last_error(log: Path) -> str:
    """The line a failed launch ended with: the last ``error:`` line of its log, else its last line."""
    lines = [ln.strip() for ln in tail(log).splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("error:")]
    return (said or lines or ["it ended before writing anything (no log)"])[-1]


def tail(path: Path, size: int = LOG_TAIL) -> str:
    """The end of a text file ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def config_of(folder: Path) -> dict[str, Any]:
    """The run's config as plain data: its newest checkpoint's, else the YAML the studio saved
    for it ({} when neither)."""
    found = list_checkpoints(folder)
    config = read_json_object(found[-1][1] / STATE_FILE).get("config") if found else None
    if isinstance(config, dict):
        return config
    for path in (folder / CONFIG, folder.parent / f"{folder.name}.yaml"):  # (a recipe's stage: beside)
        with contextlib.suppress(Exception):
            data = structured.load_yaml(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                return data
    return {}


def config_value(folder: Path, section: str, key: str) -> Any:
    part = config_of(folder).get(section)
    return part.get(key) if isinstance(part, dict) else None


def record_of(folder: Path) -> dict[str, Any]:
    """``xtrain_run.json`` saved with its result ({}: not finished)."""
    return next((r for name in OUTPUT_FOLDERS if (r := read_json_object(folder / name / RUN_FILE))), {})


@dataclass
class RunEntry:
    """A run as the runs list shows it."""

    path: str  # relative to the runs folder, with forward slashes (the run's id)
    name: str
    task: str
    model: str
    status: Status
    lineage: list[str] = field(default_factory=list)  # the folders of the stages it continues
    recipe: str | None = None  # the recipe folder it is a stage of
    modified: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": asdict(self.status)}


def entry(root: Path, folder: Path) -> RunEntry:
    record = record_of(folder)
    model = config_value(folder, "model", "name_or_path") or "?"
    task = record.get("task") or config_value(folder, "model", "task") or "?"
    lineage = [str(e.get("source")) for e in record.get("lineage") or [] if isinstance(e, dict)]
    launched = launch_of(folder)
    recipe = launched[0] if launched is not None and launched[0] != folder else None
    try:
        modified = max(p.stat().st_mtime for p in (folder, *(folder / m for m in MARKS)) if p.exists())
    except (OSError, ValueError):
        modified = 0.0
    return RunEntry(
        relative(root, folder), folder.name, str(task), str(model), status(folder), lineage,
        relative(root, recipe) if recipe is not None else None, modified,
    )  # fmt: skip


def relative(root: Path, folder: Path) -> str:
    return folder.resolve().relative_to(root.resolve()).as_posix()


def _recipe(folder: Path) -> bool:
    """A recipe's folder: its launch record names stages in folders of their own."""
    found = Launch.read(folder)
    return found is not None and found.stages != ["."]


def find(root: Path) -> list[Path]:
    """Every run folder under ``root`` (``DEPTH`` levels at most; a run's own folders are not
    searched, a recipe's folder is: its stages are runs)."""
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            if _recipe(child):  # its stages, also those not started yet (their folders come later)
                record = Launch.read(child)
                stages = [child / name for name in (record.stages if record is not None else [])]
                found.extend(stage for stage in stages if is_run(stage) or not stage.exists())
            elif is_run(child):
                found.append(child)
            elif depth > 1:
                walk(child, depth - 1)

    walk(root, DEPTH)
    return found


def list_runs(root: Path) -> list[RunEntry]:
    entries = [entry(root, f) for f in find(root)]
    return sorted(entries, key=lambda e: e.modified, reverse=True)
