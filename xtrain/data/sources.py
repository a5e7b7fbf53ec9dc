"""Where training data comes from, as ``datasets`` objects (``data.train`` / ``data.eval``):

- a file: ``.json``/``.jsonl``, ``.csv``/``.tsv``, ``.parquet``, ``.txt``, ``.arrow``, each also
  compressed (``.jsonl.gz``, ``.bz2``, ``.xz``), or any extension with ``data.format``, read by
  ``load_dataset(<builder>, data_files=...)`` (``xtrain.data.reading``: text kept as written,
  JSON in every shape);
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_from_disk``),
  or a folder of data files (``load_dataset(folder)``: read as ``datasets`` reads it);
- ``builtin:NAME`` (``xtrain.builtin``: written as jsonl once, then read like any file);
- a Hugging Face hub id (``load_dataset(id)``; needs the network or a filled cache).

``load_source`` reads one whole (the run); ``first_rows`` its first rows only, streamed where
that costs less (the data check: ``xtrain train --dry-run`` and the start of a run).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import builtin
from xtrain.data.files import EXTENSIONS, builder_of
from xtrain.data.read_errors import first_line
from xtrain.data.reading import first_of_stream, load_file, prepared, rows_in, stream_file
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict

    DatasetOrDict = Dataset | DatasetDict | IterableDataset | IterableDatasetDict

EVAL_SPLITS = ("validation", "eval", "valid", "dev", "test")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


def _looks_like_hub_id(source: str) -> bool:
    if source.startswith((".", "/", "~", "\\")) or "\\" in source or re.match(r"^[A-Za-z]:", source):
        return False
    if builder_of(Path(source)) is not None:
        return False
    return bool(_HUB_ID.match(source)) and ".." not in source


def _pick_split(ds: DatasetOrDict, source: str, role: str) -> Dataset | IterableDataset:
    """One split of a DatasetDict: "train" for training, validation/eval/test for evaluation."""
    from datasets import DatasetDict, IterableDatasetDict

    if not isinstance(ds, (DatasetDict, IterableDatasetDict)):
        return ds
    names = list(ds.keys())
    wanted = ("train",) if role == "train" else EVAL_SPLITS
    for name in wanted:
        if name in ds:
            return ds[name]
    if len(names) == 1:
        return ds[names[0]]
    raise XtrainError(
        f"{source} has splits {', '.join(names)} and none of them is a {role} split",
        f"expected {' or '.join(wanted)}",
    )


def _saved(path: Path, fmt: str) -> bool:
    """A folder written by ``save_to_disk`` (or named arrow by ``data.format``)."""
    return (path / "dataset_dict.json").exists() or (path / "state.json").exists() or fmt == "arrow"


def _file_builder(path: Path, fmt: str, source: str) -> str:
    builder = fmt if fmt != "auto" else builder_of(path)
    if builder is None:
        raise XtrainError(
            f"cannot tell the format of {source} from its extension",
            f"set data.format (json, csv, parquet, text, arrow); known: {', '.join(EXTENSIONS)} "
            "(each also .gz, .bz2, .xz)",
        )
    return builder


def _not_found(source: str, key: str) -> XtrainError:
    return XtrainError(
        f"data file {source} not found ({key})",
        "check the path: relative paths are looked up next to the config file, then in the current folder",
    )


def load_source(
    source: str, fmt: str = "auto", role: str = "train", key: str = "data.train", text: Collection[str] = ()
) -> Dataset:
    """A ``datasets.Dataset`` from a file, a folder, ``builtin:NAME`` or a hub id; ``text``: the
    columns read as text (a CSV's; JSON's dates are always kept as written)."""
    import datasets

    if builtin.is_builtin(source):
        split = "train" if role == "train" else "eval"
        path = builtin.builtin_data_file(source, split)
        return load_file(path, "json", source, text)

    path = Path(source).expanduser()
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path)) if _saved(path, fmt) else datasets.load_dataset(str(path))
        except XtrainError:
            raise
        except Exception as e:
            raise XtrainError(f"cannot read data folder {source}: {first_line(e)}") from None
        return _pick_split(ds, source, role)
    if path.is_file():
        return load_file(path, _file_builder(path, fmt, source), source, text)
    if _looks_like_hub_id(source):
        try:
            ds = datasets.load_dataset(source)
        except Exception as e:
            raise XtrainError(
                f"{key} '{source}' is not a local file or folder, and loading it from the Hugging Face "
                f"hub failed: {first_line(e)}",
                "check the path (relative paths are looked up next to the config file, then in the "
                "current folder), or download the data set first",
            ) from None
        return _pick_split(ds, source, role)
    raise _not_found(source, key)


def first_rows(
    source: str,
    fmt: str,
    limit: int,
    role: str = "train",
    key: str = "data.train",
    text: Collection[str] = (),
) -> tuple[Dataset, int | None] | None:
    """(a ``Dataset`` of the first ``limit`` rows of ``source``, its row count where that is known
    without reading it all: a saved data set, a JSON document, or a file that ends within
    ``limit + 1`` rows), read by the same ``datasets`` builders as ``load_source`` but streamed:
    a 10 GB file costs its first rows. None for a hub id: nothing is downloaded to check it."""
    import datasets

    if builtin.is_builtin(source):
        return stream_file(builtin.builtin_data_file(source, role), "json", source, limit, text)
    path = Path(source).expanduser()
    if path.is_dir():
        if _saved(path, fmt):
            ds = load_source(source, fmt, role, key, text)  # memory-mapped: nothing read up front
            return ds.select(range(min(limit, len(ds)))), len(ds)
        try:
            stream = _pick_split(datasets.load_dataset(str(path), streaming=True), source, role)
            return first_of_stream(stream, limit, source)
        except XtrainError:
            raise
        except Exception as e:
            raise XtrainError(f"cannot read data folder {source}: {first_line(e)}") from None
    if path.is_file():
        return stream_file(path, _file_builder(path, fmt, source), source, limit, text)
    if _looks_like_hub_id(source):
        return None
    raise _not_found(source, key)


def read_before(
    source: str, fmt: str = "auto", role: str = "train", text: Collection[str] = ()
) -> bool | None:
    """Whether ``load_source`` would read ``source`` from datasets' cache (an earlier run read it,
    or a saved data set: memory-mapped as it is) instead of converting it; None for a hub id."""
    if builtin.is_builtin(source):
        return prepared(builtin.builtin_data_file(source, role), "json", source, text)
    path = Path(source).expanduser()
    if path.is_dir():
        return _saved(path, fmt)
    if path.is_file():
        return prepared(path, _file_builder(path, fmt, source), source, text)
    return None


def about_rows(source: str, role: str = "train") -> int | None:
    """About how many rows a local data file holds without reading it (``reading.rows_in``)."""
    path = (
        builtin.builtin_data_file(source, role) if builtin.is_builtin(source) else Path(source).expanduser()
    )
    return rows_in(path) if path.is_file() else None


def undecoded_row(ds: Dataset, i: int, column: str) -> dict[str, Any]:
    """Row ``i`` with its ``Image``/``Audio`` column as the run reads it: undecoded (a path, or
    ``{"bytes", "path"}``)."""
    import datasets

    feature = ds.features.get(column)
    if isinstance(feature, (datasets.Image, datasets.Audio)) and feature.decode:
        ds = ds.cast_column(column, type(feature)(decode=False))
    return ds[i]
