"""What a trained result is: the folder holding it (``model_folder``: an adapter, a full model, or
a run's output folder), the task it was trained for (``run_task``: the run's record
``xtrain_run.json`` next to the adapter, else the config in its checkpoints, else the head its
config names), how its base was loaded (``trained_quantization``) and the run's data settings
(``run_data``). Read from the files a run writes; nothing is loaded. ``xtrain predict``, ``xtrain
chat`` and ``xtrain export`` start from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xtrain import tasks
from xtrain.model.start import OUTPUT_FOLDERS, RUN_FILE, model_folder, read_json_object
from xtrain.train.checkpoint.layout import STATE_FILE, list_checkpoints

__all__ = [
    "OUTPUT_FOLDERS",
    "RunTask",
    "has_chat_template",
    "model_folder",
    "read_json_object",
    "run_data",
    "run_task",
    "trained_quantization",
]


@dataclass
class RunTask:
    """What a result was trained for: ``task`` (None: not recorded) and chat conversations;
    ``templated``: a folder xtrain did not train (no record, no checkpoints) whose tokenizer has
    a chat template, so its prompts are rendered through it (``chat`` is then true)."""

    task: str | None
    chat: bool = False
    record: dict[str, Any] = field(default_factory=dict, compare=False)
    templated: bool = False


# where ``save_pretrained`` keeps a tokenizer's chat template: its own file (transformers >= 4.47)
# or a key of tokenizer_config.json (older saves, and most models on the hub)
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def has_chat_template(folder: Path) -> bool:
    """The tokenizer saved in ``folder`` carries a chat template."""
    if any((folder / name).is_file() for name in _TEMPLATE_FILES):
        return True
    return bool(read_json_object(folder / "tokenizer_config.json").get("chat_template"))


def _checkpoint_section(folder: Path, section: str) -> dict[str, Any]:
    """A section (``model``, ``data``) of the config saved in the newest checkpoint of the run
    ``folder`` is in ({} when there is none)."""
    if folder.name not in OUTPUT_FOLDERS:
        return {}
    found = list_checkpoints(folder.parent)
    config = read_json_object(found[-1][1] / STATE_FILE).get("config") if found else None
    part = config.get(section) if isinstance(config, dict) else None
    return part if isinstance(part, dict) else {}


def _checkpoint_model(folder: Path) -> dict[str, Any]:
    return _checkpoint_section(folder, "model")


def _checkpoint_task(folder: Path) -> str | None:
    """The ``model.task`` of the config saved in the newest checkpoint of the run ``folder`` is in."""
    task = _checkpoint_model(folder).get("task")
    return task if isinstance(task, str) else None


def trained_quantization(folder: Path, trained: RunTask) -> str | None:
    """How the run loaded the base of the adapter in ``folder`` (``model.quantization``: 4bit,
    8bit, None): its record's word, else its newest checkpoint's config (runs recorded before
    the record said it)."""
    if "quantization" in trained.record:
        found = trained.record["quantization"]
    else:
        found = _checkpoint_model(folder).get("quantization")
    return found if found in ("4bit", "8bit") else None


def _head_task(folder: Path) -> str | None:
    """The task whose head a result's config names (``architectures``, peft's ``task_type``):
    the first task of the registry that ``recognizes`` it."""
    config = {**read_json_object(folder / "config.json"), **read_json_object(folder / "adapter_config.json")}
    base = config.get("base_model_name_or_path")
    if isinstance(base, str) and Path(base).is_dir():  # an adapter: its base's architectures
        config = {**read_json_object(Path(base) / "config.json"), **config}
    for task in tasks.all_tasks().values():
        if task.recognizes is not None and task.recognizes(config):
            return task.name
    return None


def run_task(folder: Path) -> RunTask:
    """What the result in ``folder`` was trained for: the run's own record first (``RUN_FILE``,
    saved with the adapter), then its checkpoints' config, then the model's head."""
    record = read_json_object(folder / RUN_FILE)
    if isinstance(record.get("task"), str):
        return RunTask(record["task"], bool(record.get("chat")), record)
    trained = _checkpoint_task(folder)
    if trained is not None:
        return RunTask(trained)
    # a base model (or a bare adapter) that xtrain did not train: a chat model is prompted as one
    templated = has_chat_template(folder)  # the tokenizer predict loads is the one saved here
    return RunTask(_head_task(folder), chat=templated, templated=templated)


def run_data(folder: Path, trained: RunTask) -> dict[str, Any]:
    """The run's data settings (columns, row format, media roots, ...): its record's, else its
    newest checkpoint's config's; {} (the defaults) when neither says."""
    found = trained.record.get("data")
    if not isinstance(found, dict):
        found = _checkpoint_section(folder, "data")
    return found if isinstance(found, dict) else {}
