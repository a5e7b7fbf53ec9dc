"""Rows encoded once: the one path every task's rows take from the data as read to what the loop
trains on. Read (``sources``: each file into Arrow by its ``datasets`` builder), check (the task's
data check on the first rows: a bad row is its one line before anything else runs), encode
(``encode``: the task's ``Encoding``, a batched function of the rows, through ``datasets.map``
into Arrow files on disk), cut and pack (in the encoding; ``packing.pack`` for ``data.packing=on``).
The loop reads the result memory-mapped: no process holds a Python list of all the rows, and the
processes of a run share the pages of one copy.

Encoded once: ``datasets`` keys each step by a fingerprint chained from the one before (the
file's path and modification time for the rows as read, then the row mixing, ``max_samples``,
the eval split), and ``fingerprint`` adds what the encoding depends on (``Encoding.key``: the
task, its encoding's version, the tokenizer's fingerprint, the template, ``max_length``,
``train_on``, ...). A change of any re-encodes; an unchanged one (a second run, a resume, another
learning rate) reads the Arrow files. The cache lives where ``datasets`` keeps it, next to the
rows' own Arrow files. ``datasets`` writes each file under a temporary name and renames it once
whole, so a kill mid-encoding leaves nothing a later run reads (the shards finished before the
kill are reused). In a run of several processes the main one encodes first (the task's
``main_process_first``), the others read its files.

On a first run the rows are encoded by ``processes`` processes (``data.encode_processes``, else
the machine's cores, one per ``ROWS_PER_PROCESS`` rows at most: ``datasets``' ``num_proc``; the
result does not depend on their number), and the progress (rows done of all) goes to the
listener ``reporting`` sets: the run's reporter renders it (library code prints nothing).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import atomic
from xtrain.data import cache_repair

if TYPE_CHECKING:
    from datasets import Dataset, Features

# Bump when the encoding machinery changes what it writes (every cached encoding is redone).
VERSION = 1
# Rows per call of an encoding function (packing=on packs within one), written as one Arrow batch:
# an encoding process holds a call's rows as Python objects (a tenth of that at 10,000 rows a call
# held ~200 MB more a process), while opening the file touches each batch's header (the kernel maps
# ~64 KB of file pages around each: ~60 MB a million rows, reclaimable page cache)
MAP_BATCH = 1000
# Rows a record batch of the data file's Arrow copy (datasets' JSON/CSV builders write what they
# read in batches of this many): fewer headers to touch when a run opens it
ARROW_BATCH = 10_000
ROWS_PER_PROCESS = 10_000  # a first run starts no more encoding processes than one per this many rows

REPORT_ROWS = 5000  # fewer rows encode in a moment: no progress shown
WARM_ROWS = 10  # rows that warm an encoding up before the dry run times it
# (what is encoded, e.g. "encoding train", rows done, rows in all): the progress of an encoding
Listener = Callable[[str, int, int], None]
_listener: Listener | None = None
_peeking = False  # ``peeking``: an encoding not in the cache raises ``NotCached``


class NotCached(Exception):  # noqa: N818  (a signal, not an error a user sees)
    """``encode`` under ``peeking``: ``ds`` is not encoded by ``encoding`` yet."""

    def __init__(self, ds: Dataset, encoding: Encoding) -> None:
        super().__init__(encoding.name)
        self.ds, self.encoding = ds, encoding


@dataclass(frozen=True)
class Encoding:
    """How a task turns the rows of a data set into what its loop reads: ``function(batch,
    indices, **kwargs) -> columns`` over ``MAP_BATCH`` rows at a time (top-level, so it pickles
    into the encoding processes; it may return fewer rows than it got), and ``key``: plain data
    naming everything the result depends on besides the rows and the function's code (the task,
    a version bumped when the function changes what it writes, the tokenizer's fingerprint, the
    settings). ``kwargs`` may hold objects (the tokenizer): they are not hashed, ``key`` is."""

    name: str
    function: Callable[..., Mapping[str, list[Any]]]
    kwargs: dict[str, Any]
    key: tuple[Any, ...]
    features: Features | None = None  # the output columns' types (None: inferred)
    with_indices: bool = True  # the function takes the rows' indices (for its refusals)
    processes: int | None = None  # data.encode_processes; None: the machine's (``processes``)
    # its rows depend on the batches it gets (packing's groups): one process, batches from row 0
    grouped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # more ``Dataset.map`` keywords


def fingerprint(ds: Dataset, encoding: Encoding) -> str:
    """The fingerprint ``encode``'s result is cached under: the rows' own, chained from how they
    were read, and the encoding's name and key."""
    from datasets.fingerprint import Hasher

    return Hasher.hash([getattr(ds, "_fingerprint", None), VERSION, encoding.name, encoding.key])


def processes(rows: int, setting: int | None) -> int:
    """Encoding processes for ``rows`` rows: ``setting`` (``data.encode_processes``), else this
    process's usable cores, one per ``ROWS_PER_PROCESS`` rows at most (starting one costs a
    fork and a copy of the tokenizer)."""
    if setting is not None:
        return max(1, min(setting, rows))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, rows // ROWS_PER_PROCESS))


def encode(ds: Dataset, encoding: Encoding, what: str) -> Dataset:
    """``ds`` encoded by ``encoding`` (``what``: "encoding train", for the progress), cached
    under ``fingerprint`` next to ``ds``'s own Arrow files (a data set held in memory is encoded
    in memory). A full or read-only cache: one line."""
    import datasets

    if _peeking and not cached(ds, encoding):
        raise NotCached(ds, encoding)
    # a cut-short entry (full disk, a copy of the cache cut off): removed and encoded again
    entry = entry_files(ds, encoding)
    cache_repair.drop_damaged(entry, f"the encoded rows ({encoding.name})", "encoding them again")
    n = processes(len(ds), encoding.processes) if not encoding.grouped else 1
    files = ds.cache_files
    where = Path(files[0]["filename"]).parent if files else datasets.config.HF_DATASETS_CACHE
    shown = _progress(what) if len(ds) >= REPORT_ROWS else contextlib.nullcontext()
    with atomic.writing(atomic.DATASETS_CACHE, where), shown:
        return ds.map(
            encoding.function,
            batched=True,
            batch_size=MAP_BATCH,
            with_indices=encoding.with_indices,
            fn_kwargs=encoding.kwargs,
            remove_columns=list(ds.column_names),
            features=encoding.features,
            new_fingerprint=fingerprint(ds, encoding),
            num_proc=n if n > 1 else None,
            desc=what,
            **encoding.extra,
        )


def entry_files(ds: Dataset, encoding: Encoding) -> list[Path]:
    """The Arrow files of ``encode(ds, encoding)``'s cache entry that are on disk: the one file, or
    the shards of an encoding in several processes (``cache-<fingerprint>_00000_of_00002.arrow``)."""
    files = ds.cache_files
    if not files:
        return []
    stem = Path(files[0]["filename"]).parent / f"cache-{fingerprint(ds, encoding)}"
    return [p for p in (stem.with_suffix(".arrow"),) if p.is_file()] + sorted(
        stem.parent.glob(stem.name + "_*_of_*.arrow")
    )


def cached(ds: Dataset, encoding: Encoding) -> bool:
    """Whether ``encode(ds, encoding)`` would read its files instead of encoding (the dry run's
    "cached"): every shard of one earlier encoding is on disk, as ``datasets.map`` looks for them,
    and reads whole (a damaged entry is encoded again)."""
    entry = entry_files(ds, encoding)
    if not entry or cache_repair.damaged(entry):
        return False
    if entry[0].name.endswith(f"{fingerprint(ds, encoding)}.arrow"):
        return True
    found: dict[int, int] = {}
    for path in entry:
        total = path.stem.rsplit("_of_", 1)[-1]
        if total.isdigit():
            found[int(total)] = found.get(int(total), 0) + 1
    return any(count == total for total, count in found.items())


def token_features(**columns: str) -> Features:
    """Features of token columns (``input_ids="int32"``, ...): each a list of that integer type."""
    import datasets

    return datasets.Features({name: datasets.List(datasets.Value(kind)) for name, kind in columns.items()})


class WithNumbers:
    """Encoded rows (a memory-mapped ``Dataset``) read with numbers computed for them after the
    encoding (a preference run's precomputed reference log-probs: ``attach``): ``[i]`` is row
    ``i``'s dict with its numbers, as the collator takes it."""

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds
        self.numbers: dict[str, Any] = {}  # name -> one number a row (a numpy array)

    @property
    def fingerprint(self) -> str | None:
        return getattr(self.ds, "_fingerprint", None)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.ds[int(i)]
        row.update({name: float(values[int(i)]) for name, values in self.numbers.items()})
        return row

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:  # a DataLoader's batch read
        return [self[i] for i in indices]

    def attach(self, name: str, values: Any) -> None:
        self.numbers[name] = values


@contextlib.contextmanager
def peeking() -> Iterator[None]:
    """In the block, ``encode`` reads what is cached and raises ``NotCached`` for the first
    encoding that is not (the dry run: the run's own steps, nothing encoded)."""
    global _peeking
    before, _peeking = _peeking, True
    try:
        yield
    finally:
        _peeking = before


def seconds_a_row(ds: Dataset, encoding: Encoding, rows: int = 100) -> float:
    """The encoding's time a row in this process, on up to ``rows`` rows of ``ds`` after a few
    that warm it up (the template compiled, the tokenizer's caches): the dry run's estimate."""
    import time

    def run(start: int, stop: int) -> int:
        batch = ds[start:stop]
        n = len(next(iter(batch.values()))) if batch else 0
        if n:
            args = (batch, list(range(start, start + n))) if encoding.with_indices else (batch,)
            encoding.function(*args, **encoding.kwargs)
        return n

    warm = min(WARM_ROWS, len(ds) // 2)
    run(0, warm)
    began = time.perf_counter()
    n = run(warm, warm + rows)
    return (time.perf_counter() - began) / n if n else 0.0


# ---------------------------------------------------------------------------------------------
# Progress


@contextlib.contextmanager
def reporting(listener: Listener | None, noter: cache_repair.Noter | None = None) -> Iterator[None]:
    """Encodings in the block report their progress to ``listener`` (the run's reporter), and a
    damaged cache entry made again to ``noter`` (its notes: ``cache_repair``)."""
    global _listener
    before, _listener = _listener, listener
    try:
        with cache_repair.noting(noter):
            yield
    finally:
        _listener = before


@contextlib.contextmanager
def _progress(what: str) -> Iterator[None]:
    """``datasets.map``'s progress bar, while the block runs, as calls of the listener: its
    counts come from every encoding process (it is the bar's own protocol, ``update(n)``)."""
    import datasets.arrow_dataset as arrow_dataset

    listener = _listener
    if listener is None or not hasattr(arrow_dataset, "hf_tqdm"):
        yield
        return
    bar = arrow_dataset.hf_tqdm
    arrow_dataset.hf_tqdm = lambda *args, **kwargs: _Bar(listener, what, kwargs)
    try:
        yield
    finally:
        arrow_dataset.hf_tqdm = bar


class _Bar:
    """The part of a tqdm bar ``datasets.map`` uses, counting rows for the listener (the last
    count, all rows, once)."""

    def __init__(self, listener: Listener, what: str, kwargs: dict[str, Any]) -> None:
        self.listener, self.what = listener, what
        self.total = int(kwargs.get("total") or 0)
        self.done = int(kwargs.get("initial") or 0)
        self.closed = False

    def _emit(self) -> None:
        if not self.closed:
            self.closed = self.done >= self.total
            self.listener(self.what, min(self.done, self.total), self.total)

    def __enter__(self) -> _Bar:
        self._emit()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.done = self.total
            self._emit()

    def update(self, n: int = 1) -> None:
        self.done += n
        self._emit()

    def close(self) -> None:
        pass
