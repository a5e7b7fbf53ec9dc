"""``seq-cls``: text (+ optional text pair) and a label (integers, or names mapped in sorted
order); the classifier head is trained whole next to the LoRA adapters; metric: accuracy."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from xtrain.train.tasks.contract import MainProcessFirst, Quickstart, Task

if TYPE_CHECKING:
    from xtrain.train.config.schema import TrainConfig
    from xtrain.train.workload import Workload

NAME = "seq-cls"


def build(cfg: TrainConfig, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.train import collate, data
    from xtrain.train.tasks.common import (
        load_seeded,
        prepare_tokenizer,
        raw_datasets,
        require_nonempty,
        text_workload,
        tokenizing,
    )

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
        sources = (train_name, eval_name)
        mapping, num_labels, id2label = data.labels_of(
            train, eval_ds, d.label_column, cfg.model.num_labels, sources
        )
        kwargs = {
            "tokenizer": tokenizer,
            "text_column": d.text_column,
            "text_pair_column": d.text_pair_column,
            "label_column": d.label_column,
            "label_to_id": mapping,
            "max_length": d.max_length,
        }
        tokenize = tokenizing(NAME, data.tokenize_seq_cls, kwargs)
        train = tokenize(train, "train")
        require_nonempty(train, train_name, "training")
        if eval_ds is not None:
            eval_ds = tokenize(eval_ds, "eval")

    model = load_seeded(cfg, TASK, source, **data.head_labels(num_labels, id2label))
    # Decoder models classify from the last non-pad token: they must know the pad id.
    model.config.pad_token_id = tokenizer.pad_token_id
    evaluation = (collate.seq_cls_eval_batch, collate.seq_cls_reduce, "accuracy")
    return text_workload(model, cfg, TASK, tokenizer, (train, eval_ds), evaluation)


def _is_classifier(config: dict[str, Any]) -> bool:
    heads = [str(a) for a in config.get("architectures") or []]
    return config.get("task_type") == "SEQ_CLS" or any(a.endswith("ForSequenceClassification") for a in heads)


TASK = Task(
    name=NAME,
    about="text (+ a text pair) and a label; the classifier head trained whole; metric: accuracy",
    build=build,
    keys=frozenset(
        {
            "model.quantization",
            "model.num_labels",
            "data.text_column",
            "data.text_pair_column",
            "data.label_column",
            "data.group_by_length",
        }
    ),
    model_class="AutoModelForSequenceClassification",
    peft_task_type="SEQ_CLS",
    resume_keys=("model.num_labels",),
    recognizes=_is_classifier,
    quickstart=Quickstart(
        job="quickstart.yaml", about="text classification", next_command="xtrain train examples/seq-cls.yaml"
    ),
)
