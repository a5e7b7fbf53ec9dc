"""The data check of vision-language (``Task.check_data``, docs/training.md#the-data-check): the
first rows read, checked and rendered by the run's own reader (``vision_rows.rows``: every format,
every image found), their lengths with each image's tokens, and the first training row through the
run's collator, with the processor (never the weights). ``vision_language.build`` runs
``inspect`` on the rows it loaded."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from xtrain.tasks.data_report import DataReport
from xtrain.tasks.vision.processor import NAME, processor_and_render

if TYPE_CHECKING:
    from transformers import ProcessorMixin

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.chat import Render
    from xtrain.tasks.data_check import Sample


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    from xtrain.tasks import data_check

    samples, notes = data_check.first_samples(cfg, limit)
    parts = data_check.loaded_or_note(cfg, notes, lambda: processor_and_render(cfg, contextlib.nullcontext))
    return inspect(cfg, parts, samples, notes)


def inspect(
    cfg: TrainConfig,
    parts: tuple[str, ProcessorMixin, Render] | None,
    samples: list[Sample],
    notes: list[str],
) -> DataReport:
    """Each sample's conversations checked and rendered as the run does (``vision_rows.rows``), their
    lengths with each image's tokens (``vision_chat.expanded_lengths``); the example: the first
    training row through the run's collator, images opened and expanded as the model gets them."""
    from xtrain.data.rows import vision_rows
    from xtrain.data.rows.vision_chat import VisionChatCollator, expanded_lengths
    from xtrain.tasks import data_check

    d = cfg.data
    processor, render = parts[-2:] if parts is not None else (None, None)
    tokenizer = getattr(processor, "tokenizer", None)
    report = DataReport(NAME, d.max_length, notes=notes)
    for s in samples:
        rows = vision_rows.rows(s.ds, cfg, s.name, s.folder, render, tokenizer, with_prompts=False)
        check = s.check(row_format=vision_rows.vision_format(d, list(s.ds.column_names), s.name))
        report.sources.append(check)
        if render is None:
            continue
        check.images = [len(refs) for refs in rows.images]
        check.lengths, counted = expanded_lengths(processor, rows)
        if not counted:
            report.notes.append("token counts without the images' tokens (the processor does not tell them)")
        check.truncated = sum(n > d.max_length for n in check.lengths)
        check.dropped = len(s.ds) - len(rows)  # every answer past data.max_length: left out
        if s.role == "train" and report.example is None:
            batch = VisionChatCollator(processor, d.max_length)([rows[0]])
            ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
            inputs = [data_check.image_line(ref, s.folder) for ref in rows.images[0]]
            report.example = data_check.example_of(s, rows.rows[0], tokenizer, ids, labels, inputs=inputs)
    return report
