"""The new-run form: what it offers (``catalog``: every task, each task's built-in jobs, every
config key with its default and its choices, the models at hand) and what it makes (``compose``:
the form's values as the YAML of each stage, written where the run will live).

The YAML holds what the user chose and nothing more: the built-in job they started from (its own
keys), the keys they changed, and ``run.output_dir`` (the run's folder under the runs folder).
Every value is read by the config's own parser (``config.loading.parse_override``), so a value
means in the form what it means after ``key=`` on the command line; the whole config is checked by
``train.stages.load_stages``, as ``xtrain train`` checks it (``check.py``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from xtrain import builtin, structured, tasks
from xtrain.config.loading import parse_override
from xtrain.config.schema import TrainConfig, config_keys
from xtrain.config.values import CHOICES, LIST_CHOICES, resolve_key
from xtrain.errors import XtrainError, shown
from xtrain.studio.runs import CONFIG, list_runs
from xtrain.tasks.contract import EVERY_KEY
from xtrain.tasks.validation import task_keys
from xtrain.train.stages import PREVIOUS

# the keys the form shows first; the rest are in its "all keys" view
MAIN_KEYS = (
    "model.name_or_path", "data.train", "data.eval", "data.max_length", "lora.r", "lora.alpha",
    "optim.lr", "batch.per_device", "batch.global_batch", "run.max_steps", "run.epochs",
    "run.eval_every", "run.save_every", "run.log_every", "run.mixed_precision",
)  # fmt: skip
PATH_KEYS = ("model.name_or_path", "data.train", "data.eval")  # made absolute (the run's cwd is its folder)
_NAME = re.compile(r"^[^/\\:*?\"<>|\x00-\x1f]{1,80}$")  # a folder name on every OS


def _text(value: Any) -> str:
    """A value as the form shows it (what ``key=`` would take): YAML's flow style, one line."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def _flat(mapping: dict[str, Any]) -> dict[str, str]:
    return {
        f"{s}.{k}": _text(v) for s, part in mapping.items() if isinstance(part, dict) for k, v in part.items()
    }


def job_mapping(name: str) -> dict[str, Any]:
    """A built-in job's YAML as written (its keys only)."""
    path = tasks.job_file(tasks.quickstarts()[name])
    data = structured.load_yaml(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _takes(task: tasks.Task) -> dict[str, bool]:
    """What its results answer in Try (``Predicts.takes``)."""
    said = task.predicts.takes if task.predicts is not None else ""
    return {
        "text": "--prompt" in said or "--question" in said,
        "image": "image" in said,
        "audio": "audio" in said,
        "tools": bool(task.predicts is not None and task.predicts.tools),
    }


def catalog(root: Path) -> dict[str, Any]:
    """Everything the form offers (plain data for the page)."""
    defaults = dataclasses.asdict(TrainConfig())
    keys = []
    for key in config_keys():
        section, name = key.split(".")
        choices = CHOICES.get(key) or LIST_CHOICES.get(key) or ()
        keys.append({"key": key, "default": _text(defaults[section][name]), "choices": list(choices)})
    owners = {name: tasks.quickstart_task(name).name for name in tasks.quickstarts()}
    jobs = {
        name: {"task": owners[name], "about": job.about, "values": _flat(job_mapping(name))}
        for name, job in tasks.quickstarts().items()
    }
    specific = task_keys()  # the task-specific keys and the tasks that read them
    found = [
        {
            "name": t.name,
            "about": t.about,
            "takes": _takes(t),
            "jobs": [j for j, o in owners.items() if o == t.name],
            "keys": sorted(k for k, readers in specific.items() if t.name in readers or EVERY_KEY in t.keys),
        }
        for t in tasks.all_tasks().values()
    ]
    trained = [str((root / e.path).resolve()) for e in list_runs(root) if e.status.state == "finished"]
    models = [f"{builtin.PREFIX}{m}" for m in (*builtin.MODELS, *builtin.STAGES)]
    return {
        "tasks": found, "jobs": jobs, "keys": keys, "main": list(MAIN_KEYS), "models": models,
        "specific": sorted(specific),
        "trained": trained, "runs_folder": str(root), "default_job": tasks.default_quickstart(),
    }  # fmt: skip


@dataclass
class StageDraft:
    """One stage as the form made it: its YAML and where it goes."""

    config: Path  # where its YAML is saved
    output_dir: Path
    text: str  # the YAML
    task: str


@dataclass
class Draft:
    """The run the form describes: its folder under the runs folder, its stages in order, and
    where it runs (``xtrain train``'s ``--gpus`` and ``--processes``; None: every GPU, one
    process each)."""

    folder: Path
    stages: list[StageDraft]
    gpus: list[int] | None = None
    processes: int | None = None

    @property
    def flags(self) -> list[str]:
        """The ``xtrain train`` options that say where it runs."""
        gpus = ["--gpus", ",".join(map(str, self.gpus))] if self.gpus is not None else []
        return gpus + (["--processes", str(self.processes)] if self.processes is not None else [])

    @property
    def stage_names(self) -> list[str]:
        """The stages' folders relative to ``folder`` (``["."]`` for one run)."""
        if len(self.stages) == 1:
            return ["."]
        return [s.output_dir.name for s in self.stages]


def run_name(given: Any) -> str:
    name = str(given or "").strip()
    if not _NAME.match(name) or name in (".", "..") or name.startswith(".") or name != name.rstrip(". "):
        raise XtrainError(
            f"the run's name {shown(name)} cannot be a folder name",
            'use letters, digits, spaces, - and _ (no / \\ : * ? " < > |, no leading dot)',
        )
    return name


def _set(mapping: dict[str, Any], key: str, value: Any) -> None:
    section, name = key.split(".")
    part = mapping.setdefault(section, {})
    if not isinstance(part, dict):
        part = mapping[section] = {}
    part[name] = value


def _absolute(value: Any, cwd: Path) -> Any:
    """A path typed relative to where the studio was started, made absolute (builtin names,
    hub ids and ``previous`` stay)."""
    if isinstance(value, list):
        return [_absolute(v, cwd) for v in value]
    if not isinstance(value, str) or value == PREVIOUS or builtin.is_builtin(value):
        return value
    path = Path(value).expanduser()
    return str((cwd / path).resolve()) if not path.is_absolute() and (cwd / path).exists() else value


def stage_mapping(stage: dict[str, Any], number: int, cwd: Path) -> dict[str, Any]:
    """One stage's config as a mapping: its job's keys (or its task alone), then the form's."""
    job = stage.get("job") or None
    if job is not None and job not in tasks.quickstarts():
        raise XtrainError(f"unknown built-in job {shown(job)}", f"one of: {', '.join(tasks.quickstarts())}")
    mapping = job_mapping(job) if job else {"model": {"task": str(stage.get("task") or "")}}
    if number > 1 and not job:
        _set(mapping, "model.name_or_path", PREVIOUS)
    values = stage.get("values") or {}
    if not isinstance(values, dict):
        raise XtrainError("the form's values are not a mapping", "reload the page")
    for key, text in values.items():
        section, _, name = str(key).partition(".")
        key = resolve_key(section, name, " in the form")
        if text is None or str(text).strip() == "":
            part = mapping.get(section)
            if isinstance(part, dict):
                part.pop(name, None)  # cleared: the default
            continue
        _, value, _ = parse_override(f"{key}={text}")
        if key in PATH_KEYS:
            value = _absolute(value, cwd)
        _set(mapping, key, value)
    return mapping


def compose(form: dict[str, Any], root: Path, cwd: Path) -> Draft:
    """The form's stages as YAML, each with its ``run.output_dir`` under the run's folder."""
    folder = root / run_name(form.get("name"))
    stages = form.get("stages") or []
    if not isinstance(stages, list) or not stages:
        raise XtrainError("the form has no stage", "choose a task or a built-in job")
    drafts = []
    for number, stage in enumerate(stages, start=1):
        mapping = stage_mapping(stage if isinstance(stage, dict) else {}, number, cwd)
        task = str((mapping.get("model") or {}).get("task") or "?")
        if len(stages) == 1:
            out, config = folder, folder / CONFIG
        else:
            out = folder / f"{number}-{task}"
            config = folder / f"{out.name}.yaml"
        _set(mapping, "run.output_dir", str(out))
        text = yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True, default_flow_style=False)
        drafts.append(StageDraft(config, out, text, task))
    from xtrain.commands.options import parse_gpus, parse_int

    gpus = str(form.get("gpus") or "").strip()
    processes = str(form.get("processes") or "").strip()
    return Draft(folder, drafts, parse_gpus(gpus or None), parse_int(processes or None, "processes", 1))
