"""One data file read by its ``datasets`` builder, whole (``load_file``: what the run trains on)
or its first rows (``stream_file``: the data check), the two alike.

Before the builder reads it, a file with a BOM or in UTF-16 gets a cached UTF-8 copy and an
empty one is refused (``readable``); text cells are kept as written (``as_written``). JSON is
read in every shape it comes in: JSON lines, one array of rows (alpaca_data.json's shape), and
one object holding its rows as a list under one key (``{"data": [{...}, ...]}``: ``rows_key``).
``datasets`` reads a JSON document (an array, an object) whole even to stream it, so its first
rows are the whole read's first rows: the same rows, the same types, as the run will read.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import encoding
from xtrain.data import as_written, cache_repair
from xtrain.data.encoded import ARROW_BATCH
from xtrain.data.files import compression, format_suffix
from xtrain.data.read_errors import first_line, read_error
from xtrain.errors import XtrainError
from xtrain.runtime.quiet import quiet_data_read_errors

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset, IterableDataset


def load_file(path: Path, builder: str, source: str, text: Collection[str] = ()) -> Dataset:
    """All the rows of the file at ``path`` (``source``: the name the user gave it); ``text``:
    the columns the config reads as text."""
    import datasets

    # a file datasets converted before (its path and modification time) was checked whole then; a
    # damaged copy (or a damaged entry made from it) is removed first, and the file converted again
    whole = not prepared(path, builder, source, text, repair=True)
    original, (path, kwargs) = path, readable(path, builder, source, whole=whole, text=text)
    kwargs["writer_batch_size"] = ARROW_BATCH  # (not in datasets' cache key: a file read before stays read)
    quiet_data_read_errors()  # datasets' own line about a file it cannot parse: xtrain says it once
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
        kept = as_written.dated(ds.features) if builder == "json" else None
        if builder == "json" and (key := rows_key(ds, text)) is not None:
            # one object holding the rows under a key: datasets reads that list (its `field`)
            ds = datasets.load_dataset(
                builder, data_files=str(path), split="train", field=key, writer_batch_size=ARROW_BATCH
            )
        elif kept is not None:  # dates typed as timestamps: read again, each cell as the file has it
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", features=kept, **kwargs)
            ds = as_written.json_as_text(ds)
    except Exception as e:
        if not whole and (folder := copy_folder(original, builder, source, text)) is not None:
            # its copy read whole before this read: the cache failed, not the user's file
            raise XtrainError(
                f"cannot read the datasets cache's copy of {source}: {first_line(e)}",
                f"remove {folder} and run again (the file is converted again)",
            ) from None
        raise read_error(e, original, source, builder) from None
    if len(ds) == 0:
        raise XtrainError(f"data file {source} has no rows", "add examples to it")
    _unique_keys(ds.data.schema, source)
    return ds


def prepared(path: Path, builder: str, source: str, text: Collection[str] = (), repair: bool = False) -> bool:
    """Whether ``load_file`` would read the file's Arrow copy from datasets' cache (made by an
    earlier read of the same file: its path and modification time) instead of converting it: the
    copy is there and reads whole (``cache_repair``). ``repair``: a damaged copy is removed (the
    file is converted again), and so is any damaged entry made from it in the same folder (the
    encoded rows, an eval split's indices); the dry run only looks."""
    folder = copy_folder(path, builder, source, text)
    if folder is None:
        return False
    copy = [p for p in folder.glob("*.arrow") if not p.name.startswith("cache-")]
    made = sorted(folder.glob("cache-*.arrow"))
    if not repair:
        return not cache_repair.damaged(copy)
    if cache_repair.drop_damaged(copy, f"the converted copy of {source}", "converting it again", folder):
        return False
    cache_repair.drop_damaged(made, f"rows made from {source}", "making them again")
    return True


def copy_folder(path: Path, builder: str, source: str, text: Collection[str] = ()) -> Path | None:
    """The folder of the file's Arrow copy in datasets' cache (with its ``dataset_info.json``, and
    the entries made from it); None when the file was not converted yet."""
    import datasets

    try:
        path, kwargs = readable(path, builder, source, whole=False, text=text)
        found = datasets.load_dataset_builder(builder, data_files=str(path), **kwargs)
    except Exception:  # the run says what is wrong with the file, in its own line
        return None
    folder = Path(found.cache_dir)
    return folder if (folder / "dataset_info.json").is_file() else None


def rows_in(path: Path, limit: int = 1000) -> int | None:
    """About how many rows a text file of one row a line holds (JSON lines, CSV, text: its size
    over its first ``limit`` lines' mean); None for any other (compressed, Parquet, a JSON array)."""
    if compression(path) is not None or format_suffix(path) not in (
        ".jsonl",
        ".csv",
        ".tsv",
        ".txt",
        ".json",
    ):
        return None
    with path.open("rb") as f:
        lines = [line for _, line in zip(range(limit), f, strict=False)]
    if (
        not lines
        or lines[0].lstrip()[:1] in (b"[", b"{")
        and format_suffix(path) == ".json"
        and len(lines) == 1
    ):
        return None
    size = path.stat().st_size
    used = sum(len(line) for line in lines)
    return len(lines) if used >= size else round(size / (used / len(lines)))


def _unique_keys(schema: pa.Schema, source: str) -> None:
    """Refuse objects whose keys Arrow read as one name twice (a key with a NUL character is cut
    there: ``""`` and ``"\\u0000"``): their rows read fine, then fail when a cell is read."""
    import pyarrow as pa

    def walk(t: pa.DataType, column: str) -> None:
        if pa.types.is_struct(t):
            names = [t.field(i).name for i in range(t.num_fields)]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise XtrainError(
                    f"data file {source}: objects in column '{column}' have keys that read as one name "
                    f"({', '.join(map(repr, twice))} twice: a key with a NUL character is cut there)",
                    "rename the keys so they differ before any \\u0000",
                )
            for i in range(t.num_fields):
                walk(t.field(i).type, column)
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            walk(t.value_type, column)

    for field in schema:
        walk(field.type, field.name)


def stream_file(
    path: Path, builder: str, source: str, limit: int, text: Collection[str] = ()
) -> tuple[Dataset, int | None]:
    """``load_file``'s first ``limit`` rows, streamed by the same builder (``first_rows``), and
    the row count where that is known."""
    import datasets

    original, (path, kwargs) = path, readable(path, builder, source, whole=False, text=text)
    quiet_data_read_errors()
    try:
        stream = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **kwargs)
        if builder != "json":
            return first_of_stream(stream, limit, source)
        if stream.features is None:  # a JSON document that datasets cannot type from its first lines
            return _head(load_file(original, builder, source, text), limit)
        _unique_keys(stream.features.arrow_schema, source)
        ds, total = first_of_stream(stream, limit, source)
        if total == 1:  # one JSON object: its rows may be under one of its keys
            return _head(load_file(original, builder, source, text), limit)
        kept = as_written.dated(stream.features)
        if kept is None:
            return ds, total
        stream = datasets.load_dataset(
            builder, data_files=str(path), split="train", streaming=True, features=kept, **kwargs
        )
        ds, total = first_of_stream(stream, limit, source)
        return as_written.json_as_text(ds), total
    except XtrainError:
        raise
    except Exception as e:
        raise read_error(e, original, source, builder) from None


def _head(ds: Dataset, limit: int) -> tuple[Dataset, int]:
    return ds.select(range(min(limit, len(ds)))), len(ds)


def readable(
    path: Path, builder: str, source: str, whole: bool, text: Collection[str] = ()
) -> tuple[Path, dict[str, Any]]:
    """(the path datasets reads: a cached UTF-8 copy of a file with a BOM or in UTF-16, its
    ``load_dataset`` keywords: a CSV's ``text`` columns as text); an empty file is refused.
    ``whole``: the UTF-8 check reads it all, else its first piece (the rest is checked when the
    run reads it). A compressed file is handed over as it is: datasets decompresses it, and says
    in its error where it is not UTF-8."""
    kwargs: dict[str, Any] = {}
    if builder == "csv" and format_suffix(path) == ".tsv":
        kwargs["delimiter"] = "\t"
    if builder in ("json", "csv", "text") and compression(path) is None:
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
        kwargs.update(as_written.text_options(path, kwargs.get("delimiter", ","), text))
    return path, kwargs


def first_of_stream(stream: IterableDataset, limit: int, source: str) -> tuple[Dataset, int | None]:
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


def rows_key(ds: Dataset, text: Collection[str]) -> str | None:
    """The key under which a JSON file that is one object holds its rows as a list
    (``{"data": [{"instruction": ...}, ...]}``, maybe beside other keys such as a version); None
    for any other file. Only where nothing else is meant: the file reads as one row, none of its
    keys is a column the config reads (``text``), and exactly one of them holds a list of objects
    that carry such a column (a conversation's turns do not: ``{"messages": [...]}`` is one
    conversation). Its rows are read by pandas (datasets' ``field``), which keeps text as written
    and types as dates only the columns whose names say so (``date``, ``*_at``, ...)."""
    if len(ds) != 1 or not text or any(c in text for c in ds.column_names):
        return None
    row = ds[0]
    lists = [n for n, v in row.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
    if len(lists) != 1 or not any(name in row[lists[0]][0] for name in text):
        return None
    return lists[0]
