"""Several training files in one run (``data.train: [a.jsonl, b.jsonl]``) and ``data.max_samples``:
LLaMA-Factory's ``max_samples`` (the first N rows of each file) and ``mix_strategy``
(``concat``, ``interleave_under``, ``interleave_over`` with ``interleave_probs``), through
``datasets.concatenate_datasets`` / ``datasets.interleave_datasets``.

The mixed data set is a plain map-style ``Dataset``, the same rows in the same order in every
process (interleaving is seeded by ``run.seed``), so the run's data order (``xtrain.data.sampler``)
shuffles and resumes it as it does one file: the same samples per step on any number of processes,
and a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset

    from xtrain.config.schema import DataConfig

# data.mix -> datasets.interleave_datasets' stopping_strategy (LLaMA-Factory's mapping)
STOPPING = {"interleave_under": "first_exhausted", "interleave_over": "all_exhausted"}


def check(d: DataConfig) -> None:
    """``data.mix`` and ``data.mix_probs`` against the files of ``data.train`` (the config's
    whole-config checks)."""
    files = d.train_sources()
    if isinstance(d.train, list) and not files:
        raise XtrainError("data.train is an empty list", "list one data file or more")
    if d.mix_probs is None:
        return
    if d.mix not in STOPPING:
        raise XtrainError(
            f"data.mix_probs sets each file's share of an interleaved mix, and data.mix={d.mix}",
            "set data.mix=interleave_under (or interleave_over), or leave data.mix_probs unset",
        )
    if len(d.mix_probs) != len(files):
        raise XtrainError(
            f"data.mix_probs has {len(d.mix_probs)} shares for {len(files)} data.train files",
            "give one share per file, in the order of data.train",
        )


def shares(d: DataConfig, n: int) -> list[float]:
    """Each of ``n`` files' share of an interleaved mix, summing to 1 (equal without ``mix_probs``)."""
    probs = d.mix_probs or [1.0] * n
    total = sum(probs)
    return [p / total for p in probs]


def describe(d: DataConfig) -> str | None:
    """How the run mixes its training files, in words (the data check shows it); None for one file."""
    files = d.train_sources()
    rows = f"the first {d.max_samples} row{'s' if d.max_samples != 1 else ''}"
    cap = f", {rows} of each" if d.max_samples else ""
    if len(files) < 2:
        return f"data.max_samples={d.max_samples}: {rows} of each file" if cap else None
    if d.mix == "concat":
        return f"data.mix=concat: {len(files)} files one after the other{cap}, shuffled together"
    parts = ", ".join(f"{p:.2f}" for p in shares(d, len(files)))
    until = "one of them runs out" if d.mix == "interleave_under" else "each has run out (others repeated)"
    return f"data.mix={d.mix}: rows drawn from {len(files)} files with shares {parts} until {until}{cap}"


def first_n(ds: Dataset, limit: int | None) -> Dataset:
    """The first ``limit`` rows (``data.max_samples``), or all of them."""
    return ds if limit is None or len(ds) <= limit else ds.select(range(limit))


def mix(parts: list[Dataset], names: list[str], d: DataConfig, seed: int) -> Dataset:
    """The files of ``data.train`` (each already cut to ``data.max_samples``) as one data set."""
    import datasets

    if len(parts) == 1:
        return parts[0]
    first = parts[0].column_names
    for ds, name in zip(parts[1:], names[1:], strict=True):
        if sorted(ds.column_names) != sorted(first):
            raise XtrainError(
                f"data.train files hold other columns: {names[0]} has {', '.join(first)}, "
                f"{name} has {', '.join(ds.column_names)}",
                "mix files of one row format (the same columns)",
            )
    parts = [_plain_strings(ds) for ds in parts]
    try:
        if d.mix == "concat":
            return datasets.concatenate_datasets(parts)
        return datasets.interleave_datasets(
            parts, probabilities=shares(d, len(parts)), seed=seed, stopping_strategy=STOPPING[d.mix]
        )
    except ValueError as e:  # columns of the same name typed otherwise (text in one, lists in another)
        raise XtrainError(
            f"data.train files cannot be mixed: {str(e).splitlines()[0][:200]}",
            "mix files whose columns hold the same kinds of values",
        ) from None


def _plain_strings(ds: Dataset) -> Dataset:
    """``ds`` with its ``large_string`` columns (pandas' text, from a CSV) as ``string`` ones (JSON's),
    so a CSV and a JSON file mix."""
    import datasets

    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Value) and feature.dtype == "large_string":
            ds = ds.cast_column(name, datasets.Value("string"))
    return ds
