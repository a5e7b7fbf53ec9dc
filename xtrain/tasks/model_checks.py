"""The config against the model it trains, checked once the model's config is known and before
any training or evaluation: in a run by ``tasks.common.finish_model`` (every built-in task's model
passes there before LoRA), and by ``xtrain train --dry-run`` from a config read offline (never a
download). Each failure is one ``XtrainError`` line naming the key and the limit.

- Lengths: ``data.max_length`` against the positions the task's sequences go through
  (``Task.positions``, else the text model's), and ``generation.max_new_tokens`` on top of the
  task's prompt (``Task.generation_prompt``) against the same positions: a longer sequence fails
  inside the first forward pass or the first evaluation (``IndexError: index out of range``).
- LoRA: every name in ``lora.target_modules`` matches a module of the model (peft accepts a list
  where only some names match, and drops the others silently); ``auto`` and ``all-linear`` find
  some layers (the task's own chooser, as the plan counts them).

Tasks contribute their limits through the contract; nothing here names a task.
"""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING

from xtrain import tasks
from xtrain.config.schema import given_keys
from xtrain.errors import XtrainError, shown
from xtrain.model import lora_layers
from xtrain.model import size as model_size
from xtrain.model.configs import local_config, read_config_offline, text_positions
from xtrain.tasks.sizes import adapted_layers

if TYPE_CHECKING:
    from types import SimpleNamespace

    from torch.nn import Module
    from transformers import PretrainedConfig

    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.contract import Task

# LoRA target names that transformers 5 renamed in vision encoders (ViT/DeiT: attention.query ->
# q_proj, ...): lists written for transformers 4, such as LLaMA-Factory's or older tutorials'
RENAMED = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}


def check_lengths(cfg: TrainConfig, task: Task, config: PretrainedConfig | SimpleNamespace) -> None:
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


def fit_defaults(cfg: TrainConfig, config: PretrainedConfig | SimpleNamespace | None = None) -> list[str]:
    """Defaults the user did not write, fitted to the model before anything is built: a
    ``data.max_length`` above the positions its sequences go through becomes that limit, and a
    ``generation.max_new_tokens`` that does not fit on top of the prompt becomes the room left
    (``config``: the model's config, else its config.json where it is on this machine). Changes
    ``cfg`` in place and returns one note per change. Values the user gave are left as they are:
    ``check_lengths`` refuses them when they cannot work. A config built in code (no record of
    what was given) is left alone."""
    given = given_keys(cfg)
    task = tasks.get(cfg.model.task)
    if given is None or task.model_class is None:
        return []
    config = config if config is not None else local_config(cfg)
    where, limit = (task.positions or text_positions)(config) if config is not None else ("", None)
    if limit is None:
        return []
    d, g, notes = cfg.data, cfg.generation, []
    fitted = "data.max_length" not in given and d.max_length > limit
    if fitted:
        notes.append(f"data.max_length={limit}: the {where}'s limit (the default {d.max_length} is above it)")
        d.max_length = limit
    if task.generation_prompt is None or "generation.max_new_tokens" in given:
        return notes
    if fitted and limit - task.generation_prompt(cfg) < 1:  # the prompt is max_length: leave room
        d.max_length = max(1, limit - min(g.max_new_tokens, limit // 2))
        notes[-1] = f"data.max_length={d.max_length}: room to generate within the {where}'s {limit} positions"
    room = limit - task.generation_prompt(cfg)
    if 0 < room < g.max_new_tokens:
        notes.append(
            f"generation.max_new_tokens={room}: what the {where}'s {limit} positions leave after the "
            f"prompt (the default {g.max_new_tokens} is above it)"
        )
        g.max_new_tokens = room
    return notes


def _matches(name: str, qualified: str) -> bool:
    """peft's rule for one ``target_modules`` entry: the module's name, its last parts, or (a
    single string) a regex matching the whole qualified name."""
    if qualified == name or qualified.endswith("." + name):
        return True
    try:
        return re.fullmatch(name, qualified) is not None
    except re.error:
        return False


def check_targets(cfg: TrainConfig, task: Task, model: Module) -> None:
    """Every listed ``lora.target_modules`` name matches a module; ``auto`` and ``all-linear``
    (peft's: every Linear but the output head) find some layers."""
    names = cfg.lora.target_modules
    if names == "auto" or lora_layers.is_all_linear(names):
        adapted, _ = adapted_layers(model, cfg)
        if not adapted:
            kind = getattr(getattr(model, "config", None), "model_type", None) or "model"
            raise XtrainError(
                f"lora.target_modules={names} found no layer to adapt in this {kind}",
                "set lora.target_modules to the module names to adapt, or lora.enabled=false",
            )
        return
    listed = [names] if isinstance(names, str) else list(names)
    qualified = [q for q, _ in model.named_modules() if q]
    missing = [n for n in listed if not any(_matches(n, q) for q in qualified)]
    if not missing:
        return
    leaves = sorted(set(lora_layers.linear_layers(model).values()))
    renamed = RENAMED.get(missing[0])
    if renamed in leaves:  # a list written for transformers 4 (ViT, DeiT, TrOCR's encoder)
        hint = f"did you mean '{renamed}'? (transformers 5 renamed {missing[0]} to {renamed} in this model) "
    else:
        close = difflib.get_close_matches(missing[0], leaves, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
    raise XtrainError(
        f"lora.target_modules {shown(missing)} not found in the model",
        f"{hint}Linear layers it has: {', '.join(leaves[:16])}",
    )


def check_model(model: Module, cfg: TrainConfig, task: Task) -> None:
    """The run's check: the loaded model (before LoRA) against the config."""
    check_lengths(cfg, task, model.config)
    if cfg.lora.enabled:
        check_targets(cfg, task, model)


def check_offline(cfg: TrainConfig, light: bool = False) -> str:
    """``xtrain train --dry-run``'s check (``checked_offline``): what was checked, or why nothing was."""
    return checked_offline(cfg, light)[0]


def checked_offline(cfg: TrainConfig, light: bool = False) -> tuple[str, str | None]:
    """``xtrain train --dry-run``'s check, on the model's config where it is on this machine and
    its skeleton built on the meta device (shapes only, no weights, no download). ``light``: the
    lengths only, from ``config.json`` without importing transformers (a full fine-tune's plan
    without CUDA stays fast). Raises the run's own line; returns (what was checked, or why nothing
    was; the layers a new adapter goes on, as the run's own chooser picks them, where known)."""
    task = tasks.get(cfg.model.task)
    if task.model_class is None:
        return f"skipped: task {cfg.model.task} builds its own model", None
    if light:
        found = local_config(cfg)
        if found is None:
            return f"skipped: the config of {cfg.model.name_or_path} is not on this machine yet", None
        check_lengths(cfg, task, found)
        return f"lengths checked against {cfg.model.name_or_path} (LoRA targets: when the run loads it)", None
    config = read_config_offline(cfg)
    if isinstance(config, str):
        return f"skipped: {config}", None
    check_lengths(cfg, task, config)
    if not cfg.lora.enabled:
        return f"lengths checked against {cfg.model.name_or_path}", None
    bare = model_size.meta_model(cfg, task, config)
    if isinstance(bare, str):
        return f"lengths checked; LoRA targets skipped: {bare}", None
    check_targets(cfg, task, bare)
    return f"lengths and LoRA targets checked against {cfg.model.name_or_path}", lora_line(cfg, bare)


def lora_line(cfg: TrainConfig, model: Module) -> str | None:
    """A new adapter's settings and the layers it goes on in ``model`` (the task's own chooser,
    as the build and the memory estimate pick them): what ``auto`` picked, said before the run.
    None for a start's adapter trained on (``lora.continue_adapter``: its own targets)."""
    if cfg.lora.continue_adapter:
        return None
    adapted, whole = adapted_layers(model, cfg)
    names = cfg.lora.target_modules
    asked = names if isinstance(names, str) else f"[{', '.join(names)}]"
    line = lora_layers.described(adapted, whole)
    return f"r={cfg.lora.r}, alpha={cfg.lora.alpha}, lora.target_modules={asked}: {line}"
