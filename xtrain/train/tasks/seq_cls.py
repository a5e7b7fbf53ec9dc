"""``seq-cls``: text (+ optional text pair) and a label (integers, or names mapped in sorted
order); the classifier head is trained whole next to the LoRA adapters; metric: accuracy."""

from __future__ import annotations

import contextlib
from typing import Any

from xtrain.train import data, models
from xtrain.train.config.schema import TrainConfig
from xtrain.train.tasks.common import (
    MainProcessFirst,
    prepare_tokenizer,
    raw_datasets,
    require_nonempty,
    text_workload,
    tokenizing,
)
from xtrain.train.workload import Workload


def build_seq_cls(
    cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext
) -> Workload:
    d = cfg.data
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    columns = {
        "data.text_column": d.text_column,
        "data.text_pair_column": d.text_pair_column,
        "data.label_column": d.label_column,
    }
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
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
        tokenize = tokenizing("seq-cls", data.tokenize_seq_cls, kwargs)
        train = tokenize(train, "train")
        require_nonempty(train, train_name, "training")
        if eval_ds is not None:
            eval_ds = tokenize(eval_ds, "eval")

    from transformers import set_seed

    extra: dict[str, Any] = {"num_labels": num_labels}
    if id2label is not None:
        extra["id2label"] = id2label
        extra["label2id"] = {name: i for i, name in id2label.items()}
    set_seed(cfg.run.seed)
    model = models.load_model(source, "seq-cls", cfg.model.dtype, cfg.model.trust_remote_code, **extra)
    # Decoder models classify from the last non-pad token: they must know the pad id.
    model.config.pad_token_id = tokenizer.pad_token_id
    return text_workload(model, cfg, "seq-cls", tokenizer, (train, eval_ds))
