"""Tasks as plug-ins: one module per task, each exporting ``TASK`` (``contract.Task``), and one
registry line each below. Everything else reads a task's parts through ``get(name)``.

A task family is one sub-package (``text/``, ``preference/``, ``speech/``, ``vision/``): its tasks
and the parts only they share. The contract and what every task shares (``common``, the data
check, generation, predicting, sizes, stacks, validation) stay at this package's top.

- ``causal-lm``: text, prompt/response, chat conversations, alpaca or sharegpt; next-token accuracy.
- ``preference``: preference pairs or KTO's labelled completions on a causal LM (DPO, IPO, ORPO,
  SimPO, KTO); reward accuracy.
- ``grpo``: prompts and reward functions on a causal LM (GRPO, Dr. GRPO, DAPO); mean reward.
- ``seq-cls``: text (+ pair) and a label; the classifier head trained whole; accuracy.
- ``image-to-text``: images and their text (TrOCR, ViT-GPT2); CER/WER by generation.
- ``speech-to-text``: audio and transcripts (Whisper); WER/CER by generation.
- ``vision-language``: image + text conversations (Qwen2-VL); exact match by generation.
- ``vision-preference``: preference pairs with images on a vision-language model (DPO, IPO, ORPO,
  SimPO); reward accuracy.
- ``image-classification``: images and a label (ViT, DeiT, ConvNeXt, Swin); accuracy.
- ``reward``: preference pairs -> a reward model (a one-output head on a causal LM, Bradley-Terry);
  reward accuracy. Its result scores GRPO's completions (``grpo.rewards: model:RUN``).
- ``custom``: ``model.custom: module:function``, called with the Run (or the config), returns a Workload.

Order matters for reproducibility: data first (inside ``main_process_first`` so one process
fills the ``datasets`` cache and the others read it), then ``set_seed(run.seed)`` right before
the model and the adapter are created, so every process and every launch mode starts from the
same weights.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.errors import XtrainError
from xtrain.tasks.contract import MainProcessFirst, Task

if TYPE_CHECKING:
    from xtrain.planning.run import Run
    from xtrain.tasks.contract import Quickstart, Workload

JOBS_DIR = Path(__file__).resolve().parent.parent / "builtin" / "jobs"  # the tasks' built-in jobs

# The registry: the modules under xtrain.tasks (family.module) that export a TASK, in help's order.
REGISTRY = (
    "text.causal_lm",
    "preference.preference",
    "grpo.grpo",
    "reward.reward",  # before seq-cls: a one-output classifier saved without a record is a reward model
    "text.seq_cls",
    "vision.image_to_text",
    "speech.speech_to_text",
    "vision.vision_language",
    "preference.vision_preference",
    "vision.image_classification",
    "custom",
)


@cache
def all_tasks() -> dict[str, Task]:
    """``{name: Task}`` of every registered task (light imports: no torch)."""
    found: dict[str, Task] = {}
    for module in REGISTRY:
        task = importlib.import_module(f"{__name__}.{module}").TASK
        found[task.name] = task
    return found


def names() -> tuple[str, ...]:
    return tuple(all_tasks())


def aliases() -> dict[str, str]:
    """``{other spelling: task name}``: each task's aliases and its name with underscores."""
    out: dict[str, str] = {}
    for task in all_tasks().values():
        for alias in (task.name.replace("-", "_"), *task.aliases):
            if alias != task.name:
                out[alias] = task.name
    return out


def get(name: str) -> Task:
    """The task called ``name`` (one line naming the tasks when it is unknown)."""
    tasks = all_tasks()
    if name not in tasks:
        close = difflib.get_close_matches(name, list(tasks), n=1)
        raise XtrainError(
            f"unknown task '{name}' (tasks: {', '.join(tasks)})",
            f"did you mean '{close[0]}'?" if close else None,
        )
    return tasks[name]


def quickstarts() -> dict[str, Quickstart]:
    """``{--task name: its Quickstart}``: each task's built-in job under the task's name, and a
    task's other jobs under their own names (``Task.more_quickstarts``)."""
    return {name: job for name, (_, job) in _quickstart_owners().items()}


def quickstart_task(name: str) -> Task:
    """The task whose built-in job ``name`` (a key of ``quickstarts``) is."""
    return get(_quickstart_owners()[name][0])


def _quickstart_owners() -> dict[str, tuple[str, Quickstart]]:
    """``{--task name: (the task's name, the Quickstart)}``, in the registry's order."""
    out: dict[str, tuple[str, Quickstart]] = {}
    for name, t in all_tasks().items():
        if t.quickstart is not None:
            out[name] = (name, t.quickstart)
        out.update((more, (name, job)) for more, job in t.more_quickstarts)
    return out


def default_quickstart() -> str:
    """The task whose built-in job runs where none is named: ``xtrain quickstart`` without
    --task and ``python -m xtrain.run`` without --config (the one ``Quickstart.default``)."""
    return next(name for name, q in quickstarts().items() if q.default)


def job_file(quickstart: Quickstart) -> Path:
    """A task's built-in job (``xtrain/builtin/jobs/*.yaml``)."""
    return JOBS_DIR / quickstart.job


def default_job() -> Path:
    """The built-in job run where none is named (``default_quickstart``'s)."""
    return job_file(quickstarts()[default_quickstart()])


def build_workload(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    """The Workload of ``run.cfg.model.task`` for this process's ``run``."""
    return get(run.cfg.model.task).build(run, main_process_first)
