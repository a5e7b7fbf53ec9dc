"""``image-to-text``: a ``VisionEncoderDecoderModel`` (TrOCR, ViT-GPT2, Donut-style) learns to
write the text of an image; evaluated by generating (CER, WER, eval loss).

- Model: a local folder, a hub id or ``builtin:tiny-trocr``; the image processor and tokenizer
  from ``AutoProcessor`` when the checkpoint has one, else ``AutoImageProcessor`` +
  ``AutoTokenizer``. ``decoder_start_token_id`` / ``pad_token_id`` / ``eos_token_id`` are filled
  in when the checkpoint leaves them out (training fails, or generation never starts, without).
- LoRA: ``lora.apply_to`` (both | encoder | decoder) picks the half that gets adapters; the
  auto targets are the attention projections of each half (ViT/DeiT/BEiT/Swin encoders;
  TrOCR, GPT-2, BERT/RoBERTa, mBART decoders). ``lora.enabled: false`` trains everything.
- Data: see ``xtrain.train.tasks.image_data`` (paths relative to the data file, ``imagefolder`` with
  metadata, ``Image`` features; read lazily, converted to RGB).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from xtrain import builtin
from xtrain.train import data, lora, models
from xtrain.train.config.schema import TrainConfig
from xtrain.train.generation import GenerationEval
from xtrain.train.tasks.image_data import ImageTextCollator, ImageTextRows, check_image_files
from xtrain.train.workload import Workload

_QKV = ("query", "key", "value", "q_proj", "k_proj", "v_proj")  # both spellings across transformers versions
_QKVO = ("q_proj", "k_proj", "v_proj", "out_proj")
# model_type -> the attention projections LoRA adapts (those present in the model are kept).
ENCODER_TARGETS: dict[str, tuple[str, ...]] = {
    t: _QKV for t in ("vit", "deit", "beit", "swin", "swinv2", "donut-swin", "dinov2", "convnext")
}
DECODER_TARGETS: dict[str, tuple[str, ...]] = {
    "trocr": _QKVO,
    "gpt2": ("c_attn", "q_attn"),  # self-attention q/k/v, and cross-attention k/v + q
    "bert": _QKV,
    "roberta": _QKV,
    "xlm-roberta": _QKV,
    "electra": _QKV,
    "mbart": _QKVO,
    "bart": _QKVO,
}
PARTS = {"both": ("encoder", "decoder"), "encoder": ("encoder",), "decoder": ("decoder",)}


def load_processors(source: str, trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(image processor, tokenizer, what to save with the adapter)."""
    return models.load_processors(source, trust_remote_code, "image_processor")


def check_model_type(source: str, trust_remote_code: bool) -> None:
    """Only vision encoder-decoder checkpoints (loaded as VisionEncoderDecoderModel, remote code or not)."""
    models.require_model_type(
        source,
        trust_remote_code,
        ("vision-encoder-decoder",),
        "a vision encoder-decoder (TrOCR, ViT-GPT2, Donut)",
        "image-to-text takes VisionEncoderDecoderModel checkpoints; other models need a custom task",
        remote_ok=False,
    )


def load_model(source: str, dtype: str, trust_remote_code: bool) -> Any:
    from transformers import VisionEncoderDecoderModel

    return models.load_pretrained(VisionEncoderDecoderModel, source, dtype, trust_remote_code)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def fix_special_tokens(model: Any, tokenizer: Any) -> None:
    """Decoder start, pad and eos ids on the model config and the generation config, taken from
    the checkpoint where set, else from the tokenizer (TrOCR and GPT-2 checkpoints often lack them)."""
    config, decoder, gen = model.config, model.config.decoder, model.generation_config
    start = _first(
        getattr(config, "decoder_start_token_id", None),
        getattr(gen, "decoder_start_token_id", None),
        getattr(decoder, "decoder_start_token_id", None),
        tokenizer.bos_token_id,
        tokenizer.cls_token_id,
        tokenizer.eos_token_id,
    )
    pad = _first(
        getattr(config, "pad_token_id", None), getattr(decoder, "pad_token_id", None), tokenizer.pad_token_id
    )
    eos = _first(
        getattr(config, "eos_token_id", None),
        getattr(decoder, "eos_token_id", None),
        tokenizer.eos_token_id,
        tokenizer.sep_token_id,
    )
    from xtrain.train.tasks.common import set_decoder_tokens

    vocab = ("decoder", getattr(decoder, "vocab_size", None))
    set_decoder_tokens(model, tokenizer, start, pad, vocab, eos_token_id=eos)


def _auto_names(part: Any, table: dict[str, tuple[str, ...]]) -> list[str]:
    model_type = getattr(getattr(part, "config", None), "model_type", None)
    leaves = set(lora.linear_layers(part).values())
    names = [n for n in table.get(model_type or "", ()) if n in leaves]
    return names or lora.find_target_modules(part)


def target_pattern(model: Any, lora_cfg: Any) -> str:
    """A peft ``target_modules`` regex (full match on module names) for the chosen halves."""
    explicit = lora_cfg.target_modules
    if isinstance(explicit, str) and explicit != "auto":
        explicit = [explicit]
    alternatives = []
    for part in PARTS[lora_cfg.apply_to]:
        if isinstance(explicit, list):
            names = explicit
        else:
            names = _auto_names(
                getattr(model, part), ENCODER_TARGETS if part == "encoder" else DECODER_TARGETS
            )
        alternatives.append(rf"{part}\..*\.(?:{'|'.join(re.escape(n) for n in names)})")
    return "^(?:" + "|".join(alternatives) + ")$"


def apply_lora(model: Any, lora_cfg: Any) -> Any:
    where = lora_cfg.apply_to if lora_cfg.apply_to != "both" else "encoder or decoder"
    return lora.apply_lora_matching(model, lora_cfg, target_pattern(model, lora_cfg), where)


def base_dir(source: str, role: str) -> Path | None:
    """The folder that relative image paths of ``source`` are relative to."""
    if builtin.is_builtin(source):
        return builtin.builtin_data_file(source, "train" if role == "train" else "eval").parent
    path = Path(source).expanduser()
    if path.is_file():
        return path.resolve().parent
    if path.is_dir():
        return path.resolve()
    return None


def build_image_to_text(cfg: TrainConfig, main_process_first: Any = contextlib.nullcontext) -> Workload:
    from xtrain.train.tasks.common import raw_datasets

    d = cfg.data
    with main_process_first():  # a built-in model is written once, by the first process
        source = models.resolve_model(cfg.model.name_or_path)
    check_model_type(source, cfg.model.trust_remote_code)
    image_processor, tokenizer, saver = load_processors(source, cfg.model.trust_remote_code)
    columns = {"data.image_column": d.image_column, "data.text_column": d.text_column}
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        train_dir = base_dir(d.train or "", "train")
        eval_dir = base_dir(d.eval, "eval") if d.eval else train_dir
        for ds, name, folder in ((train, train_name, train_dir), (eval_ds, eval_name, eval_dir)):
            if ds is not None:
                data.require_columns(ds, columns, name)
                check_image_files(ds, d.image_column, folder, name)
    train_rows = ImageTextRows(train, d.image_column, d.text_column, train_dir, train_name)
    eval_rows = None
    if eval_ds is not None:
        eval_rows = ImageTextRows(eval_ds, d.image_column, d.text_column, eval_dir, eval_name)

    from transformers import set_seed

    set_seed(cfg.run.seed)
    model = load_model(source, cfg.model.dtype, cfg.model.trust_remote_code)
    fix_special_tokens(model, tokenizer)
    pooler = getattr(model.encoder, "pooler", None)
    if pooler is not None:  # unused by the decoder: frozen, or DDP waits for its gradients
        pooler.requires_grad_(False)
    if cfg.model.gradient_checkpointing:
        lora.enable_gradient_checkpointing(model, cfg.lora.enabled)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    else:
        for name, p in model.named_parameters():
            p.requires_grad_(not name.startswith("encoder.pooler."))
    g = cfg.generation
    return Workload(
        model=model,
        train_dataset=train_rows,
        collator=ImageTextCollator(image_processor, tokenizer, d.max_length),
        eval_dataset=eval_rows,
        tokenizer=saver,
        main_metric="cer",
        tokens_key=None,
        evaluate=GenerationEval(
            tokenizer=tokenizer,
            max_new_tokens=g.max_new_tokens,
            num_beams=g.num_beams,
            sample_predictions=g.sample_predictions,
        ),
    )
