"""What speech-to-text's build (``speech_to_text.py``), data check (``check.py``) and
predict (``predict.py``) share: the processors, Whisper's decoder tokens and language/task
prefix, the audio window and the columns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.model import load as models

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor

    pass
    from datasets import Dataset
    from torch.nn import Module

    from xtrain.config.schema import TrainConfig
import dataclasses

NAME = "speech-to-text"


def load_processors(
    source: str, trust_remote_code: bool
) -> tuple[SequenceFeatureExtractor, PreTrainedTokenizerBase, ProcessorMixin | models.ProcessorFiles]:
    """(feature extractor, tokenizer, what to save with the adapter)."""
    return models.load_processors(source, trust_remote_code, "feature_extractor")


def cap_new_tokens(model: Module, max_new_tokens: int) -> int:
    """``max_new_tokens`` within the decoder's positions: Whisper's ``generate`` refuses a prompt
    (up to 4 tokens: start, language, task, no-timestamps) + new tokens beyond
    ``max_target_positions`` (448) instead of stopping there."""
    positions = getattr(getattr(model, "config", None), "max_target_positions", None)
    return max(1, min(max_new_tokens, positions - 4)) if positions else max_new_tokens


def max_seconds(cfg_seconds: float | None, feature_extractor: SequenceFeatureExtractor) -> float | None:
    """``data.max_audio_seconds``, else the model's window (30 s for Whisper)."""
    if cfg_seconds is not None:
        return float(cfg_seconds)
    window = getattr(feature_extractor, "chunk_length", None)
    return float(window) if window else None


def require_columns(ds: Dataset, audio_column: str, text_column: str, source: str) -> None:
    """Both columns exist; the text column holds text (the audio column holds paths or an
    ``Audio`` feature's dicts, so only its presence is checked)."""
    from xtrain.data.tokenize import require_columns

    if audio_column not in ds.column_names:
        raise XtrainError(
            f"column '{audio_column}' not in {source} (columns: {', '.join(ds.column_names)})",
            "set data.audio_column to one of them",
        )
    require_columns(ds, {"data.text_column": text_column}, source)


def file_name_column(ds: Dataset, audio_column: str) -> Dataset:
    """An audiofolder's ``file_name`` column serves as the audio column when there is none."""
    if ds is not None and "file_name" in ds.column_names and audio_column not in ds.column_names:
        return ds.rename_column("file_name", audio_column)
    return ds


def fix_special_tokens(model: Module, tokenizer: PreTrainedTokenizerBase) -> int:
    """The decoder start and pad ids on the config and generation config; returns the start id."""
    config, gen = model.config, model.generation_config
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(gen, "decoder_start_token_id", None)
    if start is None:
        start = tokenizer.bos_token_id
    pad = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_token_id
    from xtrain.tasks.common import set_decoder_tokens

    set_decoder_tokens(model, tokenizer, start, pad, ("model", getattr(config, "vocab_size", None)))
    return int(start)


def speech_seq2seq(model_type: str | None) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES

    return model_type in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES


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


def set_prefix(
    tokenizer: PreTrainedTokenizerBase, model: Module, language: str | None, task: str
) -> dict[str, Any]:
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


def with_metadata(cfg: TrainConfig) -> TrainConfig:
    """An audiofolder is read through its metadata file (its paths are relative to that file)."""
    from xtrain.data.rows.audio import audiofolder_metadata

    d = cfg.data
    train = d.train if isinstance(d.train, str) else None  # several files: each read as it is
    train_meta, eval_meta = audiofolder_metadata(train, "train"), audiofolder_metadata(d.eval, "eval")
    if not (train_meta or eval_meta):
        return cfg
    found = {"train": str(train_meta or d.train), "eval": str(eval_meta or d.eval) if d.eval else None}
    return dataclasses.replace(cfg, data=dataclasses.replace(d, **found))


def label_start(cfg: TrainConfig, source: str, tokenizer: PreTrainedTokenizerBase) -> int:
    """The decoder start id the labels leave out, with Whisper's language/task prefix set on the
    tokenizer: ``fix_special_tokens`` and ``set_prefix`` on the checkpoint's config and generation
    config, before its weights load (the loaded model gives the same)."""
    import types

    from transformers import GenerationConfig

    config = models.load_config(source, cfg.model.trust_remote_code)
    try:
        generation = GenerationConfig.from_pretrained(source)
    except Exception:  # no generation_config.json: what from_pretrained makes of the model config
        generation = GenerationConfig.from_model_config(config)
    stand_in = types.SimpleNamespace(config=config, generation_config=generation)
    start = fix_special_tokens(stand_in, tokenizer)
    set_prefix(tokenizer, stand_in, cfg.generation.language, cfg.generation.speech_task)
    return start
