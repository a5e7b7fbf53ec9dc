"""``causal-lm``: a text column, or prompt/response columns with the loss on the response only,
or chat conversations (``data.messages_column``, rendered by the chat template, loss on the
assistant turns only: ``chat_data``); optional packing; metric: next-token accuracy (and perplexity)."""

from __future__ import annotations

import contextlib
from typing import Any

from xtrain.errors import XtrainError
from xtrain.train import data, models
from xtrain.train.config.schema import TrainConfig
from xtrain.train.tasks import chat_data
from xtrain.train.tasks.common import (
    MainProcessFirst,
    prepare_tokenizer,
    raw_datasets,
    require_nonempty,
    text_workload,
    tokenizing,
)
from xtrain.train.workload import Workload


def is_chat(cfg: TrainConfig, train: Any) -> bool:
    """Chat data: the messages column is there, and neither a text column nor prompt/response."""
    d = cfg.data
    names = train.column_names
    return d.prompt_column is None and d.messages_column in names and d.text_column not in names


def chat_rows(
    cfg: TrainConfig, tokenizer: Any, source: str, train: tuple[Any, str], eval_: tuple[Any, str]
) -> tuple[list[dict[str, list[int]]], list[dict[str, list[int]]] | None]:
    """Conversations -> input_ids/attention_mask/labels (assistant turns only), checked row by row."""
    d = cfg.data
    if d.packing:
        raise XtrainError("data.packing is for plain text, not chat conversations", "set data.packing=false")
    template = chat_data.require_template(tokenizer, chat_data.load_template(d.chat_template), source)
    if d.chat_template is not None:
        tokenizer.chat_template = template  # saved with the adapter: predict renders the same way
    render = chat_data.renderer(tokenizer, template)
    out: list[list[dict[str, list[int]]] | None] = []
    for ds, name in (train, eval_):
        if ds is None:
            out.append(None)
            continue
        rows = chat_data.text_chat_rows(ds, d.messages_column, render, tokenizer, d.max_length, name)
        require_nonempty(rows, name, "training" if ds is train[0] else "eval")
        out.append(rows)
    assert out[0] is not None
    return out[0], out[1]


def build_causal_lm(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    d = cfg.data
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
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
    tokenize = tokenizing("causal-lm", data.tokenize_causal_lm, kwargs)
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        chat = is_chat(cfg, train)
        if not chat:
            data.require_columns(train, columns, train_name)
            train = tokenize(train, "train")
            require_nonempty(train, train_name, "training")
            if eval_ds is not None:
                data.require_columns(eval_ds, columns, eval_name)
                eval_ds = tokenize(eval_ds, "eval")
                require_nonempty(eval_ds, eval_name, "eval")
    if chat:  # rendered in every process: no datasets cache to share (fast: no model involved)
        train, eval_ds = chat_rows(cfg, tokenizer, source, (train, train_name), (eval_ds, eval_name))

    from transformers import set_seed

    set_seed(cfg.run.seed)
    model = models.load_model(source, "causal-lm", cfg.model.dtype, cfg.model.trust_remote_code)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    workload = text_workload(model, cfg, "causal-lm", tokenizer, (train, eval_ds))
    workload.chat = chat
    return workload
