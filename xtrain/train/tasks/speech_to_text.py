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
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.train import lora, models
from xtrain.train.tasks.contract import (
    Example,
    FileRows,
    Loaded,
    MainProcessFirst,
    PredictRequest,
    Predicts,
    Quickstart,
    Task,
)
from xtrain.train.tasks.image_to_text import PARTS
from xtrain.train.tasks.predicting import normalized_error_rates

if TYPE_CHECKING:
    from xtrain.train.config.schema import TrainConfig
    from xtrain.train.tasks.audio_data import AudioTextRows
    from xtrain.train.workload import Workload

NAME = "speech-to-text"

ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")  # Whisper, Speech2Text, SeamlessM4T-style


def load_processors(source: str, trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(feature extractor, tokenizer, what to save with the adapter)."""
    return models.load_processors(source, trust_remote_code, "feature_extractor")


def _speech_seq2seq(model_type: str | None) -> bool:
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


def decoder_positions(config: Any) -> tuple[str, int | None]:
    """Transcripts go through the decoder: Whisper's ``max_target_positions`` (448) is the limit."""
    decoder = getattr(config, "decoder", None) or config
    return "decoder", getattr(decoder, "max_target_positions", None) or getattr(
        decoder, "max_position_embeddings", None
    )


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


def full_fine_tune(model: Any, cfg: TrainConfig) -> None:
    """Everything trains, but the encoder with ``model.freeze_encoder``; Whisper's sinusoidal
    encoder positions are fixed by design, trained or not."""
    encoder = model.get_encoder()
    frozen = {id(p) for p in encoder.parameters()} if cfg.model.freeze_encoder else set()
    for p in model.parameters():
        p.requires_grad_(id(p) not in frozen)
    positions = getattr(encoder, "embed_positions", None)
    if positions is not None and getattr(model.config, "model_type", "") == "whisper":
        positions.requires_grad_(False)


def lora_plan(model: Any, cfg: TrainConfig) -> tuple[list[str], list[str]]:
    return lora.layers_matching(model, target_pattern(model, cfg.lora)), list(cfg.lora.modules_to_save or [])


def validate(cfg: TrainConfig) -> None:
    if cfg.model.freeze_encoder and cfg.lora.enabled and cfg.lora.apply_to != "decoder":
        raise XtrainError(
            f"model.freeze_encoder with LoRA on the {cfg.lora.apply_to} half would adapt the encoder",
            "with LoRA set lora.apply_to=decoder instead (or lora.enabled=false for a full fine-tune)",
        )


def build(cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.train.tasks import common
    from xtrain.train.tasks.audio_data import (
        AudioTextRows,
        SpeechTextCollator,
        audiofolder_metadata,
        check_audio_files,
    )
    from xtrain.train.workload import Workload

    d, m = cfg.data, cfg.model
    source = common.media_source(cfg, main_process_first, check_model_type)
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
        train, eval_ds, train_name, eval_name = common.raw_datasets(cfg)
        train, eval_ds = (_file_name_column(ds, d.audio_column) for ds in (train, eval_ds))
        train_dir, eval_dir = common.media_dirs(cfg, "audio")
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

    model = common.load_media_model(cfg, TASK, source)
    start = fix_special_tokens(model, tokenizer)
    g = cfg.generation
    generate_kwargs = set_prefix(tokenizer, model, g.language, g.speech_task)
    model = common.finish_model(model, cfg, TASK, apply_lora)
    return Workload(
        model=model,
        train_dataset=train_rows,
        collator=SpeechTextCollator(feature_extractor, tokenizer, d.max_length, start),
        eval_dataset=eval_rows,
        tokenizer=saver,
        main_metric="wer",
        tokens_key=None,
        evaluate=common.generation_eval(
            cfg,
            tokenizer,
            input_key="input_features",
            max_new_tokens=cap_new_tokens(model, g.max_new_tokens),
            generate_kwargs=generate_kwargs,
            normalize=True,
        ),
        train_lengths=train_rows.lengths,  # audio seconds, from the headers read above
    )


# ---------------------------------------------------------------------------------------------
# Predict: audio files -> transcripts


def load_for_predict(folder: Path, base: str, record: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    from transformers import AutoModelForSpeechSeq2Seq

    from xtrain.train.tasks import contract

    feature_extractor, tokenizer, _ = load_processors(str(folder), False)
    base_load = record.get(contract.BASE_LOAD, {})  # a quantized run's base: in 4/8 bits
    model = models.load_pretrained(AutoModelForSpeechSeq2Seq, base, "auto", False, **base_load)
    fix_special_tokens(model, tokenizer)
    return model, tokenizer, {"feature_extractor": feature_extractor}


def answer(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, str]]:
    """Transcripts of a batch of clips (mono, resampled to the model's rate, cut to its window)."""
    from xtrain.train.tasks.predicting import generate_texts, read_clips

    fe = loaded.parts["feature_extractor"]
    rate = int(fe.sampling_rate)
    clips = read_clips(examples, rate, max_seconds(None, fe))
    features = fe(clips, sampling_rate=rate, return_tensors="pt")["input_features"]
    new_tokens = cap_new_tokens(loaded.model, request.max_new_tokens)
    return generate_texts(loaded, {"input_features": features}, request, max_new_tokens=new_tokens)


def predict(loaded: Loaded, request: PredictRequest) -> list[dict[str, str]]:
    """Transcripts of audio files."""
    from xtrain.train.tasks import predicting as p

    p.refuse_prompts(loaded, TASK, request)
    examples = p.file_examples(p.media_files(request.inputs, p.AUDIO_EXTENSIONS, "audio files"))
    return p.file_rows(examples, p.in_batches(answer, loaded, examples, request))


def read_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """A ``--data`` file read as training reads it (an audiofolder through its metadata file):
    ``data.audio_column`` (every file's header read before the model loads; a clip longer than
    the model's window is cut to it, as ``xtrain predict`` cuts audio files) and, where the file
    has it, ``data.text_column``: the reference, scored as training scores it (normalised WER/CER)."""
    from xtrain.train.tasks.audio_data import audiofolder_metadata, check_audio_files
    from xtrain.train.tasks.predicting import load_file, media_examples, references

    d = cfg.data
    meta = audiofolder_metadata(d.eval, "eval")
    if meta is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(d, train=str(meta), eval=str(meta)))
    ds, source, folder = load_file(cfg, "audio")
    ds = _file_name_column(ds, d.audio_column)
    if d.audio_column not in ds.column_names:
        _require_columns(ds, d.audio_column, d.text_column, source)  # names the missing column
    check_audio_files(ds, d.audio_column, folder, source, None, "cut")
    refs = references(ds, d.text_column, source, "data.text_column")
    return media_examples(ds, d.audio_column, folder, source, refs, "Audio")


def _quickstart_inputs() -> list[str]:
    folder = builtin.ensure_builtin_data("builtin:spoken-words")  # already built by the run
    row = json.loads((folder / "eval.jsonl").read_text(encoding="utf-8").splitlines()[0])
    return [str(folder / row["audio"])]


TASK = Task(
    name=NAME,
    decodes_media=True,
    about="audio clips and their transcripts (Whisper); metric: WER/CER by generation",
    build=build,
    aliases=("asr",),
    keys=frozenset(
        {
            "data.audio_column",
            "data.audio_root",
            "data.text_column",
            "data.max_audio_seconds",
            "data.long_audio",
            "data.group_by_length",
            "model.quantization",
            "lora.apply_to",
            "model.freeze_encoder",
            "generation.max_new_tokens",
            "generation.num_beams",
            "generation.sample_predictions",
            "generation.language",
            "generation.speech_task",
        }
    ),
    validate=validate,
    model_class="AutoModelForSpeechSeq2Seq",
    lora_plan=lora_plan,
    full_fine_tune=full_fine_tune,
    positions=decoder_positions,
    # Whisper's prompt: start, language, task, no-timestamps (fewer for other models)
    generation_prompt=lambda cfg: 4,
    resume_keys=("lora.apply_to", "model.freeze_encoder"),
    recognizes=lambda config: _speech_seq2seq(config.get("model_type")),
    predicts=Predicts(
        takes="audio files",
        load=load_for_predict,
        run=predict,
        file=FileRows(
            rows="audio paths (+ their transcript)",
            read=read_file,
            answer=answer,
            score=normalized_error_rates,
        ),
    ),
    quickstart=Quickstart(
        job="quickstart-speech-to-text.yaml",
        about="ASR",
        next_command="xtrain train examples/speech-to-text-words.yaml",
        headline=("wer", "WER", "share of words wrong; 0 is perfect"),
        predict_args=_quickstart_inputs,
    ),
)
