"""``seq-cls``: text (+ optional text pair) and a label (integers, or names mapped in sorted
order); the classifier head is trained whole next to the LoRA adapters; metric: accuracy."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from xtrain.data.labels import head_labels, labels_of
from xtrain.tasks.contract import MainProcessFirst, Quickstart, Task
from xtrain.tasks.data_report import DataReport

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.planning.run import Run
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.data_check import LabelMapping, Sample

NAME = "seq-cls"
HEAD = "ForSequenceClassification"  # the architectures of a checkpoint whose head is trained


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.data import collate
    from xtrain.data.tokenize import require_columns, tokenize_seq_cls
    from xtrain.tasks import data_check
    from xtrain.tasks.common import (
        load_seeded,
        prepare_tokenizer,
        raw_datasets,
        require_nonempty,
        text_workload,
        tokenizing,
    )

    cfg = run.cfg
    d = cfg.data
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    columns = {
        "data.text_column": d.text_column,
        "data.text_pair_column": d.text_pair_column,
        "data.label_column": d.label_column,
    }
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        require_columns(train, columns, train_name)
        if eval_ds is not None:
            require_columns(eval_ds, columns, eval_name)
        sources = (train_name, eval_name)
        found = labels_of(train, eval_ds, d.label_column, cfg.model.num_labels, sources)
        mapping, num_labels, id2label = found
        first = data_check.loaded_samples(cfg, [(train, train_name, "train"), (eval_ds, eval_name, "eval")])
        report = inspect(cfg, tokenizer, first, [], found)  # the data check, on its first rows
        kwargs = {
            "tokenizer": tokenizer,
            "text_column": d.text_column,
            "text_pair_column": d.text_pair_column,
            "label_column": d.label_column,
            "label_to_id": mapping,
            "max_length": d.max_length,
        }
        tokenize = tokenizing(NAME, tokenize_seq_cls, kwargs, cfg.data.encode_processes)
        train = tokenize(train, "train")
        require_nonempty(train, train_name, "training")
        if eval_ds is not None:
            eval_ds = tokenize(eval_ds, "eval")

    model = load_seeded(run, TASK, source, **head_labels(num_labels, id2label))
    # Decoder models classify from the last non-pad token: they must know the pad id.
    model.config.pad_token_id = tokenizer.pad_token_id
    evaluation = (collate.seq_cls_eval_batch, collate.seq_cls_reduce, "accuracy")
    workload = text_workload(model, run, TASK, tokenizer, (train, eval_ds), evaluation)
    workload.data_report = report
    return workload


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    from xtrain.tasks import data_check

    found, samples, notes = data_check.text_check(cfg, limit)
    return inspect(cfg, found[1] if found is not None else None, samples, notes)


def inspect(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    samples: list[Sample],
    notes: list[str],
    found: LabelMapping | None = None,
) -> DataReport:
    """The columns and labels of each sample (``found``: the run's label mapping), tokenised as
    the run tokenises them (``tokenize_seq_cls``); the example: the first training row."""
    from xtrain.data.tokenize import require_columns, tokenize_seq_cls
    from xtrain.tasks import data_check

    d = cfg.data
    columns = {
        "data.text_column": d.text_column,
        "data.text_pair_column": d.text_pair_column,
        "data.label_column": d.label_column,
    }
    for s in samples:
        require_columns(s.ds, columns, s.name)
    classes = data_check.classes(cfg, samples, d.label_column, HEAD, new_head=False, found=found)
    report = DataReport(NAME, d.max_length, notes=notes + classes.notes)
    columns, to_id = (d.text_column, d.text_pair_column, d.label_column), classes.to_id()

    def tokenize(rows: dict[str, list[Any]], max_length: int) -> list[list[int]]:
        return tokenize_seq_cls(rows, tokenizer, *columns, to_id, max_length)["input_ids"]

    for s in samples:
        check = s.check(labels=data_check.label_counts(s.ds, d.label_column))
        report.sources.append(check)
        if tokenizer is None:
            continue
        check.lengths = [len(ids) for ids in tokenize(s.ds[:], data_check.NO_CUT)]
        check.truncated = sum(n > d.max_length for n in check.lengths)
        if s.role == "train" and report.example is None:
            row = s.ds[0:1]
            ids, label = tokenize(row, d.max_length)[0], classes.text(row[d.label_column][0])
            report.example = data_check.example_of(s, 0, tokenizer, ids, None, label=label)
    return report


def _is_classifier(config: dict[str, Any]) -> bool:
    heads = [str(a) for a in config.get("architectures") or []]
    return config.get("task_type") == "SEQ_CLS" or any(a.endswith(HEAD) for a in heads)


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
    check_data=check_data,
    quickstart=Quickstart(
        job="quickstart.yaml", about="text classification", next_command="xtrain train examples/seq-cls.yaml"
    ),
)
