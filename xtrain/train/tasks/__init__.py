"""Tasks: turn a ``TrainConfig`` into a ``Workload`` (model, datasets, collator, metrics).

- ``causal-lm``: a text column, or prompt/response columns with the loss on the response only;
  optional packing; metric: next-token accuracy (and perplexity).
- ``seq-cls``: text (+ optional text pair) and a label (integers, or names mapped in sorted
  order); the classifier head is trained whole next to the LoRA adapters; metric: accuracy.
- ``image-to-text``: images and their text for a vision encoder-decoder (TrOCR, ViT-GPT2); metric:
  CER/WER by generation (``image_to_text.py``).
- ``speech-to-text``: audio clips and their transcripts for a speech encoder-decoder (Whisper);
  metric: WER/CER by generation (``speech_to_text.py``).
- ``vision-language``: image + text conversations (``messages``) for a decoder-only VLM (Qwen2-VL);
  loss on the assistant turns only; metric: exact match of generated answers (``vision_language.py``).
- ``custom``: ``model.custom: module:function``, called with the config, returns a Workload.

Order matters for reproducibility: data first (inside ``main_process_first`` so one process
fills the ``datasets`` cache and the others read it), then ``set_seed(run.seed)`` right before
the model and the adapter are created, so every process and every launch mode starts from the
same weights.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
from collections.abc import Callable

from xtrain.errors import XtrainError
from xtrain.train.config.schema import TASKS, TrainConfig
from xtrain.train.tasks.common import MainProcessFirst
from xtrain.train.workload import Workload

# task -> "module:function" under xtrain.train.tasks; imported on use, so a text run never
# imports the image or audio stack
BUILDERS: dict[str, str] = {
    "causal-lm": "causal_lm:build_causal_lm",
    "seq-cls": "seq_cls:build_seq_cls",
    "image-to-text": "image_to_text:build_image_to_text",
    "speech-to-text": "speech_to_text:build_speech_to_text",
    "vision-language": "vision_language:build_vision_language",
    "custom": "custom:build_custom",
}


def builder(task: str) -> Callable[[TrainConfig, MainProcessFirst], Workload]:
    """The builder function of ``task`` (one line naming the tasks when it is unknown)."""
    if task not in BUILDERS:
        close = difflib.get_close_matches(task, TASKS, n=1)
        raise XtrainError(
            f"unknown task '{task}' (tasks: {', '.join(TASKS)})",
            f"did you mean '{close[0]}'?" if close else None,
        )
    module, _, function = BUILDERS[task].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def build_workload(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    """The Workload of ``cfg.model.task``."""
    return builder(cfg.model.task)(cfg, main_process_first)
