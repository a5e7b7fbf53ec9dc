"""Steps every built-in task shares: tokenizer and raw data loading, the pad collator, the
model's finishing touches (position limit, gradient checkpointing, LoRA)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from xtrain.errors import XtrainError
from xtrain.train import collate, data, lora, models
from xtrain.train.config.schema import TrainConfig

MainProcessFirst = Callable[[], contextlib.AbstractContextManager]


def prepare_tokenizer(cfg: TrainConfig, main_process_first: MainProcessFirst) -> tuple[str, Any]:
    with main_process_first():  # a built-in model is written once, by the first process
        source = models.resolve_model(cfg.model.name_or_path)
    return source, models.load_tokenizer(source, cfg.model.trust_remote_code)


def raw_datasets(cfg: TrainConfig) -> tuple[Any, Any | None, str, str]:
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


def pad_collator(tokenizer: Any) -> collate.PadCollator:
    import torch

    # Lengths in multiples of 8 suit GPU tensor cores; on CPU they only add padding.
    return collate.PadCollator(tokenizer.pad_token_id, 8 if torch.cuda.is_available() else None)


def finish_model(model: Any, cfg: TrainConfig, task: str) -> Any:
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


def require_nonempty(ds: Any, name: str, what: str) -> None:
    if len(ds) == 0:
        raise XtrainError(
            f"no {what} examples left in {name} after tokenising", "check the columns and data.max_length"
        )
