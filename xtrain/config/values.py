"""One config value: its allowed choices, spellings and ranges, typed and checked, and the
``section.key`` it is set under (unknown names refused with the closest valid one)."""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Iterable
from typing import Any

from xtrain.config import foreign
from xtrain.config.schema import TrainConfig, config_keys, section_fields, sections
from xtrain.errors import XtrainError, shown

# transformers' attn_implementation values that model.attn_implementation may name (besides auto)
ATTENTION = ("sdpa", "flash_attention_2", "eager")
PRECISIONS = ("no", "fp16", "bf16")  # run.mixed_precision as accelerate takes it (besides auto)
# data.row_format: what a causal-lm row holds (xtrain.data.rows.formats reads each)
ROW_FORMATS = ("auto", "text", "prompt_response", "messages", "alpaca", "sharegpt")
# optim.name -> the bitsandbytes class (8-bit block-wise state; paged: state in CUDA unified
# memory that moves to CPU under memory pressure; on CPU bitsandbytes falls back to unpaged).
BNB_OPTIMIZERS = {"adamw_8bit": "AdamW8bit", "paged_adamw_8bit": "PagedAdamW8bit"}
# experiment trackers xtrain starts through accelerate (xtrain.train.tracking)
TRACKERS = ("tensorboard", "mlflow", "wandb", "trackio")
CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "model.attn_implementation": ("auto", *ATTENTION),
    "model.quantization": ("4bit", "8bit"),  # or null
    "model.chunked_loss": ("auto", "on", "off"),
    "lora.apply_to": ("both", "encoder", "decoder"),
    "lora.init_weights": ("default", "gaussian", "pissa", "olora", "loftq"),
    "optim.name": ("adamw", "adamw_8bit", "paged_adamw_8bit"),
    "data.format": ("auto", "json", "csv", "parquet", "text", "arrow"),
    "data.row_format": ROW_FORMATS,
    # off | on (whole examples packed, kept apart: xtrain.data.packing.pack_rows) | concatenate
    "data.packing": ("off", "on", "concatenate"),
    "data.train_on": ("all_assistant", "last_assistant", "all"),  # xtrain.data.rows.chat.encode
    "data.long_audio": ("refuse", "cut"),
    "data.mix": ("concat", "interleave_under", "interleave_over"),  # xtrain.data.mixing
    "generation.speech_task": ("transcribe", "translate"),
    "optim.schedule": ("cosine", "linear", "constant"),
    "optim.lr_scaling": ("none", "linear", "sqrt"),
    "run.mixed_precision": ("auto", *PRECISIONS),
    "preference.loss": ("dpo", "ipo", "orpo", "simpo", "kto"),  # xtrain.tasks.preference.losses.LOSSES
    "grpo.scale_rewards": ("group", "batch", "none"),
    "parallel.sequence_mode": ("auto", "ulysses", "ring"),  # xtrain.planning.sequence
}
# Spellings people use for the same thing; YAML 1.1 also reads a bare `no`/`off` as false.
# fmt: off
ALIASES: dict[str, dict[Any, str | None]] = {
    "model.dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"},
    "run.mixed_precision": {False: "no", "none": "no", "off": "no", "float16": "fp16", "bfloat16": "bf16"},
    "run.resume": {False: "off", True: "auto", "no": "off", "none": "off"},
    "model.attn_implementation": {"flash_attention": "flash_attention_2", "fa2": "flash_attention_2"},
    "data.row_format": {"prompt-response": "prompt_response", "chat": "messages"},
    "data.mix": {"concatenate": "concat", "interleave": "interleave_under"},
    "data.train_on": {"assistant": "all_assistant", "last": "last_assistant", "last_turn": "last_assistant",
                      "everything": "all"},
    # true: packing that keeps examples apart; the old concatenation only by its own name
    "data.packing": {False: "off", True: "on", "false": "off", "true": "on", "no": "off", "none": "off",
                     "yes": "on", "concat": "concatenate"},
    # the task registry's names and spellings (xtrain.tasks): checked with the whole config, where
    # the registry is known (xtrain.tasks.validation.check_task); a key with spellings here
    "model.task": {},
    "run.report_to": {False: "none"},
    "model.chunked_loss": {True: "on", False: "off", "true": "on", "false": "off", "yes": "on", "no": "off"},
    "model.quantization": {False: None, "off": None, "no": None, "nf4": "4bit", "int4": "4bit",
                           "4-bit": "4bit", "int8": "8bit", "8-bit": "8bit"},
    "lora.init_weights": {True: "default", "true": "default", "lora": "default"},
    # peft's all-linear (every Linear but the output head); LLaMA-Factory's lora_target: all
    "lora.target_modules": {"all-linear": "all-linear", "all_linear": "all-linear", "all": "all-linear"},
    "optim.name": {"adamw_torch": "adamw", "adamw8bit": "adamw_8bit", "paged_adamw8bit": "paged_adamw_8bit",
                   "adamw_bnb_8bit": "adamw_8bit"},
}
# fmt: on
# Keys that take a list of choices (or `a,b` on the command line); "auto" and "none" stand alone.
LIST_CHOICES: dict[str, tuple[str, ...]] = {"run.report_to": TRACKERS}
LIST_WORDS = ("auto", "none")
# Range checks: key -> (predicate on the typed value, what a valid value is).
_POS_INT = (lambda v: v > 0, "a positive integer")
_POS_NUM = (lambda v: v > 0, "a positive number")
_NONNEG = (lambda v: v >= 0, "a number >= 0")
_FRACTION = (lambda v: 0 <= v < 1, "a number in [0, 1)")


def _between(low: int, high: int) -> tuple[Any, str]:
    """An integer in low..high: sizes past any real model would be used until memory runs out."""
    return (lambda v: low <= v <= high, f"an integer in {low}..{high}")


CHECKS: dict[str, tuple[Any, str]] = {
    # upper bounds: above any real model (ranks of a few hundred, heads of ~100k classes, 1M-token
    # contexts), far below what exhausts memory
    "model.num_labels": _between(2, 1_000_000),
    "lora.r": _between(1, 4096),
    "lora.alpha": _between(1, 1_000_000),
    "lora.dropout": _FRACTION,
    "data.eval_fraction": _FRACTION,
    "data.max_length": _between(1, 1 << 22),
    "data.max_audio_seconds": _POS_NUM,
    "data.min_pixels": _POS_INT,
    "data.max_pixels": _POS_INT,
    "data.max_image_pixels": _POS_INT,
    "data.num_workers": _between(0, 1024),
    "run.cpu_threads": _between(1, 4096),
    "data.encode_processes": _between(1, 1024),
    "data.max_samples": _POS_INT,
    "data.mix_probs": (lambda v: all(p >= 0 for p in v) and sum(v) > 0, "numbers >= 0, not all 0"),
    "optim.lr": _POS_NUM,
    "optim.weight_decay": _NONNEG,
    "optim.betas": (lambda v: all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    "optim.eps": _POS_NUM,
    "optim.warmup_steps": (lambda v: v >= 0, "an integer >= 0"),
    "optim.warmup_ratio": _FRACTION,
    "optim.max_grad_norm": _POS_NUM,
    "optim.base_global_batch": _POS_INT,
    "optim.neftune_alpha": _POS_NUM,
    "batch.per_device": _POS_INT,
    "batch.global_batch": _POS_INT,
    "run.max_steps": _POS_INT,
    "run.epochs": _POS_NUM,
    "run.eval_every": _POS_INT,
    "run.save_every": _POS_INT,
    "run.keep_checkpoints": (lambda v: v >= 0, "an integer >= 0 (0 keeps every checkpoint)"),
    # torch's process-group timeout is a C++ duration in milliseconds; a week is plenty
    "run.collective_timeout_s": (lambda v: 0 < v <= 7 * 86400, "a whole number of seconds in 1..604800"),
    # numpy's seed (set by accelerate's set_seed) must fit in 32 bits
    "run.seed": (lambda v: 0 <= v < 2**32, "an integer in 0..4294967295"),
    "run.log_every": _POS_INT,
    "run.early_stopping_patience": _POS_INT,
    "run.early_stopping_threshold": _NONNEG,
    "generation.max_new_tokens": _between(1, 1 << 22),
    "preference.beta": _POS_NUM,
    "preference.orpo_lambda": _POS_NUM,
    "preference.gamma": _NONNEG,
    "preference.label_smoothing": _NONNEG,  # below 0.5: the preference task's validate
    "preference.desirable_weight": _POS_NUM,
    "preference.undesirable_weight": _POS_NUM,
    "preference.sft_weight": _NONNEG,
    "generation.num_beams": _between(1, 256),
    "grpo.num_generations": _between(2, 1024),
    "grpo.max_completion_length": _between(1, 1 << 20),
    "grpo.temperature": _POS_NUM,
    "grpo.length_target": _POS_INT,
    "grpo.epsilon": _POS_NUM,
    "grpo.epsilon_high": _POS_NUM,
    "grpo.beta": _NONNEG,
    "grpo.num_iterations": _between(1, 1024),
    "grpo.max_turns": _between(1, 1024),
    "grpo.max_episode_length": _between(1, 1 << 22),
    "grpo.max_tool_calls": _between(0, 1 << 20),
    "grpo.tool_timeout": _POS_NUM,
    "reward.center_rewards_coefficient": _NONNEG,
    "generation.sample_predictions": _between(0, 10_000),
    "parallel.sequence": (
        lambda v: 0 <= v <= 1024,
        "an integer in 1..1024, or all (every process of the run)",
    ),
    "eval.limit": (lambda v: v > 0 and (v < 1 or v == int(v)), "a row count, or a share of the rows below 1"),
    "eval.num_fewshot": _between(0, 1024),
    "eval.batch_size": _between(1, 1 << 16),
}


def closest(name: str, candidates: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def show(value: Any) -> str:
    """A config value in an error line: its repr, at most ~80 characters (``errors.shown``)."""
    return shown(value)


def _number(value: Any) -> float | None:
    """A YAML number, or a numeric string (PyYAML reads `2e-4` as a string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as type ``tp`` or raise; ``key`` names the field in messages."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise XtrainError(f"{key} cannot be null")
        args = [a for a in args if a is not type(None)]
        if len(args) == 1:
            return _coerce(value, args[0], key)
        # str | list[str]: pick the branch by the value's shape.
        want = next((a for a in args if typing.get_origin(a) is list), None)
        if isinstance(value, (list, tuple)) and want is not None:
            return _coerce(value, want, key)
        return _coerce(value, next(a for a in args if typing.get_origin(a) is not list), key)
    if value is None:
        raise XtrainError(f"{key} cannot be null")
    what = CHECKS.get(key, (None, None))[1]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise XtrainError(f"{key} must be true or false, got {show(value)}")
    if tp is int:
        num = _number(value)
        if num is None or not math.isfinite(num) or num != int(num):
            raise XtrainError(f"{key} must be {what or 'an integer'}, got {show(value)}")
        return int(num)
    if tp is float:
        num = _number(value)
        if num is None or not math.isfinite(num):
            raise XtrainError(f"{key} must be {what or 'a number'}, got {show(value)}")
        return num
    if tp is str:
        if isinstance(value, str):
            return value
        raise XtrainError(f"{key} must be a string, got {show(value)}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):  # `a,b` or a single name
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise XtrainError(f"{key} must be a list, got {show(value)}")
        return [_coerce(v, item, key) for v in value]
    if origin is dict:  # a mapping handed on as it is (data.chat_template_kwargs)
        if not isinstance(value, dict):
            raise XtrainError(f"{key} must be a mapping, e.g. {{enable_thinking: false}}, got {show(value)}")
        return {str(k): v for k, v in value.items()}
    if origin is tuple:
        items = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            raise XtrainError(f"{key} must be {what or f'a list of {len(items)} values'}, got {show(value)}")
        return tuple(_coerce(v, t, key) for v, t in zip(value, items, strict=True))
    raise TypeError(f"unsupported config type {tp!r} for {key}")  # a bug in the schema


def _check_list(key: str, value: str | list[str]) -> str | list[str]:
    """A list-of-choices value: ``auto``, ``none`` (the empty list), or known names, lower-cased
    and without repeats."""
    names = [v.strip().lower() for v in (value.split(",") if isinstance(value, str) else value)]
    names = [n for n in names if n]
    if isinstance(value, str) and names in (["auto"], ["none"]):
        return "auto" if names == ["auto"] else []
    choices = LIST_CHOICES[key]
    for name in names:
        if name not in choices:
            close = closest(name, [*choices, *LIST_WORDS])
            raise XtrainError(
                f"{key} takes {', '.join(choices)} (a list, or {' or '.join(LIST_WORDS)}), got {show(name)}",
                f"did you mean '{close}'?" if close else None,
            )
    return list(dict.fromkeys(names))


def choose(key: str, value: Any, choices: tuple[str, ...], aliases: dict[Any, str | None]) -> Any:
    """``value`` with its spelling normalised (``aliases``, case) and checked against ``choices``
    (none: any value); the one line names the closest choice."""
    if isinstance(value, str) and value.lower() in aliases:
        value = aliases[value.lower()]
    elif isinstance(value, bool) and value in aliases:
        value = aliases[value]
    if isinstance(value, str) and value.lower() in choices:
        value = value.lower()
    if choices and value is not None and value not in choices:
        close = closest(str(value), choices)
        raise XtrainError(
            f"{key} must be one of {', '.join(choices)}, got {show(value)}",
            f"did you mean '{close}'?" if close else None,
        )
    return value


def _check(key: str, value: Any) -> Any:
    """Aliases, choices and ranges for one typed value; returns the normalised value."""
    if key in LIST_CHOICES:
        return _check_list(key, choose(key, value, (), ALIASES.get(key, {})))
    value = choose(key, value, CHOICES.get(key, ()), ALIASES.get(key, {}))
    if key in CHECKS and value is not None:
        ok, what = CHECKS[key]
        if not ok(value):
            raise XtrainError(f"{key} must be {what}, got {show(value)}")
    return value


def set_value(cfg: TrainConfig, key: str, value: Any, *, from_text: str | None = None) -> None:
    """Type, check and set ``section.key``. ``from_text`` is an override's raw text: a string field
    keeps it as written even when YAML would read it as a number or a boolean (`run.resume=off`)."""
    section, name = key.split(".", 1)
    tp = section_fields(type(getattr(cfg, section)))[name]
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
    if from_text is not None and optional and from_text in ("None", "none"):
        value = None  # Python's spelling of null, on the command line
    if from_text is not None and value is not None and not isinstance(value, (str, list, dict)):
        str_field = tp is str or (
            typing.get_origin(tp) in (typing.Union, types.UnionType) and str in typing.get_args(tp)
        )
        if str_field and key not in ALIASES:
            value = from_text
    if key in ALIASES and isinstance(value, bool):
        value = ALIASES[key].get(value, value)
    if key == "parallel.sequence" and isinstance(value, str) and value.strip().lower() == "all":
        value = 0  # every process of the run (planning.sequence)
    if key == "lora.target_modules" and isinstance(value, str) and "," in value:
        value = [m.strip() for m in value.split(",") if m.strip()]
    if key == "lora.target_modules" and isinstance(value, list) and len(value) == 1:
        alone = str(value[0]).lower()
        value = ALIASES[key].get(alone, value)  # [all-linear]: the shorthand, not a module name
    setattr(getattr(cfg, section), name, _check(key, _coerce(value, tp, key)))


def resolve_key(section: str, name: str, where: str) -> str:
    """``section.name`` checked; an unknown one is one line naming the xtrain key that means the
    same (a name from another trainer: ``foreign.answer``; the same key in another section), else
    the closest spelling."""
    all_sections = sections()
    if section not in all_sections:
        if name and foreign.answer(name) and closest(section, all_sections) is None:  # training.learning_rate
            raise XtrainError(f"unknown key '{section}.{name}'{where}", foreign.answer(name))
        close = closest(section, all_sections)
        raise XtrainError(
            f"unknown section {shown(section)}{where}",
            f"did you mean '{close}'?" if close else f"sections: {', '.join(all_sections)}",
        )
    names = section_fields(all_sections[section])
    if name not in names:
        key = f"{section}.{name}"
        # The same key in another section first (`lora.lr` -> `optim.lr`), then a name from another
        # trainer (learning_rate, cutoff_len, logging_steps, ...), then the closest spelling.
        elsewhere = [f"{s}.{name}" for s, cls in all_sections.items() if name and name in section_fields(cls)]
        if not elsewhere and foreign.answer(name):
            raise XtrainError(f"unknown key {key!r}{where}", foreign.answer(name))
        close = (elsewhere[0] if elsewhere else None) or closest(key, config_keys()) or closest(name, names)
        if close and "." not in close:
            close = f"{section}.{close}"
        raise XtrainError(
            f"unknown key {shown(key)}{where}",
            f"did you mean '{close}'?" if close else f"keys of {section}: {', '.join(names)}",
        )
    return f"{section}.{name}"
