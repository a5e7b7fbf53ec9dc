"""The training config: one YAML file plus `key=value` overrides, strictly validated.

Field names here are the contract between the config loader, the task builders and the loop.

- ``load_config(path, overrides)``: YAML (``yaml.safe_load``) -> defaults -> overrides -> checks.
  ``path=None`` is the built-in quickstart job (``xtrain/data/quickstart.yaml``).
- Unknown sections and keys are refused with the closest valid name; values are type-checked
  and range-checked; every mistake is one ``XtrainError`` line.
- ``gradient_accumulation`` derives accumulation from the global batch; ``scaled_lr`` applies
  the LR scaling rule; ``config_to_dict`` / ``config_from_dict`` round-trip for checkpoints.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError

QUICKSTART_CONFIG = Path(__file__).resolve().parent.parent / "data" / "quickstart.yaml"


@dataclass
class ModelConfig:
    name_or_path: str = "builtin:tiny-bert"  # local folder, hub id, or builtin:NAME (built offline)
    task: str = "seq-cls"  # causal-lm | seq-cls | image-to-text | speech-to-text | vision-language | custom
    custom: str | None = None  # "module:function" returning a Workload (task: custom)
    num_labels: int | None = None  # seq-cls; None: inferred from the data
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (weights' load dtype)
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    freeze_encoder: bool = False  # speech-to-text full fine-tune: train the decoder only
    freeze_vision: bool = True  # vision-language full fine-tune: keep the vision tower fixed


@dataclass
class LoraConfig:
    enabled: bool = True
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: str | list[str] = "auto"  # auto: found for common architectures
    modules_to_save: list[str] | None = None  # None: the task head for seq-cls
    # image-to-text, speech-to-text: which half of the encoder-decoder model gets adapters
    # (auto targets or the names above)
    apply_to: str = "both"  # both | encoder | decoder
    # vision-language: the adapters go on the language model's attention/MLP layers; these add
    projector: bool = False  # train the projector/merger (vision -> text) whole, saved with the adapter
    vision_blocks: bool = False  # also put adapters on the vision tower's blocks


@dataclass
class DataConfig:
    train: str | None = (
        "builtin:sentiment"  # file (json/jsonl/csv/parquet/txt), saved datasets folder, hub id, builtin:NAME
    )
    eval: str | None = None
    eval_fraction: float = 0.0  # split this share off train when no eval set is given
    format: str = "auto"  # auto (from the extension) | json | csv | parquet | text | arrow
    text_column: str = "text"
    image_column: str = "image"  # image-to-text: image paths (relative to the data file) or an Image feature
    audio_column: str = "audio"  # speech-to-text: audio paths (relative to the data file) or an Audio feature
    max_audio_seconds: float | None = None  # speech-to-text: None: the model's window (30 s for Whisper)
    long_audio: str = "refuse"  # speech-to-text, clips over max_audio_seconds: refuse | cut
    text_pair_column: str | None = None
    # chat data (causal-lm, vision-language): conversations of {role, content} turns
    messages_column: str = "messages"
    images_column: str = "images"  # vision-language: images for image parts that name no file
    chat_template: str | None = None  # a Jinja file or template text; None: the tokenizer's/processor's
    min_pixels: int | None = None  # vision-language (Qwen2-VL-style processors): image area bounds
    max_pixels: int | None = None  # (fewer pixels: fewer image tokens, less memory); None: the processor's
    prompt_column: str | None = None  # causal-lm prompt/response: loss masked on the prompt
    response_column: str | None = None
    label_column: str = "label"
    max_length: int = 512
    packing: bool = False  # causal-lm: concatenate and cut into max_length blocks
    # Each optimizer step's samples of similar length (speech: audio seconds; text: tokens), less
    # padding; the order stays independent of the process count (xtrain.train.sampler).
    group_by_length: bool = False
    num_workers: int | None = None  # DataLoader worker processes per training process; None: the plan's


@dataclass
class OptimConfig:
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    schedule: str = "cosine"  # cosine | linear | constant
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    max_grad_norm: float | None = 1.0
    lr_scaling: str = "none"  # none | linear | sqrt (relative to base_global_batch)
    base_global_batch: int | None = None


@dataclass
class BatchConfig:
    per_device: int = 8
    # None: per_device x processes (accumulation 1). Otherwise accumulation is derived as
    # global / (per_device x processes), so the effective batch stays fixed when the GPU count changes.
    global_batch: int | None = None


@dataclass
class RunConfig:
    output_dir: str = "xtrain-output"
    max_steps: int | None = None  # optimizer steps; wins over epochs
    epochs: float = 1.0
    eval_every: int | None = None  # steps; None: at the end only
    eval_at_start: bool = False  # also evaluate before the first step (the "before" figures)
    save_every: int | None = None  # steps; None: at the end only
    keep_checkpoints: int = 2
    seed: int = 42
    resume: str = "auto"  # auto | off | path to a checkpoint folder
    log_every: int = 10  # steps between host syncs for logging
    mixed_precision: str = "auto"  # auto (from the plan) | no | fp16 | bf16
    tensorboard: bool = True
    save_merged: bool = False  # also write the LoRA-merged full model
    best_metric: str | None = None  # e.g. cer or eval_loss: keep the best model so far in output_dir/best
    # seconds a collective may wait for a slow or hung rank before the run fails (torch's own
    # default is 10 min for NCCL); long enough for rank 0 to tokenise a big data set first
    collective_timeout_s: int = 1800


@dataclass
class GenerationConfig:
    """How generative tasks (image-to-text, speech-to-text) decode at evaluation and in ``xtrain predict``."""

    max_new_tokens: int = 128
    num_beams: int = 1  # 1: greedy
    sample_predictions: int = 4  # reference vs prediction pairs shown and logged at each eval
    language: str | None = None  # speech-to-text, multilingual Whisper: e.g. en, de; None: detected
    speech_task: str = "transcribe"  # speech-to-text, Whisper: transcribe | translate (to English)


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    run: RunConfig = field(default_factory=RunConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)


# ---------------------------------------------------------------------------------------------
# The schema, derived from the dataclasses above

TASKS = ("causal-lm", "seq-cls", "image-to-text", "speech-to-text", "vision-language", "custom")
CHOICES: dict[str, tuple[str, ...]] = {
    "model.task": TASKS,
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "lora.apply_to": ("both", "encoder", "decoder"),
    "data.format": ("auto", "json", "csv", "parquet", "text", "arrow"),
    "data.long_audio": ("refuse", "cut"),
    "generation.speech_task": ("transcribe", "translate"),
    "optim.schedule": ("cosine", "linear", "constant"),
    "optim.lr_scaling": ("none", "linear", "sqrt"),
    "run.mixed_precision": ("auto", "no", "fp16", "bf16"),
}
# Spellings people use for the same thing; YAML 1.1 also reads a bare `no`/`off` as false.
ALIASES: dict[str, dict[Any, str]] = {
    "model.dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"},
    "run.mixed_precision": {False: "no", "none": "no", "off": "no", "float16": "fp16", "bfloat16": "bf16"},
    "run.resume": {False: "off", True: "auto", "no": "off", "none": "off"},
    "model.task": {
        "causal_lm": "causal-lm",
        "clm": "causal-lm",
        "seq_cls": "seq-cls",
        "image_to_text": "image-to-text",
        "ocr": "image-to-text",
        "speech_to_text": "speech-to-text",
        "asr": "speech-to-text",
        "vision_language": "vision-language",
        "vlm": "vision-language",
        "image-text-to-text": "vision-language",
    },
}
# Range checks: key -> (predicate on the typed value, what a valid value is).
_POS_INT = (lambda v: v > 0, "a positive integer")
_POS_NUM = (lambda v: v > 0, "a positive number")
_NONNEG = (lambda v: v >= 0, "a number >= 0")
_FRACTION = (lambda v: 0 <= v < 1, "a number in [0, 1)")
CHECKS: dict[str, tuple[Any, str]] = {
    "model.num_labels": (lambda v: v >= 2, "an integer >= 2"),
    "lora.r": _POS_INT,
    "lora.alpha": _POS_INT,
    "lora.dropout": _FRACTION,
    "data.eval_fraction": _FRACTION,
    "data.max_length": _POS_INT,
    "data.max_audio_seconds": _POS_NUM,
    "data.min_pixels": _POS_INT,
    "data.max_pixels": _POS_INT,
    "data.num_workers": (lambda v: v >= 0, "an integer >= 0"),
    "optim.lr": _POS_NUM,
    "optim.weight_decay": _NONNEG,
    "optim.betas": (lambda v: all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    "optim.eps": _POS_NUM,
    "optim.warmup_steps": (lambda v: v >= 0, "an integer >= 0"),
    "optim.warmup_ratio": _FRACTION,
    "optim.max_grad_norm": _POS_NUM,
    "optim.base_global_batch": _POS_INT,
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
    "generation.max_new_tokens": _POS_INT,
    "generation.num_beams": _POS_INT,
    "generation.sample_predictions": (lambda v: v >= 0, "an integer >= 0"),
}
# Input paths in a config file are looked up next to the file first (then the current folder).
_INPUT_PATHS = ("model.name_or_path", "data.train", "data.eval", "data.chat_template")


def _sections() -> dict[str, type]:
    return {f.name: typing.get_type_hints(TrainConfig)[f.name] for f in dataclasses.fields(TrainConfig)}


def _fields(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


def config_keys() -> list[str]:
    """Every valid ``section.key``, in declaration order."""
    return [f"{s}.{k}" for s, cls in _sections().items() for k in _fields(cls)]


def _closest(name: str, candidates: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


# ---------------------------------------------------------------------------------------------
# Typing and checking one value


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


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
        raise XtrainError(f"{key} must be true or false, got {_show(value)}")
    if tp is int:
        num = _number(value)
        if num is None or not math.isfinite(num) or num != int(num):
            raise XtrainError(f"{key} must be {what or 'an integer'}, got {_show(value)}")
        return int(num)
    if tp is float:
        num = _number(value)
        if num is None or not math.isfinite(num):
            raise XtrainError(f"{key} must be {what or 'a number'}, got {_show(value)}")
        return num
    if tp is str:
        if isinstance(value, str):
            return value
        raise XtrainError(f"{key} must be a string, got {_show(value)}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):  # `a,b` or a single name
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise XtrainError(f"{key} must be a list, got {_show(value)}")
        return [_coerce(v, item, key) for v in value]
    if origin is tuple:
        items = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            raise XtrainError(f"{key} must be {what or f'a list of {len(items)} values'}, got {_show(value)}")
        return tuple(_coerce(v, t, key) for v, t in zip(value, items, strict=True))
    raise TypeError(f"unsupported config type {tp!r} for {key}")  # a bug in the schema


def _check(key: str, value: Any) -> Any:
    """Aliases, choices and ranges for one typed value; returns the normalised value."""
    aliases = ALIASES.get(key, {})
    if isinstance(value, (str, bool)) and value in aliases:
        value = aliases[value]
    if isinstance(value, str) and key in CHOICES and value.lower() in CHOICES[key]:
        value = value.lower()
    if key in CHOICES and value not in CHOICES[key]:
        close = _closest(str(value), CHOICES[key])
        raise XtrainError(
            f"{key} must be one of {', '.join(CHOICES[key])}, got {_show(value)}",
            f"did you mean '{close}'?" if close else None,
        )
    if key in CHECKS and value is not None:
        ok, what = CHECKS[key]
        if not ok(value):
            raise XtrainError(f"{key} must be {what}, got {_show(value)}")
    return value


def _set(cfg: TrainConfig, key: str, value: Any, *, from_text: str | None = None) -> None:
    """Type, check and set ``section.key``. ``from_text`` is an override's raw text: a string field
    keeps it as written even when YAML would read it as a number or a boolean (`run.resume=off`)."""
    section, name = key.split(".", 1)
    tp = _fields(type(getattr(cfg, section)))[name]
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
    if key == "lora.target_modules" and isinstance(value, str) and "," in value:
        value = [m.strip() for m in value.split(",") if m.strip()]
    setattr(getattr(cfg, section), name, _check(key, _coerce(value, tp, key)))


def _resolve_key(section: str, name: str, where: str) -> str:
    sections = _sections()
    if section not in sections:
        close = _closest(section, sections)
        raise XtrainError(
            f"unknown section '{section}'{where}",
            f"did you mean '{close}'?" if close else f"sections: {', '.join(sections)}",
        )
    names = _fields(sections[section])
    if name not in names:
        key = f"{section}.{name}"
        # The same key in another section first (`lora.lr` -> `optim.lr`), then the closest spelling.
        elsewhere = [f"{s}.{name}" for s, cls in sections.items() if name and name in _fields(cls)]
        close = (elsewhere[0] if elsewhere else None) or _closest(key, config_keys()) or _closest(name, names)
        if close and "." not in close:
            close = f"{section}.{close}"
        raise XtrainError(
            f"unknown key '{key}'{where}",
            f"did you mean '{close}'?" if close else f"keys of {section}: {', '.join(names)}",
        )
    return f"{section}.{name}"


def _validate(cfg: TrainConfig) -> None:
    """Checks that involve more than one field."""
    m, d, o = cfg.model, cfg.data, cfg.optim
    if m.task == "custom" and not m.custom:
        raise XtrainError(
            "model.task is custom but model.custom is not set", "set model.custom=module:function"
        )
    if m.custom is not None:
        mod, _, fn = m.custom.partition(":")
        if not mod or not fn:
            raise XtrainError(
                f"model.custom must look like module:function, got {m.custom!r}",
                "e.g. model.custom=my_tasks:build",
            )
    if (d.prompt_column is None) != (d.response_column is None):
        raise XtrainError(
            "data.prompt_column and data.response_column go together",
            "set both (loss on the response only) or neither (loss on data.text_column)",
        )
    if m.task == "seq-cls":
        if d.packing:
            raise XtrainError("data.packing is for task causal-lm, not seq-cls", "set data.packing=false")
        if d.prompt_column is not None:
            raise XtrainError(
                "data.prompt_column/response_column are for task causal-lm, not seq-cls",
                "use data.text_column (and data.text_pair_column) with data.label_column",
            )
    if d.group_by_length and (d.packing or m.task == "image-to-text"):
        why = (
            "packed blocks all have max_length tokens"
            if d.packing
            else "its images are all resized to one size"
        )
        raise XtrainError(
            f"data.group_by_length has nothing to group here: {why}", "set data.group_by_length=false"
        )
    if m.task in ("image-to-text", "speech-to-text", "vision-language"):
        if d.packing:
            raise XtrainError(f"data.packing is for task causal-lm, not {m.task}", "set data.packing=false")
        if d.prompt_column is not None:
            column = {"image-to-text": "image", "speech-to-text": "audio"}.get(m.task)
            raise XtrainError(
                f"data.prompt_column/response_column are for task causal-lm, not {m.task}",
                f"use data.{column}_column and data.text_column"
                if column
                else "use data.messages_column (conversations)",
            )
    if m.task == "vision-language" and cfg.lora.apply_to != "both":
        raise XtrainError(
            "lora.apply_to is for encoder-decoder models, not vision-language",
            "use lora.projector and lora.vision_blocks to choose what else is trained",
        )
    if m.task not in ("image-to-text", "speech-to-text", "custom") and cfg.lora.apply_to != "both":
        raise XtrainError(
            f"lora.apply_to={cfg.lora.apply_to} is for encoder-decoder models "
            "(tasks image-to-text, speech-to-text)",
            "leave lora.apply_to at both for this task",
        )
    if m.freeze_encoder:
        if m.task != "speech-to-text":
            raise XtrainError(
                f"model.freeze_encoder is for task speech-to-text, not {m.task}",
                "set model.freeze_encoder=false",
            )
        if cfg.lora.enabled and cfg.lora.apply_to != "decoder":
            raise XtrainError(
                f"model.freeze_encoder with LoRA on the {cfg.lora.apply_to} half would adapt the encoder",
                "with LoRA set lora.apply_to=decoder instead (or lora.enabled=false for a full fine-tune)",
            )
    if m.task != "vision-language":
        for key, value in (
            ("lora.projector", cfg.lora.projector),
            ("lora.vision_blocks", cfg.lora.vision_blocks),
            ("data.min_pixels", d.min_pixels is not None),
            ("data.max_pixels", d.max_pixels is not None),
        ):
            if value:
                raise XtrainError(f"{key} is for task vision-language, not {m.task}", f"leave {key} unset")
    if d.min_pixels is not None and d.max_pixels is not None and d.min_pixels > d.max_pixels:
        raise XtrainError(
            f"data.min_pixels={d.min_pixels} is above data.max_pixels={d.max_pixels}",
            "set data.min_pixels <= data.max_pixels",
        )
    if d.chat_template is not None and m.task not in ("causal-lm", "vision-language", "custom"):
        raise XtrainError(
            f"data.chat_template is for chat data (tasks causal-lm, vision-language), not {m.task}",
            "leave data.chat_template unset",
        )
    if isinstance(cfg.lora.target_modules, list) and not cfg.lora.target_modules:
        raise XtrainError("lora.target_modules is an empty list", "use auto, or list module names")
    if o.lr_scaling != "none" and o.base_global_batch is None:
        raise XtrainError(
            f"optim.lr_scaling={o.lr_scaling} needs optim.base_global_batch",
            "set it to the global batch that optim.lr was tuned for",
        )
    for key in ("model.name_or_path", "run.output_dir"):
        section, name = key.split(".")
        if not getattr(getattr(cfg, section), name).strip():
            raise XtrainError(f"{key} is empty")


# ---------------------------------------------------------------------------------------------
# Loading


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    from xtrain.encoding import read_text

    if path.exists() and not path.is_dir() and not path.is_file():  # /dev/null, a pipe, a device
        raise XtrainError(
            f"config path {path} is not a regular file", "give a YAML file, e.g. examples/*.yaml"
        )
    try:
        # UTF-8 (BOM or not) or UTF-16 with a BOM (PowerShell's `>`); ANSI bytes: one-line refusal
        text = read_text(path, "config file")
    except FileNotFoundError:
        raise XtrainError(f"config file {path} not found", "check the path") from None
    except IsADirectoryError:
        raise XtrainError(f"config path {path} is a folder, not a YAML file") from None
    except OSError as e:
        raise XtrainError(f"config file {path} cannot be read: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise XtrainError(f"config file {path} is not valid YAML{at}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise XtrainError(
            f"config file {path} must be a mapping of sections (model:, data:, ...), "
            f"got {type(data).__name__}"
        )
    return data


def _apply_mapping(cfg: TrainConfig, data: dict[str, Any], where: str) -> list[str]:
    """Apply ``{section: {key: value}}``; returns the keys set."""
    done = []
    for section, values in data.items():
        section = str(section)
        if section not in _sections():
            _resolve_key(section, "", where)  # raises: unknown section, with the closest name
        if values is None:  # an empty section (`lora:` with nothing under it)
            continue
        if not isinstance(values, dict):
            raise XtrainError(
                f"section '{section}'{where} must be a mapping of keys, got {_show(values)}",
                f"write it as '{section}:' with indented 'key: value' lines below",
            )
        for name, value in values.items():
            key = _resolve_key(section, str(name), where)
            _set(cfg, key, value)
            done.append(key)
    return done


def parse_override(text: str) -> tuple[str, Any, str]:
    """``"section.key=value"`` -> (key, YAML-parsed value, raw value text)."""
    import yaml

    body = text[2:] if text.startswith("--") else text
    key, eq, raw = body.partition("=")
    key = key.strip()
    if not eq or "." not in key:
        raise XtrainError(
            f"override {text!r} must look like section.key=value", "e.g. run.max_steps=20 or data.eval=null"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value, raw.strip()


def _resolve_inputs(cfg: TrainConfig, base: Path, keys: Iterable[str]) -> None:
    """Relative input paths in a config file: next to the file when they exist there."""
    for key in keys:
        if key not in _INPUT_PATHS:
            continue
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if not value or value.startswith("builtin:") or "{" in value or "\n" in value:
            continue  # (a chat template given as text, not as a file)
        if Path(value).expanduser().is_absolute():
            continue
        candidate = base / value
        if candidate.exists():
            setattr(getattr(cfg, section), name, str(candidate.resolve()))


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> TrainConfig:
    """The config of a run: ``path`` (YAML) or the built-in quickstart job when ``None``,
    then ``overrides`` (``section.key=value``, the value read as YAML), then validation."""
    cfg = TrainConfig()
    file = QUICKSTART_CONFIG if path is None else Path(path).expanduser()
    where = "" if path is None else f" in {file}"
    keys = _apply_mapping(cfg, _read_yaml(file), where)
    _resolve_inputs(cfg, file.resolve().parent, keys)
    for text in overrides:
        key, value, raw = parse_override(text)
        section, _, name = key.partition(".")
        key = _resolve_key(section, name, " in the command-line overrides")
        _set(cfg, key, value, from_text=raw)
    _validate(cfg)
    return cfg


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain data (lists, no tuples): for ``yaml.safe_dump`` / JSON next to checkpoints."""

    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """The inverse of ``config_to_dict``, with the same checks as ``load_config``."""
    cfg = TrainConfig()
    _apply_mapping(cfg, data, "")
    _validate(cfg)
    return cfg


# ---------------------------------------------------------------------------------------------
# Batch arithmetic


def _batch_hint(global_batch: int, per_device: int, world_size: int) -> str:
    unit = per_device * world_size
    below = (global_batch // unit) * unit
    above = below + unit
    options = [str(b) for b in (below, above) if b > 0]
    hint = f"use batch.global_batch={' or '.join(options)}"
    if global_batch % world_size == 0:
        per_rank = global_batch // world_size
        fits = [d for d in range(min(per_device, per_rank), 0, -1) if per_rank % d == 0]
        if fits and fits[0] != per_device:
            hint += f", or batch.per_device={fits[0]}"
    return hint


def gradient_accumulation(cfg: TrainConfig, world_size: int) -> int:
    """Micro-batches per optimizer step: global / (per_device x world_size), 1 without a global batch."""
    per_device, global_batch = cfg.batch.per_device, cfg.batch.global_batch
    if global_batch is None:
        return 1
    unit = per_device * world_size
    procs = f"{world_size} process{'es' if world_size != 1 else ''}"
    if global_batch % unit != 0:
        what = "is smaller than" if global_batch < unit else "is not divisible by"
        raise XtrainError(
            f"global batch {global_batch} {what} per-device {per_device} x {procs} ({unit})",
            _batch_hint(global_batch, per_device, world_size),
        )
    return global_batch // unit


def effective_global_batch(cfg: TrainConfig, world_size: int) -> int:
    """The samples per optimizer step: per_device x world_size x accumulation."""
    return cfg.batch.per_device * world_size * gradient_accumulation(cfg, world_size)


def scaled_lr(cfg: TrainConfig, global_batch: int) -> float:
    """``optim.lr`` scaled for ``global_batch`` by ``optim.lr_scaling`` relative to ``base_global_batch``."""
    o = cfg.optim
    if o.lr_scaling == "none" or o.base_global_batch is None:
        return o.lr
    ratio = global_batch / o.base_global_batch
    return o.lr * (ratio if o.lr_scaling == "linear" else math.sqrt(ratio))


def flat_config(cfg: TrainConfig) -> dict[str, Any]:
    """The config as flat scalars (TensorBoard's hparams accept nothing else)."""
    flat: dict[str, Any] = {}
    for section, values in dataclasses.asdict(cfg).items():
        for key, value in values.items():
            flat[f"{section}.{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat
