"""Text cells read as the file writes them, whatever they look like.

- JSON has no date type, yet pyarrow's JSON reader types a column of ISO strings ("2019-02-15")
  as timestamps: such a column is read again as ``datasets.Json`` (each cell the value the file
  holds: ``dated``), then, where it holds only text, as the strings it holds (``json_as_text``).
- A CSV's ``text`` columns (the ones the config reads as text) are read as strings: no number,
  boolean or "null" guessed from them (``text_options``); its other columns as pandas types them.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.data.files import open_text

if TYPE_CHECKING:
    from datasets import Dataset, Features


def text_options(path: Path, delimiter: str, text: Collection[str]) -> dict[str, Any]:
    """pandas' ``read_csv`` keywords that keep a CSV's ``text`` columns as written ("12", "007",
    "true", "null", "2019-02-15" stay strings, an empty cell ""), the other columns typed as
    pandas guesses (numbers, and its usual empty values)."""
    import csv

    try:
        from pandas._libs.parsers import STR_NA_VALUES  # pandas' own list of empty values
    except ImportError:  # (a private name: the list as pandas 2 has it)
        STR_NA_VALUES = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND"}
        STR_NA_VALUES |= {"1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}

    with open_text(path, newline="") as f:
        header = next(csv.reader(f, delimiter=delimiter), [])
    named = sorted(c for c in set(header) if c in text)
    if not named:
        return {}
    usual = sorted(STR_NA_VALUES)
    return {
        "converters": {c: str for c in named},
        "keep_default_na": False,
        "na_values": {c: usual for c in sorted(set(header)) if c not in text},
    }


def _temporal(feature: Any) -> bool:
    """A feature (nested or not) that holds dates or times."""
    import datasets
    import pyarrow as pa

    if isinstance(feature, datasets.Value):
        return pa.types.is_temporal(feature.pa_type)
    if isinstance(feature, dict):
        return any(_temporal(f) for f in feature.values())
    inner = getattr(feature, "feature", None)
    return inner is not None and _temporal(inner)


def dated(features: Features) -> Features | None:
    """``features`` with each column that pyarrow's JSON reader typed as dates or times (it does
    so to a column of ISO strings: JSON has no date type) read as ``datasets.Json``: each cell the
    value the file holds. None when there is none."""
    import datasets

    columns = [name for name, feature in features.items() if _temporal(feature)]
    if not columns:
        return None
    return datasets.Features({n: datasets.Json() if n in columns else f for n, f in features.items()})


def json_as_text(ds: Dataset) -> Dataset:
    """``dated``'s ``Json`` columns that hold only text (or nulls) as string columns, as the same
    rows of another file read (and mix: ``xtrain.data.mixing``)."""
    import datasets
    from datasets.fingerprint import Hasher

    names = [n for n, f in ds.features.items() if isinstance(f, datasets.Json)]
    text = [n for n in names if all(v is None or isinstance(v, str) for v in ds[n])]
    if not text:
        return ds
    fingerprint = Hasher.hash([getattr(ds, "_fingerprint", None), "dates-as-text", text])
    plain = {n: datasets.Value("string") if n in text else f for n, f in ds.features.items()}
    ds = ds.cast(datasets.Features(plain))  # each cell's JSON text ('"2019-02-15"'), then its value
    return ds.map(
        _decoded, batched=True, fn_kwargs={"names": text}, new_fingerprint=fingerprint, desc="dates as text"
    )


def _decoded(batch: dict[str, list[Any]], names: list[str]) -> dict[str, list[Any]]:
    import json

    return {n: [None if v is None else json.loads(v) for v in batch[n]] for n in names}
