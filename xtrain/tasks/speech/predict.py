"""``xtrain predict`` for speech-to-text: audio files, or the audio rows of a ``--data`` file read
as training reads them, transcribed by the trained model (mono, resampled to the model's rate,
cut to its window; greedy or beam search). Library code: returns data, prints nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import tasks
from xtrain.model import load as models
from xtrain.tasks import contract
from xtrain.tasks import predicting as p
from xtrain.tasks.contract import Example, Loaded, PredictRequest
from xtrain.tasks.predicting import generate_texts, load_file, media_examples, read_clips, references
from xtrain.tasks.speech.parts import (
    NAME,
    cap_new_tokens,
    file_name_column,
    fix_special_tokens,
    load_processors,
    max_seconds,
    require_columns,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig


def load_for_predict(
    folder: Path, base: str, record: dict[str, Any]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    from transformers import AutoModelForSpeechSeq2Seq

    feature_extractor, tokenizer, _ = load_processors(str(folder), False)
    base_load = record.get(contract.BASE_LOAD, {})  # a quantized run's base: in 4/8 bits
    model = models.load_pretrained(AutoModelForSpeechSeq2Seq, base, "auto", False, **base_load)
    fix_special_tokens(model, tokenizer)
    return model, tokenizer, {"feature_extractor": feature_extractor}


def answer(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, str]]:
    """Transcripts of a batch of clips (mono, resampled to the model's rate, cut to its window)."""
    fe = loaded.parts["feature_extractor"]
    rate = int(fe.sampling_rate)
    clips = read_clips(examples, rate, max_seconds(None, fe))
    features = fe(clips, sampling_rate=rate, return_tensors="pt")["input_features"]
    new_tokens = cap_new_tokens(loaded.model, request.max_new_tokens)
    return generate_texts(loaded, {"input_features": features}, request, max_new_tokens=new_tokens)


def predict(loaded: Loaded, request: PredictRequest) -> list[dict[str, str]]:
    """Transcripts of audio files."""
    p.refuse_prompts(loaded, tasks.get(NAME), request)
    examples = p.file_examples(p.media_files(request.inputs, p.AUDIO_EXTENSIONS, "audio files"))
    return p.file_rows(examples, p.in_batches(answer, loaded, examples, request))


def read_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """A ``--data`` file read as training reads it (an audiofolder through its metadata file):
    ``data.audio_column`` (every file's header read before the model loads; a clip longer than
    the model's window is cut to it, as ``xtrain predict`` cuts audio files) and, where the file
    has it, ``data.text_column``: the reference, scored as training scores it (normalised WER/CER)."""
    from xtrain.data.rows.audio import audiofolder_metadata, check_audio_files

    d = cfg.data
    meta = audiofolder_metadata(d.eval, "eval")
    if meta is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(d, train=str(meta), eval=str(meta)))
    ds, source, folder = load_file(cfg, "audio")
    ds = file_name_column(ds, d.audio_column)
    if d.audio_column not in ds.column_names:
        require_columns(ds, d.audio_column, d.text_column, source)  # names the missing column
    check_audio_files(ds, d.audio_column, folder, source, None, "cut")
    refs = references(ds, d.text_column, source, "data.text_column")
    return media_examples(ds, d.audio_column, folder, source, refs, "Audio")
