"""A model's sizes for the memory estimate (``memory.ModelSizes``), without loading its weights.

- ``offline_sizes(cfg)``: before launching (``xtrain train``'s plan). The config is read only
  where it already is (a local folder, a built-in, the Hugging Face cache: never a download, never
  a repository's custom code); the model is built on the meta device (``init_empty_weights`` +
  the task's Auto class ``from_config``: shapes, no memory) and given the task's own LoRA, so
  both counts are exact. Anything that stops it returns the reason instead (the plan skips the
  estimate; the run itself reports real problems).
- ``live_sizes(model)``: the training loop's model as it is (real counts, real dtypes).

Imports transformers, peft and accelerate: the CLI imports this module only when the plan needs
the estimate (a CUDA machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.train import memory
from xtrain.train.config import TrainConfig

# task -> the class its builder loads (custom tasks build their own model: no estimate)
AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "seq-cls": "AutoModelForSequenceClassification",
    "image-to-text": "VisionEncoderDecoderModel",
    "speech-to-text": "AutoModelForSpeechSeq2Seq",
    "vision-language": "AutoModelForImageTextToText",
}


def read_config_offline(cfg: TrainConfig) -> Any | str:
    """The model's ``AutoConfig`` from a local folder, a built-in or the hub cache; else why not."""
    from transformers import AutoConfig

    from xtrain.train import models

    name = cfg.model.name_or_path
    if cfg.model.trust_remote_code:
        return "the model's config runs custom code (model.trust_remote_code)"
    if builtin.is_builtin(name):
        try:
            source = str(builtin.ensure_builtin_model(name))  # the run builds the same folder
        except XtrainError as e:
            return e.message
    elif Path(name).expanduser().is_dir():
        source = str(Path(name).expanduser())
    elif models.looks_like_hub_id(name):
        source = name
    else:
        return f"{name} not found"
    try:  # local_files_only: the hub cache at most, no network
        return AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    except Exception:
        return f"{name} is not downloaded yet"


def _trainable(model: Any, cfg: TrainConfig) -> Any:
    """``model`` as the task's builder leaves it: LoRA applied, or what a full fine-tune trains."""
    task, lora_cfg = cfg.model.task, cfg.lora
    if task == "vision-language":
        from xtrain.train.tasks import vision_language

        if lora_cfg.enabled:
            return vision_language.apply_lora(model, lora_cfg)
        vision_language.full_fine_tune(model, cfg.model.freeze_vision)
        return model
    if not lora_cfg.enabled:
        return model  # everything trains (a pooler or position table left frozen is noise)
    if task == "image-to-text":
        from xtrain.train.tasks import image_to_text

        return image_to_text.apply_lora(model, lora_cfg)
    if task == "speech-to-text":
        from xtrain.train.tasks import speech_to_text

        return speech_to_text.apply_lora(model, lora_cfg)
    from xtrain.train import lora

    return lora.apply_lora(model, lora_cfg, task)


def offline_sizes(cfg: TrainConfig) -> memory.ModelSizes | str:
    """Exact parameter counts from a model built on the meta device; or why there is no estimate."""
    import transformers
    from accelerate import init_empty_weights

    if cfg.model.task not in AUTO_CLASSES:
        return f"task {cfg.model.task} builds its own model"
    config = read_config_offline(cfg)
    if isinstance(config, str):
        return config
    shape = memory.model_shape(config)
    if shape is None:
        return f"the config of {cfg.model.name_or_path} names no hidden size or layer count"
    auto = getattr(transformers, AUTO_CLASSES[cfg.model.task])
    try:
        with init_empty_weights():
            # Auto classes build from a config with from_config, model classes with their constructor
            bare = auto.from_config(config) if hasattr(auto, "from_config") else auto(config)
            tied = _tied_count(bare, config)
            model = _trainable(bare, cfg)  # LoRA adds parameters (and modules_to_save copies)
    except Exception as e:  # noqa: BLE001 - advisory: an estimate must never stop a launch
        # a model of another task, LoRA targets that match nothing: the run says so in one line
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        return f"cannot build {cfg.model.name_or_path} for {cfg.model.task}: {reason}"
    after = sum(p.numel() for p in model.parameters())
    checkpoint_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return memory.ModelSizes(
        params=after - tied,
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        shape=shape,
        weight_bytes=memory.weight_bytes(cfg.model.dtype, str(checkpoint_dtype)),
    )


def _tied_count(model: Any, config: Any) -> int:
    """Parameters that loading ties to another (an output head sharing the input embedding:
    ``tie_word_embeddings``); a model built from its config on the meta device keeps them apart."""
    keys = getattr(model, "_tied_weights_keys", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not isinstance(keys, dict) or not getattr(text, "tie_word_embeddings", False):
        return 0
    params = dict(model.named_parameters())
    pairs = [(params.get(k), params.get(src)) for k, src in keys.items()]
    return sum(a.numel() for a, b in pairs if a is not None and b is not None and a is not b)


def live_sizes(model: Any) -> memory.ModelSizes | None:
    """The sizes of a built model: counts, and the bytes of its frozen weights as loaded."""
    shape = memory.model_shape(getattr(model, "config", None))
    if shape is None:
        return None
    params = trainable = frozen = frozen_bytes = 0
    for p in model.parameters():
        params += p.numel()
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
            frozen_bytes += p.numel() * p.element_size()
    weight_bytes = 2 if frozen and frozen_bytes / frozen < 3 else 4
    return memory.ModelSizes(params, trainable, shape, weight_bytes)


def check_live_model(
    model: Any, cfg: TrainConfig, precision: str, total_bytes: int, gpu_name: str
) -> memory.MemoryCheck | None:
    """The training loop's check on its CUDA device (``total_bytes``: the card's memory)."""
    sizes = live_sizes(model)
    if sizes is None:
        return None
    return memory.check_memory(
        sizes,
        cfg.batch.per_device,
        cfg.data.max_length,
        cfg.model.gradient_checkpointing,
        precision,
        total_bytes / memory.GIB,
        gpu_name,
    )
