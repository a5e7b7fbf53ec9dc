"""``speech-to-text``: an encoder-decoder speech model (Whisper and other
``AutoModelForSpeechSeq2Seq`` checkpoints) learns to transcribe audio; evaluated by generating
(WER, CER, eval loss) through the same path as image-to-text (``xtrain.tasks.generation``).

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
- Data: see ``xtrain.data.rows.audio`` (paths relative to the data file, ``audiofolder`` with
  metadata, ``Audio`` features; read lazily with soundfile, mono, resampled); checked before the
  run by ``check`` (the data check).
- ``xtrain predict``: audio files and the rows of a ``--data`` file -> transcripts (``predict``).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.model import lora, lora_layers
from xtrain.tasks import stacks as st
from xtrain.tasks.contract import FileRows, MainProcessFirst, Predicts, Quickstart, Task, Workload
from xtrain.tasks.predicting import normalized_error_rates
from xtrain.tasks.speech import check as speech_check
from xtrain.tasks.speech import predict as speech_predict
from xtrain.tasks.speech.parts import (
    NAME,
    cap_new_tokens,
    check_model_type,
    file_name_column,
    fix_special_tokens,
    label_start,
    load_processors,
    max_seconds,
    require_columns,
    set_prefix,
    speech_seq2seq,
    with_metadata,
)
from xtrain.tasks.vision.image_to_text import PARTS

if TYPE_CHECKING:
    from types import SimpleNamespace

    from datasets import Dataset
    from peft import PeftModel
    from torch.nn import Module
    from transformers import PretrainedConfig

    from xtrain.config.schema import LoraConfig, TrainConfig
    from xtrain.data.rows.audio import AudioTextRows
    from xtrain.model.activations import Stack
    from xtrain.planning.run import Run

ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")  # Whisper, Speech2Text, SeamlessM4T-style


def target_pattern(model: Module, lora_cfg: LoraConfig) -> str:
    """A peft ``target_modules`` regex on module names (``model.encoder.layers.0.self_attn.q_proj``)."""
    explicit = lora_cfg.target_modules
    parts = "|".join(PARTS[lora_cfg.apply_to])
    if lora_layers.is_all_linear(explicit):  # every Linear of the chosen halves but the output head
        inside = re.compile(rf"^(?:.*\.)?(?:{parts})\.")
        return lora_layers.exact_pattern([q for q in lora_layers.body_layers(model) if inside.match(q)])
    if isinstance(explicit, str) and explicit != "auto":
        explicit = [explicit]
    names = explicit if isinstance(explicit, list) else list(ATTENTION)
    leaves = set(lora_layers.linear_layers(model).values())
    if not isinstance(explicit, list) and not any(n in leaves for n in names):
        names = lora_layers.find_target_modules(model)
    return rf"^(?:.*\.)?(?:{parts})\..*\.(?:{'|'.join(re.escape(n) for n in names)})$"


def apply_lora(model: Module, lora_cfg: LoraConfig) -> PeftModel:
    where = lora_cfg.apply_to if lora_cfg.apply_to != "both" else "encoder or decoder"
    return lora.apply_lora_matching(model, lora_cfg, target_pattern(model, lora_cfg), where)


def decoder_positions(config: PretrainedConfig | SimpleNamespace) -> tuple[str, int | None]:
    """Transcripts go through the decoder: Whisper's ``max_target_positions`` (448) is the limit."""
    decoder = getattr(config, "decoder", None) or config
    return "decoder", getattr(decoder, "max_target_positions", None) or getattr(
        decoder, "max_position_embeddings", None
    )


def full_fine_tune(model: Module, cfg: TrainConfig) -> None:
    """Everything trains, but the encoder with ``model.freeze_encoder``; Whisper's sinusoidal
    encoder positions are fixed by design, trained or not."""
    encoder = model.get_encoder()
    frozen = {id(p) for p in encoder.parameters()} if cfg.model.freeze_encoder else set()
    for p in model.parameters():
        p.requires_grad_(id(p) not in frozen)
    positions = getattr(encoder, "embed_positions", None)
    if positions is not None and getattr(model.config, "model_type", "") == "whisper":
        positions.requires_grad_(False)


def lora_plan(model: Module, cfg: TrainConfig) -> tuple[list[str], list[str]]:
    whole = list(cfg.lora.modules_to_save or [])
    return lora_layers.layers_matching(model, target_pattern(model, cfg.lora)), whole


def stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """The encoder always runs its whole window (Whisper pads every clip to 30 s: 3000 mel frames,
    halved by its conv stem to ``max_source_positions`` = 1500), the decoder the transcript's
    tokens, reading the encoder's positions in every layer's cross-attention."""
    c = model.config
    frames = st.first(c, "max_source_positions") or cfg.data.max_length
    width = st.first(c, "d_model", "hidden_size") or 0
    # Whisper's stem, when it trains: conv1's mel input and two GELU + conv inputs over 2x the frames
    stem = 5 * width + 2 * (st.first(c, "num_mel_bins") or 0)
    encoder, decoder = (st.name_of(model, m) for m in (model.get_encoder(), model.get_decoder()))

    def sizes(half: str) -> dict[str, int]:
        ffn, heads = st.first(c, f"{half}_ffn_dim"), st.first(c, f"{half}_attention_heads")
        return {"intermediate": ffn or 4 * width, "heads": heads or 1}

    return [
        st.from_config("encoder", model, encoder, c, frames, cfg, stem=stem, **sizes("encoder")),
        st.from_config("decoder", model, decoder, c, cfg.data.max_length, cfg, cross=frames,
                       cross_hidden=width, embeds=True, text=True, **sizes("decoder")),
    ]  # fmt: skip


def validate(cfg: TrainConfig) -> None:
    if cfg.model.freeze_encoder and cfg.lora.enabled and cfg.lora.apply_to != "decoder":
        raise XtrainError(
            f"model.freeze_encoder with LoRA on the {cfg.lora.apply_to} half would adapt the encoder",
            "with LoRA set lora.apply_to=decoder instead (or lora.enabled=false for a full fine-tune)",
        )


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.data.rows.audio import AudioTextRows, SpeechTextCollator, check_audio_files
    from xtrain.tasks import common, data_check

    cfg = run.cfg
    m = cfg.model
    source = common.media_source(cfg, main_process_first, check_model_type)
    found = common.processor_source(cfg, source)
    feature_extractor, tokenizer, saver = load_processors(found, m.trust_remote_code)
    rate = int(feature_extractor.sampling_rate)
    seconds = max_seconds(cfg.data.max_audio_seconds, feature_extractor)
    cfg = with_metadata(cfg)
    d = cfg.data
    with main_process_first():
        train, eval_ds, train_name, eval_name = common.raw_datasets(cfg)
        train, eval_ds = (file_name_column(ds, d.audio_column) for ds in (train, eval_ds))
        sets = [(train, train_name, "train"), (eval_ds, eval_name, "eval")]
        parts = (feature_extractor, tokenizer, label_start(cfg, source, tokenizer))
        first = data_check.loaded_samples(cfg, sets, media="audio")
        report = speech_check.inspect(cfg, parts, first, [])  # the data check
        train_dir, eval_dir = common.media_dirs(cfg, "audio")
        durations: dict[str, list[float] | None] = {}  # seconds per clip, from the headers checked here
        for role, ds, name, folder in (
            ("train", train, train_name, train_dir),
            ("eval", eval_ds, eval_name, eval_dir),
        ):
            if ds is not None:
                require_columns(ds, d.audio_column, d.text_column, name)
                durations[role] = check_audio_files(ds, d.audio_column, folder, name, seconds, d.long_audio)

    def rows(ds: Dataset, folder: Path | None, name: str, role: str) -> AudioTextRows:
        return AudioTextRows(
            ds, d.audio_column, d.text_column, folder, name, rate, seconds, d.long_audio, durations.get(role)
        )

    train_rows = rows(train, train_dir, train_name, "train")
    eval_rows = rows(eval_ds, eval_dir, eval_name, "eval") if eval_ds is not None else None

    model = common.load_media_model(run, TASK, source)
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
        data_report=report,
    )


def _quickstart_inputs() -> list[str]:
    folder, row = builtin.first_eval_row("builtin:spoken-words")
    return [str(folder / row["audio"])]


TASK = Task(
    name=NAME,
    decodes_media=True,
    about="audio clips and their transcripts (Whisper); metric: WER/CER by generation",
    build=build,
    aliases=("asr",),
    keys=frozenset(
        {
            "model.chunked_loss",
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
    token_loss="decoder",
    model_class="AutoModelForSpeechSeq2Seq",
    lora_plan=lora_plan,
    full_fine_tune=full_fine_tune,
    positions=decoder_positions,
    stacks=stacks,
    # Whisper's prompt: start, language, task, no-timestamps (fewer for other models)
    generation_prompt=lambda cfg: 4,
    resume_keys=("lora.apply_to", "model.freeze_encoder"),
    recognizes=lambda config: speech_seq2seq(config.get("model_type")),
    predicts=Predicts(
        takes="audio files",
        load=speech_predict.load_for_predict,
        run=speech_predict.predict,
        file=FileRows(
            rows="audio paths (+ their transcript)",
            read=speech_predict.read_file,
            answer=speech_predict.answer,
            score=normalized_error_rates,
        ),
    ),
    check_data=speech_check.check_data,
    quickstart=Quickstart(
        job="quickstart-speech-to-text.yaml",
        about="ASR",
        next_command="xtrain train examples/speech-to-text-words.yaml",
        headline=("wer", "WER", "share of words wrong; 0 is perfect"),
        predict_args=_quickstart_inputs,
    ),
)
