"""What ``--tasks`` (and a run's ``eval.benchmarks``) names, read before any model loads: lm-eval's
own task and group names (``gsm8k``, ``mmlu``, ``arc_easy``), the user's task YAML files (run
offline from local data: ``dataset_path: json`` with ``dataset_kwargs.data_files``), and folders
of them (every task and group in the folder, a task inside a group of the folder once, through
the group). ``resolve`` reads the files (one that does not parse, or is not a task, is one line);
``check`` asks lm-eval's own index for the names (an unknown one is one line, with the names
closest to it) and builds every task, its data read, so a missing data file or dataset is one line
before the first model loads."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

YAML = (".yaml", ".yml")
EXAMPLE = "e.g. --tasks arc_easy,gsm8k or --tasks my_tasks/ (lm-eval task YAML files)"


@dataclass(frozen=True)
class Benchmarks:
    """The tasks to score: ``specs`` as lm-eval takes them (names, absolute YAML paths), in the
    order given; ``include``: the folders lm-eval indexes besides its own tasks; ``defaults``:
    whether a name needs lm-eval's own tasks indexed (seconds: thousands of files)."""

    specs: tuple[str, ...]
    include: tuple[str, ...] = ()
    defaults: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"specs": list(self.specs), "include": list(self.include), "defaults": self.defaults}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Benchmarks:
        return cls(tuple(data["specs"]), tuple(data["include"]), bool(data["defaults"]))

    @property
    def shown(self) -> str:
        """The tasks in one line: names as they are, files and folders by their names."""
        return ", ".join(Path(s).stem if s.endswith(YAML) else s for s in self.specs)


def split(given: str | list[str] | tuple[str, ...] | None, key: str = "--tasks") -> list[str]:
    """``a,b`` or a list of items, each stripped; none at all is one line."""
    items = given.split(",") if isinstance(given, str) else list(given or [])
    items = [str(i).strip() for i in items if str(i).strip()]
    if not items:
        raise XtrainError(f"{key} names no task", EXAMPLE)
    return items


def _looks_like_path(item: str) -> bool:
    return item.lower().endswith(YAML) or "/" in item or "\\" in item or Path(item).expanduser().exists()


def read_task_file(path: Path) -> dict[str, Any]:
    """A task YAML as lm-eval reads it (its ``include:`` files merged, ``!function`` left unresolved);
    one line when it does not parse or is not a task or group."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        cfg = load_yaml(path, resolve_func=False)
    except Exception as e:  # yaml's errors, a missing include, an include cycle
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise XtrainError(
            f"task file {path} does not parse: {reason}", "fix its YAML (lm-eval's task format)"
        ) from None
    if not any(k in cfg for k in ("task", "group", "class")):
        raise XtrainError(
            f"task file {path} is not an lm-eval task: it has no task: or group: key",
            "name the task with task: NAME (docs/evaluation.md has an example)",
        )
    return cfg


def _folder_tasks(folder: Path, key: str) -> list[str]:
    """The tasks and groups of a folder's YAML files, a task that one of them groups left to it."""
    from lm_eval.tasks._index import Kind, TaskIndex

    index = TaskIndex.build([folder])
    grouped: set[str] = set()
    for entry in index.values():
        if entry.kind == Kind.GROUP and entry.cfg is not None:
            members = entry.cfg.get("task") or []
            grouped |= {
                m for m in (members if isinstance(members, list) else [members]) if isinstance(m, str)
            }
    kinds = (Kind.TASK, Kind.PY_TASK, Kind.GROUP)
    names = [name for name, entry in index.items() if entry.kind in kinds and name not in grouped]
    if not names:
        raise XtrainError(
            f"{key} {folder} holds no lm-eval task YAML file", "put task YAML files there, or name tasks"
        )
    return names


def resolve(given: list[str], key: str = "--tasks") -> Benchmarks:
    """The items of ``--tasks`` (``key``: where they were given) read: a folder's tasks found, a
    file read (one line each when it is missing or does not parse), a name kept for ``check``."""
    specs, include, defaults = [], [], False
    for item in given:
        path = Path(item).expanduser()
        if not _looks_like_path(item):
            specs.append(item)
            defaults = True
        elif path.is_dir():
            include.append(str(path.resolve()))
            specs += _folder_tasks(path, key)
        elif path.is_file():
            read_task_file(path)
            specs.append(str(path.resolve()))
        else:
            raise XtrainError(
                f"task file {item} not found", "give an lm-eval task name, or a YAML file or folder"
            )
    return Benchmarks(tuple(dict.fromkeys(specs)), tuple(dict.fromkeys(include)), defaults)


def check(bench: Benchmarks, manager: TaskManager, key: str = "--tasks") -> None:
    """Every name known to lm-eval (one line naming the closest ones otherwise) and every task
    built, its data read (one line naming the task and lm-eval's or datasets' reason)."""
    known = set(manager.all_tasks)
    for spec in bench.specs:
        if spec.endswith(YAML) or spec in known:
            continue
        close = difflib.get_close_matches(spec, sorted(known), n=3, cutoff=0.6)
        raise XtrainError(
            f"{key} {spec}: lm-evaluation-harness knows no task or group of that name",
            f"did you mean {', '.join(close)}?"
            if close
            else "lm-eval ls tasks lists them; or give a task YAML file",
        )
    for spec in bench.specs:
        try:
            manager.load([spec])
        except Exception as e:  # a dataset not found or offline, a template error, a bad key
            reason = " ".join(str(e).split())[:240] or type(e).__name__
            name = Path(spec).name if spec.endswith(YAML) else spec
            raise XtrainError(
                f"task {name} cannot be loaded: {reason}",
                "check its dataset_path and data_files (a hub dataset needs the network once)",
            ) from None
