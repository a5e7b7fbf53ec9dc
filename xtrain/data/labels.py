"""A classifier's labels: the label column's values as names and ids (``label_mapping``), checked
against the eval set and the model's head (``head_labels``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset


def label_key(value: Any) -> str:
    """The mapping key of a label value: ``True`` and ``"True"`` are the same label."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def value_kind(value: Any) -> str:
    return (
        "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__
    )


def label_mapping(
    train_labels: list[Any],
    eval_labels: list[Any],
    num_labels: int | None,
    sources: tuple[str, str],
    class_names: list[str] | None = None,
) -> tuple[dict[str, int] | None, int, dict[int, str] | None]:
    """(label -> id or None for integer labels, num_labels, id -> name or None).

    Integer labels are used as they are (0..n-1), named by ``class_names`` when the column is a
    ``datasets.ClassLabel``; anything else (strings, booleans) is mapped by sorted order, which
    is stable across runs and processes.
    """
    if class_names:
        if num_labels is not None and num_labels != len(class_names):  # the saved head would disagree
            raise XtrainError(
                f"the label column names {len(class_names)} classes but model.num_labels={num_labels}",
                f"set model.num_labels={len(class_names)} or leave it unset",
            )
        num_labels = len(class_names)
    values = list(train_labels) + list(eval_labels)
    if any(v is None for v in values):
        where = sources[0] if any(v is None for v in train_labels) else sources[1]
        raise XtrainError(f"the label column of {where} has empty values", "fill or drop those rows")
    first: dict[str, Any] = {}
    for v in values:
        first.setdefault(value_kind(v), v)
    if len(first) > 1:  # e.g. 1 and "pos" in one JSON column: silently two string classes otherwise
        raise XtrainError(
            f"the label column mixes types ({', '.join(f'{k} {v!r}' for k, v in sorted(first.items()))})",
            "use one type for every label: all integers 0..n-1 or all strings",
        )
    ints = all(
        (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
        for v in values
    )
    if ints:
        ids = sorted({int(v) for v in values})
        if ids and ids[0] < 0:
            raise XtrainError(f"integer labels must be >= 0, found {ids[0]}", "use 0..num_labels-1")
        n = num_labels or (ids[-1] + 1 if ids else 0)
        if ids and ids[-1] >= n:
            raise XtrainError(
                f"label {ids[-1]} does not fit model.num_labels={n}",
                f"set model.num_labels={ids[-1] + 1} or leave it unset to infer it",
            )
        if n < 2:
            raise XtrainError(
                f"classification needs at least 2 classes, the data has {n}", "check data.label_column"
            )
        return None, n, dict(enumerate(class_names)) if class_names else None
    if any(isinstance(v, float) for v in values):
        raise XtrainError(
            "labels must be integers or strings, found fractional numbers",
            "this task is classification; regression needs a custom task",
        )
    names = sorted({label_key(v) for v in train_labels})
    unseen = sorted({label_key(v) for v in eval_labels} - set(names))
    if unseen:
        raise XtrainError(
            f"label '{unseen[0]}' of {sources[1]} is not among the training labels ({', '.join(names)})",
            "train and eval data must use the same label names",
        )
    if len(names) < 2:
        raise XtrainError(
            f"classification needs at least 2 classes, the data has {len(names)}", "check data.label_column"
        )
    n = num_labels or len(names)
    if n != len(names):  # fewer: labels without a class; more: a head with classes no name maps to
        raise XtrainError(
            f"the data has {len(names)} labels but model.num_labels={n}",
            f"set model.num_labels={len(names)} or leave it unset",
        )
    mapping = {name: i for i, name in enumerate(names)}
    return mapping, n, {i: name for name, i in mapping.items()}


def labels_of(
    train: Dataset, eval_ds: Dataset | None, column: str, num_labels: int | None, sources: tuple[str, str]
) -> tuple[dict[str, int] | None, int, dict[int, str] | None]:
    """``label_mapping`` of a label column of the train (and eval) set; a ``datasets.ClassLabel``
    column names its integer classes (the classification tasks)."""
    feature = train.features.get(column)
    return label_mapping(
        label_values(train, column, sources[0]),
        label_values(eval_ds, column, sources[1]) if eval_ds is not None else [],
        num_labels,
        sources,
        class_names=list(feature.names) if hasattr(feature, "names") else None,
    )


def label_values(ds: Dataset, column: str, source: str) -> list[Any]:
    """The distinct labels of a column. A JSON column that mixes numbers and names is typed Json
    by datasets (arrow has no ``unique`` for it): read row by row, lists and objects refused."""
    feature = ds.features.get(column)
    if getattr(feature, "dtype", None) is not None or hasattr(feature, "names"):
        return ds.unique(column)
    if isinstance(feature, dict):  # a struct (JSON objects): its rows may not even convert to Python
        raise XtrainError(
            f"the label column of {source} holds objects, not labels",
            "use one integer (0..n-1) or one name per row",
        )
    seen: dict[tuple[str, str], Any] = {}
    for i, value in enumerate(ds[column]):
        if isinstance(value, (list, dict)):
            raise XtrainError(
                f"the label column of {source} holds a {value_kind(value)} in row {i}, not a label",
                "use one integer (0..n-1) or one name per row",
            )
        seen.setdefault((value_kind(value), label_key(value)), value)
    return list(seen.values())


def head_labels(num_labels: int, id2label: dict[int, str] | None) -> dict[str, Any]:
    """The ``from_pretrained`` keywords of a classifier head: its label names, or its size when
    there are none for every class (transformers warns when both say the size)."""
    if id2label is None or len(id2label) != num_labels:
        return {"num_labels": num_labels}
    return {"id2label": id2label, "label2id": {name: i for i, name in id2label.items()}}
