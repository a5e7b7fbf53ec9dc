"""Checks of a whole config: the ones that involve more than one field."""

from __future__ import annotations

from xtrain.errors import XtrainError
from xtrain.train.config.schema import TrainConfig

GENERATIVE_TASKS = ("image-to-text", "speech-to-text", "vision-language")


def validate(cfg: TrainConfig) -> None:
    """Checks that involve more than one field; the first mistake raises (in this order)."""
    _check_model(cfg)
    _check_data(cfg)
    _check_lora(cfg)
    _check_vision_language_keys(cfg)
    m, d, o = cfg.model, cfg.data, cfg.optim
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


def _check_model(cfg: TrainConfig) -> None:
    m = cfg.model
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


def _check_data(cfg: TrainConfig) -> None:
    """The data keys against each other and against the task."""
    m, d = cfg.model, cfg.data
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
    if m.task in GENERATIVE_TASKS:
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


def _check_lora(cfg: TrainConfig) -> None:
    """Which half of the model gets adapters, against the task and model.freeze_encoder."""
    m = cfg.model
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


def _check_vision_language_keys(cfg: TrainConfig) -> None:
    m, d = cfg.model, cfg.data
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
