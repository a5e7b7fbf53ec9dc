"""The data check of speech-to-text (``Task.check_data``, docs/training.md#the-data-check): the
first rows' columns and audio headers as the run checks them, their transcripts labelled as the
run's collator labels them, with the feature extractor and tokenizer (never the weights).
``speech_to_text.build`` runs ``inspect`` on the rows it loaded."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from xtrain.data.sources import undecoded_row
from xtrain.tasks.data_report import DataReport
from xtrain.tasks.speech import parts as speech
from xtrain.tasks.speech.parts import NAME, file_name_column, max_seconds, require_columns

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor

    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.data_check import Sample

    # (feature extractor, tokenizer, the first label token) of the run's checkpoint
    SpeechParts = tuple[SequenceFeatureExtractor, PreTrainedTokenizerBase, int]


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    from xtrain.tasks import common, data_check

    def parts() -> SpeechParts:
        source = common.media_source(cfg, contextlib.nullcontext, speech.check_model_type)
        feature_extractor, tokenizer, _ = speech.load_processors(source, cfg.model.trust_remote_code)
        return feature_extractor, tokenizer, speech.label_start(cfg, source, tokenizer)

    cfg = speech.with_metadata(cfg)
    samples, notes = data_check.first_samples(cfg, limit, media="audio")
    return inspect(cfg, data_check.loaded_or_note(cfg, notes, parts), samples, notes)


def inspect(
    cfg: TrainConfig, parts: SpeechParts | None, samples: list[Sample], notes: list[str]
) -> DataReport:
    """Columns and audio headers as the run checks them (``check_audio_files``), the transcripts
    as the run's collator labels them (``SpeechTextCollator.labels``: the prefix, every token
    trained); the example: the first training row."""
    from xtrain.data.rows.audio import SpeechTextCollator, check_audio_files, clip_seconds
    from xtrain.data.rows.images import describe
    from xtrain.tasks import data_check

    d = cfg.data
    feature_extractor, tokenizer, start = parts if parts is not None else (None, None, None)
    seconds = max_seconds(d.max_audio_seconds, feature_extractor) if parts else d.max_audio_seconds
    report = DataReport(NAME, d.max_length, notes=notes)
    for s in samples:
        ds = file_name_column(s.ds, d.audio_column)
        require_columns(ds, d.audio_column, d.text_column, s.name)
        durations = check_audio_files(ds, d.audio_column, s.folder, s.name, seconds, d.long_audio)
        cells = [undecoded_row(ds, i, d.audio_column)[d.audio_column] for i in range(len(ds))]
        check = s.check(seconds=durations or [clip_seconds(c, s.folder) for c in cells])
        report.sources.append(check)
        if tokenizer is None:
            continue
        texts = ["" if t is None else str(t) for t in ds[d.text_column]]
        whole = SpeechTextCollator(feature_extractor, tokenizer, data_check.NO_CUT, start).labels(texts)
        check.lengths = [len(ids) for ids in whole]
        check.truncated = sum(n > d.max_length for n in check.lengths)
        if s.role == "train" and report.example is None:
            collator = SpeechTextCollator(feature_extractor, tokenizer, d.max_length, start)
            labels = collator.labels(texts[:1])[0]
            audio = f"audio {describe(cells[0], s.folder, 'audio')} ({check.seconds[0]:.1f} s)"
            report.example = data_check.example_of(s, 0, tokenizer, labels, labels, inputs=[audio])
            report.example.note = "the decoder writes these tokens (all trained) after its start token"
    return report
