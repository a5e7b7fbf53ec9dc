"""Tasks: turn a ``TrainConfig`` into a ``Workload`` (model, datasets, collator, metrics).

- ``causal-lm``: a text column, or prompt/response columns with the loss on the response only;
  optional packing; metric: next-token accuracy (and perplexity).
- ``seq-cls``: text (+ optional text pair) and a label (integers, or names mapped in sorted
  order); the classifier head is trained whole next to the LoRA adapters; metric: accuracy.
- ``image-to-text``: images and their text for a vision encoder-decoder (TrOCR, ViT-GPT2); metric:
  CER/WER by generation (``image_to_text.py``).
- ``speech-to-text``: audio clips and their transcripts for a speech encoder-decoder (Whisper);
  metric: WER/CER by generation (``speech_to_text.py``).
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
import inspect
from collections.abc import Callable
from typing import Any

from xtrain.errors import XtrainError
from xtrain.train import collate, data, lora, models
from xtrain.train.config import TASKS, TrainConfig
from xtrain.train.workload import Workload

MainProcessFirst = Callable[[], contextlib.AbstractContextManager]


def build_workload(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    """The Workload of ``cfg.model.task``."""
    task = cfg.model.task
    if task == "custom":
        return build_custom(cfg, main_process_first)
    if task not in BUILDERS:
        close = difflib.get_close_matches(task, TASKS, n=1)
        raise XtrainError(
            f"unknown task '{task}' (tasks: {', '.join(TASKS)})",
            f"did you mean '{close[0]}'?" if close else None,
        )
    return BUILDERS[task](cfg, main_process_first)


# ---------------------------------------------------------------------------------------------
# Shared steps


def _prepare_tokenizer(cfg: TrainConfig, main_process_first: MainProcessFirst) -> tuple[str, Any]:
    with main_process_first():  # a built-in model is written once, by the first process
        source = models.resolve_model(cfg.model.name_or_path)
    return source, models.load_tokenizer(source, cfg.model.trust_remote_code)


def _raw_datasets(cfg: TrainConfig) -> tuple[Any, Any | None, str, str]:
    """(train, eval or None, train source name, eval source name) as loaded, before tokenising."""
    d = cfg.data
    if not d.train:
        raise XtrainError(
            "data.train is not set", "set data.train to a file, a folder, a hub id or builtin:NAME"
        )
    train = data.load_source(d.train, d.format, role="train", key="data.train")
    eval_ds, eval_name = None, d.eval or ""
    if d.eval:
        eval_ds = data.load_source(d.eval, d.format, role="eval", key="data.eval")
    elif d.eval_fraction > 0:
        if len(train) < 2:
            raise XtrainError(f"{d.train} has {len(train)} rows: too few to split off an eval set")
        split = train.train_test_split(test_size=d.eval_fraction, seed=cfg.run.seed, shuffle=True)
        train, eval_ds = split["train"], split["test"]
        eval_name = f"{d.train} (eval_fraction {d.eval_fraction})"
    if len(train) == 0:
        raise XtrainError(f"{d.train} has no rows")
    return train, eval_ds, d.train, eval_name


def _collator(tokenizer: Any) -> collate.PadCollator:
    import torch

    # Lengths in multiples of 8 suit GPU tensor cores; on CPU they only add padding.
    return collate.PadCollator(tokenizer.pad_token_id, 8 if torch.cuda.is_available() else None)


def _finish_model(model: Any, cfg: TrainConfig, task: str) -> Any:
    # a longer sequence than the model has positions fails inside the first forward pass
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and 0 < limit < cfg.data.max_length:
        raise XtrainError(
            f"data.max_length={cfg.data.max_length} is above the model's limit of {limit} positions",
            f"set data.max_length={limit} or less",
        )
    if cfg.model.gradient_checkpointing:
        lora.enable_gradient_checkpointing(model, cfg.lora.enabled)
    if cfg.lora.enabled:
        return lora.apply_lora(model, cfg.lora, task)
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _nonempty(ds: Any, name: str, what: str) -> None:
    if len(ds) == 0:
        raise XtrainError(
            f"no {what} examples left in {name} after tokenising", "check the columns and data.max_length"
        )


# ---------------------------------------------------------------------------------------------
# causal-lm


def build_causal_lm(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    d = cfg.data
    source, tokenizer = _prepare_tokenizer(cfg, main_process_first)
    if d.prompt_column is not None:
        columns = {"data.prompt_column": d.prompt_column, "data.response_column": d.response_column}
    else:
        columns = {"data.text_column": d.text_column}
    kwargs = {
        "tokenizer": tokenizer,
        "text_column": d.text_column,
        "prompt_column": d.prompt_column,
        "response_column": d.response_column,
        "max_length": d.max_length,
        "packing": d.packing,
    }
    settings = [
        "causal-lm",
        data.tokenizer_fingerprint(tokenizer),
        {k: v for k, v in kwargs.items() if k != "tokenizer"},
    ]
    with main_process_first():
        train, eval_ds, train_name, eval_name = _raw_datasets(cfg)
        data.require_columns(train, columns, train_name)
        train = data.tokenized(
            train, data.tokenize_causal_lm, kwargs, data.map_fingerprint(train, *settings), "tokenizing train"
        )
        _nonempty(train, train_name, "training")
        if eval_ds is not None:
            data.require_columns(eval_ds, columns, eval_name)
            eval_ds = data.tokenized(
                eval_ds,
                data.tokenize_causal_lm,
                kwargs,
                data.map_fingerprint(eval_ds, *settings),
                "tokenizing eval",
            )
            _nonempty(eval_ds, eval_name, "eval")

    from transformers import set_seed

    set_seed(cfg.run.seed)
    model = models.load_model(source, "causal-lm", cfg.model.dtype, cfg.model.trust_remote_code)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model = _finish_model(model, cfg, "causal-lm")
    return Workload(
        model=model,
        train_dataset=train,
        collator=_collator(tokenizer),
        eval_dataset=eval_ds,
        eval_batch=collate.causal_lm_eval_batch,
        reduce_metrics=collate.causal_lm_reduce,
        tokenizer=tokenizer,
        main_metric="token_accuracy",
    )


# ---------------------------------------------------------------------------------------------
# seq-cls


def build_seq_cls(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    d = cfg.data
    source, tokenizer = _prepare_tokenizer(cfg, main_process_first)
    columns = {
        "data.text_column": d.text_column,
        "data.text_pair_column": d.text_pair_column,
        "data.label_column": d.label_column,
    }
    with main_process_first():
        train, eval_ds, train_name, eval_name = _raw_datasets(cfg)
        data.require_columns(train, columns, train_name)
        if eval_ds is not None:
            data.require_columns(eval_ds, columns, eval_name)
        feature = train.features.get(d.label_column)
        mapping, num_labels, id2label = data.label_mapping(
            train.unique(d.label_column),
            eval_ds.unique(d.label_column) if eval_ds is not None else [],
            cfg.model.num_labels,
            (train_name, eval_name),
            class_names=list(feature.names) if hasattr(feature, "names") else None,  # a ClassLabel column
        )
        kwargs = {
            "tokenizer": tokenizer,
            "text_column": d.text_column,
            "text_pair_column": d.text_pair_column,
            "label_column": d.label_column,
            "label_to_id": mapping,
            "max_length": d.max_length,
        }
        settings = [
            "seq-cls",
            data.tokenizer_fingerprint(tokenizer),
            {k: v for k, v in kwargs.items() if k != "tokenizer"},
        ]
        train = data.tokenized(
            train, data.tokenize_seq_cls, kwargs, data.map_fingerprint(train, *settings), "tokenizing train"
        )
        _nonempty(train, train_name, "training")
        if eval_ds is not None:
            eval_ds = data.tokenized(
                eval_ds,
                data.tokenize_seq_cls,
                kwargs,
                data.map_fingerprint(eval_ds, *settings),
                "tokenizing eval",
            )

    from transformers import set_seed

    extra: dict[str, Any] = {"num_labels": num_labels}
    if id2label is not None:
        extra["id2label"] = id2label
        extra["label2id"] = {name: i for i, name in id2label.items()}
    set_seed(cfg.run.seed)
    model = models.load_model(source, "seq-cls", cfg.model.dtype, cfg.model.trust_remote_code, **extra)
    # Decoder models classify from the last non-pad token: they must know the pad id.
    model.config.pad_token_id = tokenizer.pad_token_id
    model = _finish_model(model, cfg, "seq-cls")
    return Workload(
        model=model,
        train_dataset=train,
        collator=_collator(tokenizer),
        eval_dataset=eval_ds,
        eval_batch=collate.seq_cls_eval_batch,
        reduce_metrics=collate.seq_cls_reduce,
        tokenizer=tokenizer,
        main_metric="accuracy",
    )


# ---------------------------------------------------------------------------------------------
# custom


def load_custom(spec: str) -> Callable[..., Any]:
    """The function named by ``module:function`` (the module must be importable)."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise XtrainError(f"model.custom must look like module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise XtrainError(
            f"cannot import the custom task module '{module_name}': {e}",
            "run from the folder that holds it, or add that folder to PYTHONPATH",
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise XtrainError(f"module '{module_name}' has no function '{function_name}' (model.custom={spec})")
    return function


def build_custom(cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    """Calls ``function(cfg)`` (and passes ``main_process_first=`` when the function takes it)."""
    if not cfg.model.custom:
        raise XtrainError(
            "model.task is custom but model.custom is not set", "set model.custom=module:function"
        )
    function = load_custom(cfg.model.custom)
    try:
        takes_mpf = "main_process_first" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        takes_mpf = False
    from transformers import set_seed

    set_seed(cfg.run.seed)  # the custom builder starts from the same RNG state in every process
    workload = function(cfg, main_process_first=main_process_first) if takes_mpf else function(cfg)
    if not isinstance(workload, Workload):
        raise XtrainError(
            f"{cfg.model.custom} returned {type(workload).__name__}, not an xtrain Workload",
            "return xtrain.train.workload.Workload(model=..., train_dataset=..., collator=...)",
        )
    return workload


def build_image_to_text(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    from xtrain.train.image_to_text import build_image_to_text as build

    return build(cfg, main_process_first)


def build_speech_to_text(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    from xtrain.train.speech_to_text import build_speech_to_text as build

    return build(cfg, main_process_first)


BUILDERS: dict[str, Callable[[TrainConfig, MainProcessFirst], Workload]] = {
    "causal-lm": build_causal_lm,
    "seq-cls": build_seq_cls,
    "image-to-text": build_image_to_text,
    "speech-to-text": build_speech_to_text,
}
