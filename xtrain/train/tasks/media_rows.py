"""What image, audio and vision-language rows share: the one-line error for a bad row, paths
relative to the data file, undecoded media columns, and text labels that end in eos.

Everything here is plain functions and a top-level exception, so row classes built on it pickle
into spawned DataLoader workers (Windows, macOS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from xtrain.errors import XtrainError
from xtrain.train.collate import IGNORE_INDEX


class UnreadableRow(XtrainError):
    """A row whose media file is missing or cannot be decoded: one line with the file and the row.

    A DataLoader worker re-raises an exception in the main process as ``type(e)(traceback text)``;
    the constructor keeps only the original message from that text, so the user still sees one
    line. Subclasses name their default hint."""

    DEFAULT_HINT: ClassVar[str | None] = None

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2) -> None:
        default = type(self).DEFAULT_HINT
        if "Original Traceback" in message:
            last = message.rstrip().splitlines()[-1]
            message = last.split(": ", 1)[1] if ": " in last else last
            if default:
                message = message.removesuffix(f" ({default})")
        super().__init__(message, hint or default, exit_code)


def resolve_path(path: str, base_dir: Path | None) -> Path:
    """A relative media path is relative to the data file's folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def describe_cell(value: Any, base_dir: Path | None, embedded: str) -> str:
    """How an error names a media cell: its path, or ``embedded`` for bytes without one."""
    if isinstance(value, str):
        return str(resolve_path(value, base_dir))
    if isinstance(value, dict):
        return str(value.get("path") or embedded)
    return type(value).__name__


def undecoded(ds: Any, column: str, kind: str) -> Any:
    """``ds`` with an ``Image``/``Audio`` column (``kind``), or a list of them, switched to
    undecoded ``{"bytes", "path"}`` cells: a metadata change, no data is rewritten. Media are
    then read per row, when the DataLoader asks for it."""
    import datasets

    feature_type = getattr(datasets, kind)
    if column not in ds.column_names:
        return ds
    feature = ds.features[column]
    if isinstance(feature, feature_type):
        return ds.cast_column(column, feature_type(decode=False)) if feature.decode else ds
    inner = getattr(feature, "feature", None)
    if isinstance(feature, (datasets.List, datasets.Sequence)) and isinstance(inner, feature_type):
        return ds.cast_column(column, datasets.List(feature_type(decode=False)))
    return ds


def eos_labels(
    tokenizer: Any, texts: list[str], max_length: int, drop_first: int | None = None
) -> list[list[int]]:
    """Token ids of each text ending in eos (generation stops at eos only if it learned to write
    it), truncated to ``max_length`` and still ending in eos. ``drop_first``: a leading token id to
    remove (a decoder start token the model prepends itself)."""
    eos = tokenizer.eos_token_id
    out = []
    for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]:
        ids = list(ids)
        if drop_first is not None and ids and ids[0] == drop_first:
            ids = ids[1:]
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        if len(ids) > max_length:
            ids = ids[: max_length - 1] + [eos] if eos is not None else ids[:max_length]
        out.append(ids)
    return out


def padded_labels(ids: list[list[int]], pad_to_multiple_of: int | None = None) -> Any:
    """A [batch, longest] long tensor of ``ids`` padded with -100 (ignored by the loss)."""
    import math

    import torch

    length = max(len(x) for x in ids)
    if pad_to_multiple_of:
        length = math.ceil(length / pad_to_multiple_of) * pad_to_multiple_of
    labels = torch.full((len(ids), length), IGNORE_INDEX, dtype=torch.long)
    for i, x in enumerate(ids):
        labels[i, : len(x)] = torch.as_tensor(x, dtype=torch.long)
    return labels
