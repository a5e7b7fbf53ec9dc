"""Loading training data with ``datasets`` and tokenising it through ``Dataset.map``.

Sources (``data.train`` / ``data.eval``):

- a file: ``.json``/``.jsonl``, ``.csv``/``.tsv``, ``.parquet``, ``.txt``, ``.arrow``
  (or any extension with ``data.format``), read by ``load_dataset(<builder>, data_files=...)``;
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_from_disk``),
  or a folder of data files (``load_dataset(folder)``);
- ``builtin:NAME`` (``xtrain.builtin``: written as jsonl once, then read like any file);
- a Hugging Face hub id (``load_dataset(id)``; needs the network or a filled cache).

Tokenisation runs through ``Dataset.map`` with a fingerprint made of stable parts (the input
data's fingerprint, the tokenizer's serialised form, the settings), so a second run, and every
other process of the same run, loads the cached result instead of tokenising again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.train.collate import IGNORE_INDEX

# Bump when the tokenising functions below change what they produce (invalidates the cache).
TOKENIZE_VERSION = 2
MAP_BATCH = 1000  # rows per batched map call: packing=on packs within one (pack_all: the same for lists)

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


def _pick_split(ds: Any, source: str, role: str) -> Any:
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


def load_source(source: str, fmt: str = "auto", role: str = "train", key: str = "data.train") -> Any:
    """A ``datasets.Dataset`` from a file, a folder, ``builtin:NAME`` or a hub id."""
    import datasets

    if builtin.is_builtin(source):
        split = "train" if role == "train" else "eval"
        path = builtin.builtin_data_file(source, split)
        return _load_file(path, "json", source)

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
        return _load_file(path, builder, source)
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


def _load_file(path: Path, builder: str, source: str) -> Any:
    import datasets

    original, path, kwargs = path, *_readable(path, builder, source, whole=True)
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as e:
        raise _read_error(e, original, source, builder) from None
    if len(ds) == 0:
        raise XtrainError(f"data file {source} has no rows", "add examples to it")
    return ds


def _stream_file(path: Path, builder: str, source: str, limit: int) -> tuple[Any, int | None]:
    """``_load_file``'s first ``limit`` rows, streamed by the same builder (``first_rows``)."""
    import datasets

    original, path, kwargs = path, *_readable(path, builder, source, whole=False)
    try:
        stream = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **kwargs)
        return _first_of_stream(stream, limit, source)
    except XtrainError:
        raise
    except Exception as e:
        raise _read_error(e, original, source, builder) from None


def _readable(path: Path, builder: str, source: str, whole: bool) -> tuple[Path, dict[str, Any]]:
    """(the path datasets reads: a cached UTF-8 copy of a file with a BOM or in UTF-16, its
    ``load_dataset`` keywords); an empty file is refused. ``whole``: the UTF-8 check reads it
    all, else its first piece (the rest is checked when the run reads it)."""
    from xtrain import encoding

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
    return path, kwargs


def _read_error(e: Exception, original: Path, source: str, builder: str) -> XtrainError:
    from xtrain import encoding

    cause: BaseException | None = e
    while cause is not None and not isinstance(cause, UnicodeDecodeError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, UnicodeDecodeError) or "codec can't decode" in str(e):
        # a non-UTF-8 byte past the part utf8_copy checks
        return encoding.not_utf8(original, "data file")
    if "corresponds to no data" in str(e):  # a CSV with a header line only
        return XtrainError(f"data file {source} has no rows", "add examples below the header")
    return XtrainError(f"cannot read {source} as {builder}: {_first_line(e)}")


# ---------------------------------------------------------------------------------------------
# The first rows only (the data check: ``xtrain train --dry-run`` and the start of a run)


def first_rows(
    source: str, fmt: str, limit: int, role: str = "train", key: str = "data.train"
) -> tuple[Any, int | None] | None:
    """(a ``Dataset`` of the first ``limit`` rows of ``source``, its row count where that is known
    without reading it all: a saved data set, or a file that ends within ``limit + 1`` rows), read
    by the same ``datasets`` builders as ``load_source`` but streamed: a 10 GB file costs its first
    rows. None for a hub id: nothing is downloaded to check it."""
    import datasets

    if builtin.is_builtin(source):
        return _stream_file(builtin.builtin_data_file(source, role), "json", source, limit)
    path = Path(source).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists() or fmt == "arrow":
            ds = load_source(source, fmt, role, key)  # memory-mapped: nothing read up front
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
        return _stream_file(path, str(builder), source, limit)
    if _looks_like_hub_id(source):
        return None
    return load_source(source, fmt, role, key)  # raises: not found


def _first_of_stream(stream: Any, limit: int, source: str) -> tuple[Any, int | None]:
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


def undecoded_row(ds: Any, i: int, column: str) -> dict[str, Any]:
    """Row ``i`` with its ``Image``/``Audio`` column as the run reads it: undecoded (a path, or
    ``{"bytes", "path"}``)."""
    import datasets

    feature = ds.features.get(column)
    if isinstance(feature, (datasets.Image, datasets.Audio)) and feature.decode:
        ds = ds.cast_column(column, type(feature)(decode=False))
    return ds[i]


# Columns that are checked for presence only: labels (ints or names), images and audio (paths,
# or datasets' Image/Audio feature dicts).
NOT_TEXT_COLUMNS = ("data.label_column", "data.image_column", "data.audio_column")


def require_columns(ds: Any, columns: dict[str, str | None], source: str) -> None:
    """Each configured column (``{"data.text_column": "text", ...}``) must exist in ``ds``."""
    have = list(ds.column_names)
    for key, col in columns.items():
        if col is not None and col not in have:
            raise XtrainError(
                f"column '{col}' not in {source} (columns: {', '.join(have)})",
                f"set {key} to one of them",
            )
        # text columns must hold text: numbers or lists would fail inside the tokenizer with a traceback
        if col is not None and key not in NOT_TEXT_COLUMNS:
            what = _not_text(ds, col)
            if what is not None:
                raise XtrainError(
                    f"column '{col}' of {source} holds {what}, not text", f"point {key} at a text column"
                )


def _not_text(ds: Any, col: str) -> str | None:
    """What a column holds when it is not text (``int64 values``, ``lists``, ``a list in row 3``);
    None for text. datasets types a JSON column that mixes kinds (``"a"`` and ``["a"]``) as Json."""
    features = getattr(ds, "features", None) or {}
    feature = features.get(col)
    if feature is None:
        return None
    dtype = getattr(feature, "dtype", None)
    if dtype is not None:
        return None if dtype in ("string", "large_string", "null") else f"{dtype} values"
    if type(feature).__name__ in ("List", "LargeList", "Sequence"):
        return "lists"
    for i, value in enumerate(ds[col]):  # Json and other features: the first value that is no text
        if value is not None and not isinstance(value, str):
            return f"a{'n' if _kind(value)[0] in 'aeiou' else ''} {_kind(value)} in row {i}"
    return None


# ---------------------------------------------------------------------------------------------
# Fingerprints


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of everything in the tokenizer that changes its output (stable across processes).
    sha256 of canonical JSON: datasets' Hasher over the parsed JSON took seconds for 100k+
    vocabularies, at every start and resume (benchmarks/fingerprint.py)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body: Any = json.loads(backend.to_str())
        # Truncation/padding are call-time state that the tokenizer remembers from its last call.
        body.pop("truncation", None)
        body.pop("padding", None)
    else:  # a tokenizer without a tokenizers backend: its vocabulary and settings
        body = sorted(tokenizer.get_vocab().items())
    specials = sorted((str(k), str(v)) for k, v in tokenizer.special_tokens_map.items())
    payload = [type(tokenizer).__name__, body, specials, getattr(tokenizer, "add_bos_token", None)]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def map_fingerprint(ds: Any, *parts: Any) -> str:
    from datasets.fingerprint import Hasher

    return Hasher.hash([getattr(ds, "_fingerprint", None), TOKENIZE_VERSION, *parts])


def tokenized(ds: Any, function: Any, fn_kwargs: dict[str, Any], fingerprint: str, desc: str) -> Any:
    """``ds.map(function, batched=True)`` replacing all columns, cached under ``fingerprint``."""
    return ds.map(
        function,
        batched=True,
        batch_size=MAP_BATCH,
        fn_kwargs=fn_kwargs,
        remove_columns=list(ds.column_names),
        new_fingerprint=fingerprint,
        desc=desc,
    )


# ---------------------------------------------------------------------------------------------
# Tokenising functions (top-level: datasets may run them in worker processes)


def _has_target(labels: Sequence[int]) -> bool:
    # The model shifts labels by one: position 0 never counts.
    return any(t != IGNORE_INDEX for t in labels[1:])


def tokenize_causal_lm(
    batch: dict[str, list[Any]],
    tokenizer: Any,
    text_column: str,
    prompt_column: str | None,
    response_column: str | None,
    max_length: int,
    packing: str,
) -> dict[str, list[list[int]]]:
    """Text -> input_ids/labels (+ eos). Prompt/response: labels -100 on the prompt.
    ``packing``: off: one row per example, cut to max_length; on: the examples of this map batch,
    each cut to max_length, packed whole into rows of at most max_length tokens (``pack_rows``);
    concatenate: the examples of this map batch concatenated and cut into max_length blocks."""
    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None else []
    ids_list: list[list[int]] = []
    labels_list: list[list[int]] = []
    if prompt_column is not None and response_column is not None:
        prompts = [p if p is not None else "" for p in batch[prompt_column]]
        responses = [r if r is not None else "" for r in batch[response_column]]
        p_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
        r_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
        for p, r in zip(p_ids, r_ids, strict=True):
            ids_list.append(list(p) + list(r) + tail)
            labels_list.append([IGNORE_INDEX] * len(p) + list(r) + tail)
    else:
        texts = [t if t is not None else "" for t in batch[text_column]]
        for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]:
            ids = list(ids)
            if tail and (not ids or ids[-1] != eos):
                ids = ids + tail
            ids_list.append(ids)
            labels_list.append(list(ids))

    if packing == "concatenate":
        flat_ids = [t for ids in ids_list for t in ids]
        flat_labels = [t for labels in labels_list for t in labels]
        out_ids = [flat_ids[i : i + max_length] for i in range(0, len(flat_ids), max_length)]
        out_labels = [flat_labels[i : i + max_length] for i in range(0, len(flat_labels), max_length)]
    else:
        out_ids = [ids[:max_length] for ids in ids_list]
        out_labels = [labels[:max_length] for labels in labels_list]
    keep = [i for i, labels in enumerate(out_labels) if _has_target(labels)]
    rows = [{"input_ids": out_ids[i], "labels": out_labels[i]} for i in keep]
    if packing == "on":
        return columns(pack_rows(rows, max_length))
    return {
        "input_ids": [r["input_ids"] for r in rows],
        "attention_mask": [[1] * len(r["input_ids"]) for r in rows],
        "labels": [r["labels"] for r in rows],
    }


# ---------------------------------------------------------------------------------------------
# Packing that keeps examples apart


def pack_rows(rows: Sequence[dict[str, list[int]]], max_length: int) -> list[dict[str, list[int]]]:
    """Examples (``input_ids``/``labels``, each at most ``max_length`` long) packed whole into rows
    of at most ``max_length`` tokens, first-fit by decreasing length (ties in input order): a pure
    function of the rows, so every process and every resume gets the same packed rows.

    A packed row holds ``position_ids`` restarting at 0 at every example's first token, which is
    how transformers tells the examples apart (its mask keeps attention inside each example), and
    that first token's label is -100: it is not predicted from the previous example's last one
    (transformers' ``DataCollatorWithFlattening`` does the same)."""
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i]["input_ids"]), i))
    bins: list[list[int]] = []  # example indices per packed row
    room: list[int] = []  # tokens left in each
    for i in order:
        n = len(rows[i]["input_ids"])
        if n > max_length:
            raise ValueError(f"example of {n} tokens does not fit max_length={max_length}")
        slot = next((b for b, left in enumerate(room) if left >= n), None)
        if slot is None:
            bins.append([i])
            room.append(max_length - n)
        else:
            bins[slot].append(i)
            room[slot] -= n
    packed = []
    for members in bins:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for i in sorted(members):  # the examples of a row in their input order
            row = rows[i]
            ids += row["input_ids"]
            labels += [IGNORE_INDEX, *row["labels"][1:]]
            positions += range(len(row["input_ids"]))
        packed.append({"input_ids": ids, "labels": labels, "position_ids": positions})
    return packed


def pack_all(rows: Sequence[dict[str, list[int]]], max_length: int) -> list[dict[str, list[int]]]:
    """``pack_rows`` over a list in chunks of ``MAP_BATCH`` rows, as the batched map packs."""
    return [r for i in range(0, len(rows), MAP_BATCH) for r in pack_rows(rows[i : i + MAP_BATCH], max_length)]


def columns(rows: Sequence[dict[str, list[int]]]) -> dict[str, list[list[int]]]:
    """Rows of dicts -> a dict of columns (what a batched ``Dataset.map`` returns)."""
    keys = ("input_ids", "labels", "position_ids")
    return {k: [r[k] for r in rows] for k in keys}


def tokenize_seq_cls(
    batch: dict[str, list[Any]],
    tokenizer: Any,
    text_column: str,
    text_pair_column: str | None,
    label_column: str,
    label_to_id: dict[str, int] | None,
    max_length: int,
) -> dict[str, list[Any]]:
    """Text (+ pair) -> input_ids/attention_mask(/token_type_ids), label -> class id."""
    texts = [t if t is not None else "" for t in batch[text_column]]
    pairs = None
    if text_pair_column is not None:
        pairs = [t if t is not None else "" for t in batch[text_pair_column]]
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    out = {k: list(v) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if label_to_id is None:
        out["labels"] = [int(v) for v in batch[label_column]]
    else:
        out["labels"] = [label_to_id[label_key(v)] for v in batch[label_column]]
    return out


# ---------------------------------------------------------------------------------------------
# Labels


def label_key(value: Any) -> str:
    """The mapping key of a label value: ``True`` and ``"True"`` are the same label."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _kind(value: Any) -> str:
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
        first.setdefault(_kind(v), v)
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
    train: Any, eval_ds: Any | None, column: str, num_labels: int | None, sources: tuple[str, str]
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


def label_values(ds: Any, column: str, source: str) -> list[Any]:
    """The distinct labels of a column. A JSON column that mixes numbers and names is typed Json
    by datasets (arrow has no ``unique`` for it): read row by row, lists and objects refused."""
    feature = ds.features.get(column)
    if getattr(feature, "dtype", None) is not None or hasattr(feature, "names"):
        return ds.unique(column)
    seen: dict[tuple[str, str], Any] = {}
    for i, value in enumerate(ds[column]):
        if isinstance(value, (list, dict)):
            raise XtrainError(
                f"the label column of {source} holds a {_kind(value)} in row {i}, not a label",
                "use one integer (0..n-1) or one name per row",
            )
        seen.setdefault((_kind(value), label_key(value)), value)
    return list(seen.values())


def head_labels(num_labels: int, id2label: dict[int, str] | None) -> dict[str, Any]:
    """The ``from_pretrained`` keywords of a classifier head: its label names, or its size when
    there are none for every class (transformers warns when both say the size)."""
    if id2label is None or len(id2label) != num_labels:
        return {"num_labels": num_labels}
    return {"id2label": id2label, "label2id": {name: i for i, name in id2label.items()}}
