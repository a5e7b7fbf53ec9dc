"""The dry run's word on a first run's encoding (``xtrain.data.encoded``): whether the run reads
its encoded rows from the cache, else about how many rows it encodes and how long that takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from xtrain.data import encoded
from xtrain.data.rows.formats import text_names
from xtrain.data.sources import about_rows, read_before
from xtrain.errors import XtrainError
from xtrain.tasks.common import raw_datasets

if TYPE_CHECKING:
    from datasets import Dataset

    from xtrain.config.schema import TrainConfig
    from xtrain.tasks.data_check import Sample


def encoding_note(
    cfg: TrainConfig, samples: list[Sample], encode: Callable[[Dataset, Dataset | None, str, str], object]
) -> str | None:
    """The dry run's word on the first run's encoding: cached, or about how long it takes.
    ``encode(train, eval or None, train name, eval name)``: the task's own steps from the rows as
    read to what its loop reads, run under ``encoded.peeking`` (what is cached is read, nothing
    is encoded): on the whole data when datasets has read every file before (a first run
    converts them), else on the checked rows, timed, for the estimate. None: data on the hub."""
    d = cfg.data
    sources = [(f, "train") for f in d.train_sources()] + ([(d.eval, "eval")] if d.eval else [])
    ready = [read_before(f, d.format, role, text_names(d)) for f, role in sources]
    train = next((s for s in samples if s.role == "train"), None)
    if any(r is None for r in ready) or train is None:
        return None
    other = next((s for s in samples if s.role == "eval"), None)
    try:
        with encoded.peeking():
            if all(ready):
                encode(*raw_datasets(cfg))
                return "encoded rows: cached (the run reads them from datasets' cache, encoding nothing)"
            encode(train.ds, other.ds if other is not None else None, train.name, other.name if other else "")
    except encoded.NotCached as e:
        rows: int | None = len(e.ds)
        if not all(ready):
            found = [about_rows(f) for f in d.train_sources()]
            capped = [None if n is None else min(n, d.max_samples or n) for n in found]
            rows = sum(n for n in capped if n is not None) if None not in capped else None
            if rows is not None and not d.eval:
                rows = round(rows * (1 - d.eval_fraction))
        each = encoded.seconds_a_row(e.ds, e.encoding)
        return _estimate(rows, each, e.encoding.processes, all(ready))
    except XtrainError:  # the run says it, in its own line
        return None
    return None


def _estimate(rows: int | None, each: float, setting: int | None, exact: bool) -> str:
    if rows is None:
        return (
            "encoded rows: not cached yet; the first run encodes every row (about "
            f"{each * 1000:.2f} ms a row in one process here), then caches them"
        )
    n = encoded.processes(rows, setting)
    took = rows * each / n
    when = "under a second" if took < 1 else f"{took:.0f} s" if took < 120 else f"{took / 60:.0f} min"
    about = "" if exact else "about "
    if not exact and rows >= 1000:  # counted from the file's size: three figures
        rows = round(rows, 3 - len(str(rows)))
    return (
        f"encoded rows: not cached yet; the first run encodes {about}{rows:,} rows "
        f"({'' if took < 1 else 'about '}{when} on {n} process{'es' if n != 1 else ''} here), "
        "then caches them for the runs after it"
    )
