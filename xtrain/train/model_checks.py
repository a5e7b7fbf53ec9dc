"""The config against the model it trains, checked once the model's config is known and before
any training or evaluation: in a run by ``tasks.common.finish_model`` (every built-in task's model
passes there before LoRA), and by ``xtrain train --dry-run`` from a config read offline (never a
download). Each failure is one ``XtrainError`` line naming the key and the limit.

- Lengths: ``data.max_length`` against the positions the task's sequences go through
  (``Task.positions``, else the text model's), and ``generation.max_new_tokens`` on top of the
  task's prompt (``Task.generation_prompt``) against the same positions: a longer sequence fails
  inside the first forward pass or the first evaluation (``IndexError: index out of range``).
- LoRA: every name in ``lora.target_modules`` matches a module of the model (peft accepts a list
  where only some names match, and drops the others silently); ``auto`` finds some layers.

Tasks contribute their limits through the contract; nothing here names a task.
"""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError, shown

if TYPE_CHECKING:
    from xtrain.train.config.schema import TrainConfig
    from xtrain.train.tasks.contract import Task

# Spellings of "how many positions" across architectures (GPT-2's n_positions, Whisper's decoder)
POSITION_NAMES = ("max_position_embeddings", "n_positions", "max_target_positions")


def positions_of(config: Any) -> int | None:
    """The first positive position limit ``config`` names; None when it names none."""
    for name in POSITION_NAMES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def text_positions(config: Any) -> tuple[str, int | None]:
    """The default ``Task.positions``: the text model's (a multimodal config's ``text_config``)."""
    return "model", positions_of(getattr(config, "text_config", None) or config)


def check_lengths(cfg: TrainConfig, task: Task, config: Any) -> None:
    """``data.max_length`` and ``generation.max_new_tokens`` + prompt within the positions."""
    where, limit = (task.positions or text_positions)(config)
    if limit is None:
        return  # rotary models without a stated limit, custom configs: nothing to check against
    max_length = cfg.data.max_length
    if max_length > limit:
        raise XtrainError(
            f"data.max_length={max_length} is above the {where}'s limit of {limit} positions",
            f"set data.max_length={limit} or less",
        )
    if task.generation_prompt is None:
        return
    prompt, new = task.generation_prompt(cfg), cfg.generation.max_new_tokens
    if prompt + new > limit:
        room = limit - prompt
        fix = f"set generation.max_new_tokens={room} or less" if room > 0 else "lower data.max_length"
        raise XtrainError(
            f"generation.max_new_tokens={new} plus a prompt of up to {prompt} "
            f"token{'' if prompt == 1 else 's'} is above the {where}'s limit of {limit} positions",
            fix,
        )


def _matches(name: str, qualified: str) -> bool:
    """peft's rule for one ``target_modules`` entry: the module's name, its last parts, or (a
    single string) a regex matching the whole qualified name."""
    if qualified == name or qualified.endswith("." + name):
        return True
    try:
        return re.fullmatch(name, qualified) is not None
    except re.error:
        return False


def check_targets(cfg: TrainConfig, task: Task, model: Any) -> None:
    """Every listed ``lora.target_modules`` name matches a module; ``auto`` finds some layers."""
    from xtrain.train import lora, model_size

    names = cfg.lora.target_modules
    if names == "auto":
        adapted, _ = model_size.adapted_layers(model, cfg)
        if not adapted:
            kind = getattr(getattr(model, "config", None), "model_type", None) or "model"
            raise XtrainError(
                f"lora.target_modules=auto found no layer to adapt in this {kind}",
                "set lora.target_modules to the module names to adapt, or lora.enabled=false",
            )
        return
    listed = [names] if isinstance(names, str) else list(names)
    qualified = [q for q, _ in model.named_modules() if q]
    missing = [n for n in listed if not any(_matches(n, q) for q in qualified)]
    if not missing:
        return
    leaves = sorted(set(lora.linear_layers(model).values()))
    close = difflib.get_close_matches(missing[0], leaves, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise XtrainError(
        f"lora.target_modules {shown(missing)} not found in the model",
        f"{hint}Linear layers it has: {', '.join(leaves[:16])}",
    )


def check_model(model: Any, cfg: TrainConfig, task: Task) -> None:
    """The run's check: the loaded model (before LoRA) against the config."""
    check_lengths(cfg, task, model.config)
    if cfg.lora.enabled:
        check_targets(cfg, task, model)


def local_config(cfg: TrainConfig) -> Any | None:
    """The model's ``config.json`` as attributes (nested configs too), read without transformers
    when it is on disk (a local folder, a built-in already built); else None."""
    import json
    import types
    from pathlib import Path

    from xtrain import builtin, structured

    name = cfg.model.name_or_path
    folder = builtin.cache_root() / builtin.strip_prefix(name) if builtin.is_builtin(name) else Path(name)
    try:
        text = (folder.expanduser() / "config.json").read_text(encoding="utf-8")
        structured.load_json(text)  # no key twice, bounded nesting
        return json.loads(text, object_hook=lambda d: types.SimpleNamespace(**d))
    except (OSError, ValueError, TypeError):
        return None


def check_offline(cfg: TrainConfig, light: bool = False) -> str:
    """``xtrain train --dry-run``'s check, on the model's config where it is on this machine and
    its skeleton built on the meta device (shapes only, no weights, no download). ``light``: the
    lengths only, from ``config.json`` without importing transformers (a plan without CUDA stays
    fast). Raises the run's own line; returns what was checked, or why nothing was."""
    from xtrain.train import tasks

    task = tasks.get(cfg.model.task)
    if task.model_class is None:
        return f"skipped: task {cfg.model.task} builds its own model"
    if light:
        found = local_config(cfg)
        if found is None:
            return f"skipped: the config of {cfg.model.name_or_path} is not on this machine yet"
        check_lengths(cfg, task, found)
        return f"lengths checked against {cfg.model.name_or_path} (LoRA targets: when the run loads it)"
    from xtrain.train import model_size

    config = model_size.read_config_offline(cfg)
    if isinstance(config, str):
        return f"skipped: {config}"
    check_lengths(cfg, task, config)
    if not cfg.lora.enabled:
        return f"lengths checked against {cfg.model.name_or_path}"
    bare = model_size.meta_model(cfg, task, config)
    if isinstance(bare, str):
        return f"lengths checked; LoRA targets skipped: {bare}"
    check_targets(cfg, task, bare)
    return f"lengths and LoRA targets checked against {cfg.model.name_or_path}"
