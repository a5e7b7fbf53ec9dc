"""``causal-lm``: a text column, or prompt/response columns with the loss on the response only;
optional packing; metric: next-token accuracy (and perplexity)."""

from __future__ import annotations

import contextlib

from xtrain.train import collate, data, models
from xtrain.train.config import TrainConfig
from xtrain.train.tasks.common import (
    MainProcessFirst,
    finish_model,
    pad_collator,
    prepare_tokenizer,
    raw_datasets,
    require_nonempty,
)
from xtrain.train.workload import Workload


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
    settings = [
        "causal-lm",
        data.tokenizer_fingerprint(tokenizer),
        {k: v for k, v in kwargs.items() if k != "tokenizer"},
    ]
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        data.require_columns(train, columns, train_name)
        train = data.tokenized(
            train, data.tokenize_causal_lm, kwargs, data.map_fingerprint(train, *settings), "tokenizing train"
        )
        require_nonempty(train, train_name, "training")
        if eval_ds is not None:
            data.require_columns(eval_ds, columns, eval_name)
            eval_ds = data.tokenized(
                eval_ds,
                data.tokenize_causal_lm,
                kwargs,
                data.map_fingerprint(eval_ds, *settings),
                "tokenizing eval",
            )
            require_nonempty(eval_ds, eval_name, "eval")

    from transformers import set_seed

    set_seed(cfg.run.seed)
    model = models.load_model(source, "causal-lm", cfg.model.dtype, cfg.model.trust_remote_code)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model = finish_model(model, cfg, "causal-lm")
    return Workload(
        model=model,
        train_dataset=train,
        collator=pad_collator(tokenizer),
        eval_dataset=eval_ds,
        eval_batch=collate.causal_lm_eval_batch,
        reduce_metrics=collate.causal_lm_reduce,
        tokenizer=tokenizer,
        main_metric="token_accuracy",
    )
