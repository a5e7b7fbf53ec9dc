"""A config checked as a whole, against the task it names: ``load_config`` and
``config_from_dict``, the two ways a ``TrainConfig`` is made (``xtrain.config.loading`` reads and
types the values; the checks that need the task registry or more than one field are here).

Which keys a task reads is the task's own declaration (``Task.keys``, allow-by-task): a key that
only other tasks read, set away from its default, is refused naming the key and the tasks it is
for; then the task's own ``validate`` checks its keys against each other."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xtrain import tasks
from xtrain.builtin import StageNotBuilt
from xtrain.config.loading import read_config, read_dict
from xtrain.config.schema import TrainConfig, given_keys, sections
from xtrain.config.values import choose
from xtrain.data import mixing
from xtrain.data.rows.formats import check_tags
from xtrain.errors import XtrainError
from xtrain.model.lora import check_variants
from xtrain.model.start import NotAResult, start_of
from xtrain.tasks.contract import EVERY_KEY, Task

CAUSAL_LM = "AutoModelForCausalLM"  # the model class lm-evaluation-harness's HF model loads


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> TrainConfig:
    """The config of a run: ``path`` (YAML) or the built-in quickstart job when ``None``, then
    ``overrides`` (``section.key=value``, the value read as YAML) (``config.loading.read_config``),
    then the checks of the whole config against its task."""
    cfg = read_config(path, overrides)
    take_start(cfg)
    validate(cfg)
    return cfg


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """The inverse of ``config_to_dict``, with the same checks as ``load_config``."""
    cfg = read_dict(data)
    validate(cfg)
    return cfg


def take_start(cfg: TrainConfig) -> None:
    """A trained result as the start (``model.start``) loads its base as it trained: its
    ``model.quantization``, unless the config names one (``model.quantization: null``: 16 bits)."""
    if "model.quantization" in (given_keys(cfg) or ()) or cfg.model.quantization is not None:
        return
    try:
        cfg.model.quantization = start_of(cfg.model.name_or_path).quantization
    except StageNotBuilt:  # a trained built-in (16-bit) before its stage ran: where a run starts
        return
    except NotAResult:  # a run not finished yet (a recipe's stage before this one): the preflight says so
        return


def reader_config(data: dict[str, Any]) -> TrainConfig:
    """A config for a task's row readers alone (``xtrain predict --data``): its values typed and
    checked, its task named; not the checks of a training config across sections (a run's data
    settings passed them when it trained; GRPO's would want reward functions to read prompts)."""
    cfg = read_dict(data)
    check_task(cfg)
    return cfg


def check_task(cfg: TrainConfig) -> None:
    """``model.task`` against the registry, normalised as any value with choices is
    (``values.choose``: a task's aliases, its name with underscores, case)."""
    cfg.model.task = choose("model.task", cfg.model.task, tasks.names(), tasks.aliases())


def validate(cfg: TrainConfig) -> None:
    """Checks that involve more than one field; the first mistake raises (in this order)."""
    check_task(cfg)
    task = tasks.get(cfg.model.task)
    check_task_keys(cfg)
    if cfg.model.chunked_loss == "on" and task.token_loss is None:  # custom: it reads every key
        raise XtrainError(
            f"model.chunked_loss=on: task {task.name}'s loss is not a cross-entropy over a vocabulary",
            "leave model.chunked_loss at auto (or off)",
        )
    task.validate(cfg)
    check_tags(cfg.data)  # data.role_tag & co.: only for conversations, each role its own tag
    mixing.check(cfg.data)  # data.mix_probs: one share per data.train file
    check_quantization(cfg)
    o = cfg.optim
    if isinstance(cfg.lora.target_modules, list) and not cfg.lora.target_modules:
        raise XtrainError("lora.target_modules is an empty list", "use auto, or list module names")
    check_variants(cfg)  # DoRA/rsLoRA/init_weights against enabled and quantization
    if o.lr_scaling != "none" and o.base_global_batch is None:
        raise XtrainError(
            f"optim.lr_scaling={o.lr_scaling} needs optim.base_global_batch",
            "set it to the global batch that optim.lr was tuned for",
        )
    for key in ("model.name_or_path", "run.output_dir"):
        section, name = key.split(".")
        if not getattr(getattr(cfg, section), name).strip():
            raise XtrainError(f"{key} is empty")
    check_run(cfg)
    check_sequence(cfg, task)
    check_benchmarks(cfg, task)


def check_benchmarks(cfg: TrainConfig, task: Task) -> None:
    """eval.benchmarks on a causal language model's run (what lm-evaluation-harness scores); the
    other eval keys only with it."""
    e, defaults = cfg.eval, type(cfg.eval)()
    if not e.benchmarks:
        for key in ("limit", "num_fewshot", "batch_size", "at_start"):
            if getattr(e, key) != getattr(defaults, key):
                raise XtrainError(f"eval.{key} needs eval.benchmarks", "name the tasks in eval.benchmarks")
        return
    if task.model_class != CAUSAL_LM:
        raise XtrainError(
            f"eval.benchmarks scores causal language models through lm-evaluation-harness; "
            f"a {task.name} run trains none",
            "leave out eval.benchmarks (causal-lm, preference and GRPO runs take it)",
        )


def check_quantization(cfg: TrainConfig) -> None:
    """4/8-bit base weights train only through adapters: they cannot take gradient updates."""
    q = cfg.model.quantization
    if q is not None and not cfg.lora.enabled:
        raise XtrainError(
            f"model.quantization={q} trains LoRA adapters on frozen {q} weights, not a full fine-tune",
            "set lora.enabled=true, or model.quantization=null for a full fine-tune",
        )


def check_run(cfg: TrainConfig) -> None:
    """The trackers against their shorthand, early stopping against what it needs."""
    r = cfg.run
    if not r.tensorboard and isinstance(r.report_to, list) and "tensorboard" in r.report_to:
        raise XtrainError(
            "run.tensorboard=false conflicts with run.report_to naming tensorboard",
            "leave out run.tensorboard (run.report_to decides), or tensorboard from run.report_to",
        )
    if r.early_stopping_patience is None:
        if r.early_stopping_threshold:
            raise XtrainError(
                "run.early_stopping_threshold needs run.early_stopping_patience",
                "set run.early_stopping_patience (evaluations without improvement before stopping)",
            )
        return
    if not r.best_metric:
        raise XtrainError(
            "run.early_stopping_patience needs run.best_metric (the metric it waits to improve)",
            "set run.best_metric, e.g. eval_loss",
        )
    if not r.eval_every:
        raise XtrainError(
            "run.early_stopping_patience needs run.eval_every (it counts evaluations during the run)",
            "set run.eval_every, e.g. run.eval_every=100",
        )


def check_sequence(cfg: TrainConfig, task: tasks.Task) -> None:
    """``parallel.sequence`` against the task and what cannot run beside it (the processes it
    must divide are the plan's: ``planning.sequence``)."""
    if cfg.parallel.sequence == 1:
        return
    if not task.sequence_parallel:
        names = [t.name for t in tasks.all_tasks().values() if t.sequence_parallel]
        able = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 2 else names)
        raise XtrainError(
            f"parallel.sequence: the {task.name} task does not split its sequences across processes "
            f"(sequence parallelism trains {able})",
            "set parallel.sequence=1",
        )
    if cfg.run.compile:
        raise XtrainError(
            "parallel.sequence does not run under run.compile (its attention exchanges shards)",
            "set run.compile=false, or parallel.sequence=1",
        )


def task_keys() -> dict[str, list[str]]:
    """``{key: the tasks that read it}`` for every task-specific key (all others are common)."""
    owners: dict[str, list[str]] = {}
    for task in tasks.all_tasks().values():
        for key in sorted(task.keys - {EVERY_KEY}):
            owners.setdefault(key, []).append(task.name)
    return owners


def check_task_keys(cfg: TrainConfig) -> None:
    """A task-specific key that ``cfg.model.task`` does not read, set away from its default."""
    task = tasks.get(cfg.model.task)
    if EVERY_KEY in task.keys:  # a custom task's builder may read any key
        return
    defaults, specific = TrainConfig(), task_keys()
    for section in sections():
        for f in dataclasses.fields(getattr(cfg, section)):
            key = f"{section}.{f.name}"
            owners = specific.get(key)
            if owners is None or key in task.keys:
                continue
            if getattr(getattr(cfg, section), f.name) != getattr(getattr(defaults, section), f.name):
                what = "task" if len(owners) == 1 else "tasks"
                raise XtrainError(
                    f"{key} is for {what} {', '.join(owners)}, not {task.name}",
                    f"leave {key} unset for this task",
                )
