"""The contract between tasks (what to train) and the loop (how to train it).

A task builder turns a ``TrainConfig`` into a ``Workload``. The loop never looks inside a
model or a dataset beyond this contract, so ``causal-lm``, ``seq-cls`` and any ``custom``
``module:function`` plug in the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Batch = Mapping[str, "torch.Tensor"]
# eval_batch(model_outputs, batch) -> per-example tensors, each of shape [batch_size].
# It must include "loss_sum" and "count" (eval loss = sum(loss_sum) / sum(count)); any other
# keys are task statistics that ``reduce_metrics`` turns into numbers. The loop gathers these
# with ``accelerator.gather_for_metrics`` (which drops the duplicated samples of the last batch).
EvalBatchFn = Callable[[Any, Batch], dict[str, "torch.Tensor"]]
# reduce_metrics(gathered per-example tensors over the whole eval set) -> {"accuracy": 0.93, ...}
ReduceFn = Callable[[dict[str, "torch.Tensor"]], dict[str, float]]


@dataclass
class Prediction:
    """One sample of a generative eval: what the model should write and what it wrote."""

    reference: str
    prediction: str


# evaluate(accelerator, model, eval_loader) -> (metrics with "eval_loss", sample predictions).
# Replaces the loop's forward-only evaluation (eval_batch/reduce_metrics) when a task evaluates by
# generating (image-to-text: CER/WER); it runs on every rank and must gather in data order.
EvaluateFn = Callable[[Any, Any, Any], tuple[dict[str, float], list[Prediction]]]


@dataclass
class Workload:
    """Everything the loop needs from a task."""

    model: torch.nn.Module  # already wrapped by peft when LoRA is on; its forward returns .loss
    train_dataset: Any  # map-style: len() and [i] -> dict of lists/ints (a datasets.Dataset works)
    collator: Callable[[list[dict[str, Any]]], Batch]  # picklable, top-level (spawned workers)
    eval_dataset: Any | None = None
    eval_batch: EvalBatchFn | None = None
    reduce_metrics: ReduceFn | None = None
    tokenizer: Any | None = None  # saved next to the adapter when present
    chat: bool = False  # trained on chat conversations (causal-lm ``messages``): predict renders them
    # more of what the task's predict needs, saved in the run's record (e.g. a classifier's labels)
    record: dict[str, Any] = field(default_factory=dict)
    main_metric: str | None = None  # e.g. "accuracy": shown in banners and closing tables
    # batch key whose sum counts tokens (tokens/s); a padding-free packed batch (no such key,
    # position_ids restarting per example) counts every input id (collate.batch_tokens)
    tokens_key: str | None = "attention_mask"
    evaluate: EvaluateFn | None = None  # evaluation by generation (xtrain.train.generation)
    # One length per training sample, for data.group_by_length (speech-to-text: audio seconds from
    # the file headers). None: the token count of an ``input_ids`` column (xtrain.train.sampler).
    train_lengths: Callable[[], Sequence[float]] | None = None
    # the task's data check on the first rows it loaded (``tasks.data_check.DataReport``): its
    # summary is a line of the run's banner
    data_report: Any | None = None
