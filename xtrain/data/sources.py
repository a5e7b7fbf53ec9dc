"""Loading training data with ``datasets`` and tokenising it through ``Dataset.map``.

Sources (``data.train`` / ``data.eval``):

- a file: ``.json``/``.jsonl``, ``.csv``/``.tsv``, ``.parquet``, ``.txt``, ``.arrow``
  (or any extension with ``data.format``), read by ``load_dataset(<builder>, data_files=...)``;
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_from_disk``),
  or a folder of data files (``load_dataset(folder)``);
- ``builtin:NAME`` (``xtrain.builtin``: written as jsonl once, then read like any file);
- a Hugging Face hub id (``load_dataset(id)``; needs the network or a filled cache).

Text is read as text whatever it looks like: a JSON column of ISO dates, which pyarrow's JSON
reader types as timestamps, is read again as ``datasets.Json`` (each cell the value the file
holds) and then as the strings it holds (``_as_written``); a CSV's text columns (``text``: the
ones the config reads as text) are read as strings, no number, boolean or "null" guessed from
them (``_text_options``). Folders of files and hub data sets are read as ``datasets`` reads them.

Tokenisation runs through ``Dataset.map`` with a fingerprint made of stable parts (the input
data's fingerprint, the tokenizer's serialised form, the settings), so a second run, and every
other process of the same run, loads the cached result instead of tokenising again.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import atomic, builtin, encoding
from xtrain.errors import XtrainError
from xtrain.runtime.quiet import quiet_data_read_errors

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict, Features, IterableDataset, IterableDatasetDict

    DatasetOrDict = Dataset | DatasetDict | IterableDataset | IterableDatasetDict

EXTENSIONS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".text": "text",
    ".arrow": "arrow",
}
EVAL_SPLITS = ("validation", "eval", "valid", "dev", "test")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


def _looks_like_hub_id(source: str) -> bool:
    if source.startswith((".", "/", "~", "\\")) or "\\" in source or re.match(r"^[A-Za-z]:", source):
        return False
    if Path(source).suffix.lower() in EXTENSIONS:
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


def load_source(
    source: str, fmt: str = "auto", role: str = "train", key: str = "data.train", text: Collection[str] = ()
) -> Dataset:
    """A ``datasets.Dataset`` from a file, a folder, ``builtin:NAME`` or a hub id; ``text``: the
    columns read as text (a CSV's; JSON's dates are always kept as written)."""
    import datasets

    if builtin.is_builtin(source):
        split = "train" if role == "train" else "eval"
        path = builtin.builtin_data_file(source, split)
        return _load_file(path, "json", source, text)

    path = Path(source).expanduser()
    if path.is_dir():
        saved = (path / "dataset_dict.json").exists() or (path / "state.json").exists()
        try:
            if saved or fmt == "arrow":
                ds = datasets.load_from_disk(str(path))
            else:
                ds = datasets.load_dataset(str(path))
        except XtrainError:
            raise
        except Exception as e:
            raise XtrainError(f"cannot read data folder {source}: {_first_line(e)}") from None
        return _pick_split(ds, source, role)
    if path.is_file():
        builder = fmt if fmt != "auto" else EXTENSIONS.get(path.suffix.lower())
        if builder is None:
            raise XtrainError(
                f"cannot tell the format of {source} from its extension",
                f"set data.format (json, csv, parquet, text, arrow); known: {', '.join(EXTENSIONS)}",
            )
        return _load_file(path, builder, source, text)
    if _looks_like_hub_id(source):
        try:
            ds = datasets.load_dataset(source)
        except Exception as e:
            raise XtrainError(
                f"{key} '{source}' is not a local file or folder, and loading it from the Hugging Face "
                f"hub failed: {_first_line(e)}",
                "check the path (relative paths are looked up next to the config file, then in the "
                "current folder), or download the data set first",
            ) from None
        return _pick_split(ds, source, role)
    raise XtrainError(
        f"data file {source} not found ({key})",
        "check the path: relative paths are looked up next to the config file, then in the current folder",
    )


def _load_file(path: Path, builder: str, source: str, text: Collection[str] = ()) -> Dataset:
    import datasets

    original, path, kwargs = path, *_readable(path, builder, source, whole=True, text=text)
    quiet_data_read_errors()  # datasets' own line about a file it cannot parse: xtrain says it once
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
        kept = _as_written(ds.features) if builder == "json" else None
        if kept is not None:  # dates typed as timestamps: read again, each cell as the file has it
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", features=kept, **kwargs)
            ds = _json_as_text(ds)
    except Exception as e:
        raise _read_error(e, original, source, builder) from None
    if len(ds) == 0:
        raise XtrainError(f"data file {source} has no rows", "add examples to it")
    return ds


def _stream_file(
    path: Path, builder: str, source: str, limit: int, text: Collection[str] = ()
) -> tuple[Dataset, int | None]:
    """``_load_file``'s first ``limit`` rows, streamed by the same builder (``first_rows``)."""
    import datasets

    original, path, kwargs = path, *_readable(path, builder, source, whole=False, text=text)
    quiet_data_read_errors()
    try:
        stream = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **kwargs)
        kept = _as_written(stream.features) if builder == "json" and stream.features is not None else None
        if kept is None:
            return _first_of_stream(stream, limit, source)
        stream = datasets.load_dataset(
            builder, data_files=str(path), split="train", streaming=True, features=kept, **kwargs
        )
        ds, total = _first_of_stream(stream, limit, source)
        return _json_as_text(ds), total
    except XtrainError:
        raise
    except Exception as e:
        raise _read_error(e, original, source, builder) from None


def _readable(
    path: Path, builder: str, source: str, whole: bool, text: Collection[str] = ()
) -> tuple[Path, dict[str, Any]]:
    """(the path datasets reads: a cached UTF-8 copy of a file with a BOM or in UTF-16, its
    ``load_dataset`` keywords: a CSV's ``text`` columns as text); an empty file is refused.
    ``whole``: the UTF-8 check reads it all, else its first piece (the rest is checked when the
    run reads it)."""
    kwargs: dict[str, Any] = {}
    if builder == "csv" and path.suffix.lower() == ".tsv":
        kwargs["delimiter"] = "\t"
    if builder in ("json", "csv", "text"):
        # datasets reads text as UTF-8: a BOM or UTF-16 (PowerShell's `>`) gets a cached UTF-8 copy
        path = encoding.utf8_copy(path, "data file", whole=whole)
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    if size == 0:
        raise XtrainError(
            f"data file {source} is empty", "point data.train/data.eval at a file with examples"
        )
    if builder == "csv" and text:
        kwargs.update(_text_options(path, kwargs.get("delimiter", ","), text))
    return path, kwargs


def _text_options(path: Path, delimiter: str, text: Collection[str]) -> dict[str, Any]:
    """pandas' ``read_csv`` keywords that keep a CSV's ``text`` columns as written ("12", "007",
    "true", "null", "2019-02-15" stay strings, an empty cell ""), the other columns typed as
    pandas guesses (numbers, and its usual empty values)."""
    import csv

    try:
        from pandas._libs.parsers import STR_NA_VALUES  # pandas' own list of empty values
    except ImportError:  # (a private name: the list as pandas 2 has it)
        STR_NA_VALUES = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND"}
        STR_NA_VALUES |= {"1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}

    with path.open(encoding="utf-8", newline="") as f:
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


def _json_as_text(ds: Dataset) -> Dataset:
    """``_as_written``'s ``Json`` columns that hold only text (or nulls) as string columns, as
    the same rows of another file read (and mix: ``xtrain.data.mixing``)."""
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


def _as_written(features: Features) -> Features | None:
    """``features`` with each column that pyarrow's JSON reader typed as dates or times (it does
    so to a column of ISO strings: JSON has no date type) read as ``datasets.Json``: each cell the
    value the file holds. None when there is none."""
    import datasets

    dated = [name for name, feature in features.items() if _temporal(feature)]
    if not dated:
        return None
    return datasets.Features({n: datasets.Json() if n in dated else f for n, f in features.items()})


def _read_error(e: Exception, original: Path, source: str, builder: str) -> XtrainError:
    import datasets

    cache = datasets.config.HF_DATASETS_CACHE  # where load_dataset writes its Arrow copy
    if refused := atomic.cannot_write(atomic.DATASETS_CACHE, cache, e):  # read-only or full
        return refused
    chain = [e]  # datasets wraps pyarrow's error ("An error occurred while generating the dataset")
    while (up := chain[-1].__cause__ or chain[-1].__context__) is not None and up not in chain:
        chain.append(up)
    parse = next((c for c in chain if "JSON parse error" in str(c)), None)
    if builder == "json" and parse is not None:
        if bad := _bad_json_line(original):
            line, why = bad
            return XtrainError(f"data file {source}, line {line}: {why}", "fix or remove that line")
        e = parse  # type: ignore[assignment]
    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, UnicodeDecodeError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, UnicodeDecodeError) or "codec can't decode" in str(e):
        # a non-UTF-8 byte past the part utf8_copy checks
        return encoding.not_utf8(original, "data file")
    if "corresponds to no data" in str(e):  # a CSV with a header line only
        return XtrainError(f"data file {source} has no rows", "add examples below the header")
    return XtrainError(f"cannot read {source} as {builder}: {_first_line(e)}")


def _bad_json_line(path: Path) -> tuple[int, str] | None:
    """(the number of the first line of a JSON-lines file that is not one JSON object of valid
    text, what is wrong with it), read again after pyarrow refused the file (its message counts
    rows of a block, not lines); None for a file that is one JSON document."""
    import json

    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for number, text in enumerate(f, 1):
            line = text.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                json.dumps(row, ensure_ascii=False).encode("utf-8")
            except json.JSONDecodeError as e:
                if number == 1 and line.lstrip()[:1] in ("[", "{") and len(line.strip()) < 2:
                    return None  # one JSON document over several lines, not JSON lines
                return number, f"not valid JSON ({e.msg}, column {e.colno})"
            except UnicodeEncodeError:
                return number, "a \\u escape that is half of a character (a lone surrogate)"
            if not isinstance(row, dict):
                return number, f"a JSON {type(row).__name__}, not an object with named fields"
    return None


# ---------------------------------------------------------------------------------------------
# The first rows only (the data check: ``xtrain train --dry-run`` and the start of a run)


def first_rows(
    source: str,
    fmt: str,
    limit: int,
    role: str = "train",
    key: str = "data.train",
    text: Collection[str] = (),
) -> tuple[Dataset, int | None] | None:
    """(a ``Dataset`` of the first ``limit`` rows of ``source``, its row count where that is known
    without reading it all: a saved data set, or a file that ends within ``limit + 1`` rows), read
    by the same ``datasets`` builders as ``load_source`` but streamed: a 10 GB file costs its first
    rows. None for a hub id: nothing is downloaded to check it."""
    import datasets

    if builtin.is_builtin(source):
        return _stream_file(builtin.builtin_data_file(source, role), "json", source, limit, text)
    path = Path(source).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists() or fmt == "arrow":
            ds = load_source(source, fmt, role, key, text)  # memory-mapped: nothing read up front
            return ds.select(range(min(limit, len(ds)))), len(ds)
        try:
            stream = _pick_split(datasets.load_dataset(str(path), streaming=True), source, role)
            return _first_of_stream(stream, limit, source)
        except XtrainError:
            raise
        except Exception as e:
            raise XtrainError(f"cannot read data folder {source}: {_first_line(e)}") from None
    if path.is_file():
        builder = fmt if fmt != "auto" else EXTENSIONS.get(path.suffix.lower())
        if builder is None:
            load_source(source, fmt, role, key)  # its one line about the extension
        return _stream_file(path, str(builder), source, limit, text)
    if _looks_like_hub_id(source):
        return None
    return load_source(source, fmt, role, key)  # raises: not found


def _first_of_stream(stream: IterableDataset, limit: int, source: str) -> tuple[Dataset, int | None]:
    """(the first ``limit`` rows of an ``IterableDataset`` as a ``Dataset``, the row count when
    that is all of them). Image and audio columns stay undecoded, as the run reads them."""
    import itertools

    import datasets

    features = stream.features
    if features is not None:
        for name, feature in features.items():
            if isinstance(feature, (datasets.Image, datasets.Audio)) and feature.decode:
                stream = stream.cast_column(name, type(feature)(decode=False))
        features = stream.features
    rows = list(itertools.islice(stream, limit + 1))
    if not rows:
        raise XtrainError(f"data file {source} has no rows", "add examples to it")
    ds = datasets.Dataset.from_list(rows[:limit], features=features)
    return ds, (len(rows) if len(rows) <= limit else None)


def undecoded_row(ds: Dataset, i: int, column: str) -> dict[str, Any]:
    """Row ``i`` with its ``Image``/``Audio`` column as the run reads it: undecoded (a path, or
    ``{"bytes", "path"}``)."""
    import datasets

    feature = ds.features.get(column)
    if isinstance(feature, (datasets.Image, datasets.Audio)) and feature.decode:
        ds = ds.cast_column(column, type(feature)(decode=False))
    return ds[i]


# ---------------------------------------------------------------------------------------------
# Fingerprints


# ---------------------------------------------------------------------------------------------
# Tokenising functions (top-level: datasets may run them in worker processes)


# ---------------------------------------------------------------------------------------------
# Packing that keeps examples apart


# ---------------------------------------------------------------------------------------------
# Labels
