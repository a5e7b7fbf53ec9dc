"""``speech-to-text``: an encoder-decoder speech model (Whisper and other
``AutoModelForSpeechSeq2Seq`` checkpoints) learns to transcribe audio; evaluated by generating
(WER, CER, eval loss) through the same path as image-to-text (``xtrain.train.generation``).

- Model: a local folder, a hub id or ``builtin:tiny-whisper``; the feature extractor and the
  tokenizer from ``AutoProcessor`` (else ``AutoFeatureExtractor`` + ``AutoTokenizer``).
- Whisper prefix tokens: ``generation.language`` / ``generation.speech_task`` set the tokenizer's
  prefix (``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``) for the labels and the
  same ``language=`` / ``task=`` for ``generate``; the old ``forced_decoder_ids`` are cleared
  (transformers ignores or warns about them). The labels start after ``<|startoftranscript|>``:
  the model puts that token in front of the shifted labels itself.
- LoRA: ``lora.apply_to`` (both | encoder | decoder) picks the half; auto targets are the
  attention projections (q/k/v/out_proj) of that half. ``model.freeze_encoder`` keeps the encoder
  fixed in a full fine-tune (``lora.enabled: false``). Full fine-tune is possible.
- Data: see ``xtrain.train.tasks.audio_data`` (paths relative to the data file, ``audiofolder`` with
  metadata, ``Audio`` features; read lazily with soundfile, mono, resampled).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError
from xtrain.train import lora, models
from xtrain.train.config.schema import TrainConfig
from xtrain.train.generation import GenerationEval
from xtrain.train.tasks.audio_data import (
    AudioTextRows,
    SpeechTextCollator,
    audiofolder_metadata,
    check_audio_files,
)
from xtrain.train.tasks.image_to_text import PARTS, base_dir
from xtrain.train.workload import Workload

ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")  # Whisper, Speech2Text, SeamlessM4T-style


def load_processors(source: str, trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(feature extractor, tokenizer, what to save with the adapter)."""
    return models.load_processors(source, trust_remote_code, "feature_extractor")


def check_model_type(source: str, trust_remote_code: bool) -> None:
    """Only speech sequence-to-sequence checkpoints: said before anything else is loaded."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES

    models.require_model_type(
        source,
        trust_remote_code,
        MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
        "a speech encoder-decoder (Whisper, Speech2Text)",
        "speech-to-text takes AutoModelForSpeechSeq2Seq checkpoints; CTC models need a custom task",
    )


def load_model(source: str, dtype: str, trust_remote_code: bool) -> Any:
    from transformers import AutoModelForSpeechSeq2Seq

    return models.load_pretrained(AutoModelForSpeechSeq2Seq, source, dtype, trust_remote_code)


def set_prefix(tokenizer: Any, model: Any, language: str | None, task: str) -> dict[str, Any]:
    """Whisper's language/task prefix on the tokenizer (labels) and the ``generate`` arguments
    that write the same prefix; ``{}`` for models without one."""
    gen = model.generation_config
    # Deprecated since transformers 4.38: generate warns about, or prefers, these over language/task.
    for target in (model.config, gen):
        if getattr(target, "forced_decoder_ids", None) is not None:
            target.forced_decoder_ids = None
    multilingual = hasattr(gen, "lang_to_id") and hasattr(gen, "task_to_id")
    if not multilingual:  # English-only Whisper (*.en: no language or task token) or another model
        if language is not None or task != "transcribe":
            key = "language" if language is not None else "speech_task"
            raise XtrainError(
                f"generation.{key}={language or task} but {type(model).__name__} has no language/task tokens",
                "leave generation.language unset and generation.speech_task=transcribe for an "
                "English-only or non-Whisper model",
            )
        return {}
    if hasattr(tokenizer, "set_prefix_tokens"):
        tokenizer.set_prefix_tokens(language=language, task=task)
    return {"language": language, "task": task} if language else {"task": task}


def fix_special_tokens(model: Any, tokenizer: Any) -> int:
    """The decoder start and pad ids on the config and generation config; returns the start id."""
    config, gen = model.config, model.generation_config
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(gen, "decoder_start_token_id", None)
    if start is None:
        start = tokenizer.bos_token_id
    pad = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_token_id
    from xtrain.train.tasks.common import set_decoder_tokens

    set_decoder_tokens(model, tokenizer, start, pad, ("model", getattr(config, "vocab_size", None)))
    return int(start)


def target_pattern(model: Any, lora_cfg: Any) -> str:
    """A peft ``target_modules`` regex on module names (``model.encoder.layers.0.self_attn.q_proj``)."""
    explicit = lora_cfg.target_modules
    if isinstance(explicit, str) and explicit != "auto":
        explicit = [explicit]
    names = explicit if isinstance(explicit, list) else list(ATTENTION)
    leaves = set(lora.linear_layers(model).values())
    if not isinstance(explicit, list) and not any(n in leaves for n in names):
        names = lora.find_target_modules(model)
    parts = "|".join(PARTS[lora_cfg.apply_to])
    return rf"^(?:.*\.)?(?:{parts})\..*\.(?:{'|'.join(re.escape(n) for n in names)})$"


def apply_lora(model: Any, lora_cfg: Any) -> Any:
    where = lora_cfg.apply_to if lora_cfg.apply_to != "both" else "encoder or decoder"
    return lora.apply_lora_matching(model, lora_cfg, target_pattern(model, lora_cfg), where)


def cap_new_tokens(model: Any, max_new_tokens: int) -> int:
    """``max_new_tokens`` within the decoder's positions: Whisper's ``generate`` refuses a prompt
    (up to 4 tokens: start, language, task, no-timestamps) + new tokens beyond
    ``max_target_positions`` (448) instead of stopping there."""
    positions = getattr(getattr(model, "config", None), "max_target_positions", None)
    return max(1, min(max_new_tokens, positions - 4)) if positions else max_new_tokens


def max_seconds(cfg_seconds: float | None, feature_extractor: Any) -> float | None:
    """``data.max_audio_seconds``, else the model's window (30 s for Whisper)."""
    if cfg_seconds is not None:
        return float(cfg_seconds)
    window = getattr(feature_extractor, "chunk_length", None)
    return float(window) if window else None


def _require_columns(ds: Any, audio_column: str, text_column: str, source: str) -> None:
    """Both columns exist; the text column holds text (the audio column holds paths or an
    ``Audio`` feature's dicts, so only its presence is checked)."""
    from xtrain.train import data

    if audio_column not in ds.column_names:
        raise XtrainError(
            f"column '{audio_column}' not in {source} (columns: {', '.join(ds.column_names)})",
            "set data.audio_column to one of them",
        )
    data.require_columns(ds, {"data.text_column": text_column}, source)


def _file_name_column(ds: Any, audio_column: str) -> Any:
    """An audiofolder's ``file_name`` column serves as the audio column when there is none."""
    if ds is not None and "file_name" in ds.column_names and audio_column not in ds.column_names:
        return ds.rename_column("file_name", audio_column)
    return ds


def build_speech_to_text(cfg: TrainConfig, main_process_first: Any = contextlib.nullcontext) -> Workload:
    from xtrain.train.tasks.common import raw_datasets

    d, m = cfg.data, cfg.model
    with main_process_first():  # a built-in model is written once, by the first process
        source = models.resolve_model(m.name_or_path)
    check_model_type(source, m.trust_remote_code)
    feature_extractor, tokenizer, saver = load_processors(source, m.trust_remote_code)
    rate = int(feature_extractor.sampling_rate)
    seconds = max_seconds(d.max_audio_seconds, feature_extractor)
    # An audiofolder is read through its metadata file (its paths are relative to that file).
    train_meta, eval_meta = audiofolder_metadata(d.train, "train"), audiofolder_metadata(d.eval, "eval")
    if train_meta or eval_meta:
        d = dataclasses.replace(
            d, train=str(train_meta or d.train), eval=str(eval_meta or d.eval) if d.eval else None
        )
        cfg = dataclasses.replace(cfg, data=d)
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        train, eval_ds = (_file_name_column(ds, d.audio_column) for ds in (train, eval_ds))
        train_dir = base_dir(d.train or "", "train")
        eval_dir = base_dir(d.eval, "eval") if d.eval else train_dir
        durations: dict[str, list[float] | None] = {}  # seconds per clip, from the headers checked here
        for role, ds, name, folder in (
            ("train", train, train_name, train_dir),
            ("eval", eval_ds, eval_name, eval_dir),
        ):
            if ds is not None:
                _require_columns(ds, d.audio_column, d.text_column, name)
                durations[role] = check_audio_files(ds, d.audio_column, folder, name, seconds, d.long_audio)

    def rows(ds: Any, folder: Path | None, name: str, role: str) -> AudioTextRows:
        return AudioTextRows(
            ds, d.audio_column, d.text_column, folder, name, rate, seconds, d.long_audio, durations.get(role)
        )

    train_rows = rows(train, train_dir, train_name, "train")
    eval_rows = rows(eval_ds, eval_dir, eval_name, "eval") if eval_ds is not None else None

    from transformers import set_seed

    set_seed(cfg.run.seed)
    model = load_model(source, m.dtype, m.trust_remote_code)
    start = fix_special_tokens(model, tokenizer)
    g = cfg.generation
    generate_kwargs = set_prefix(tokenizer, model, g.language, g.speech_task)
    if m.gradient_checkpointing:
        lora.enable_gradient_checkpointing(model, cfg.lora.enabled)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    else:
        encoder = model.get_encoder()
        frozen = {id(p) for p in encoder.parameters()} if m.freeze_encoder else set()
        for p in model.parameters():
            p.requires_grad_(id(p) not in frozen)
        # Whisper's sinusoidal encoder positions are fixed by design, trained or not.
        positions = getattr(encoder, "embed_positions", None)
        if positions is not None and getattr(model.config, "model_type", "") == "whisper":
            positions.requires_grad_(False)
    return Workload(
        model=model,
        train_dataset=train_rows,
        collator=SpeechTextCollator(feature_extractor, tokenizer, d.max_length, start),
        eval_dataset=eval_rows,
        tokenizer=saver,
        main_metric="wer",
        tokens_key=None,
        evaluate=GenerationEval(
            tokenizer=tokenizer,
            input_key="input_features",
            max_new_tokens=cap_new_tokens(model, g.max_new_tokens),
            num_beams=g.num_beams,
            sample_predictions=g.sample_predictions,
            generate_kwargs=generate_kwargs,
            normalize=True,
        ),
        train_lengths=train_rows.lengths,  # audio seconds, from the headers read above
    )
