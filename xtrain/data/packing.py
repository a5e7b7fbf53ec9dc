"""Packing (causal-lm ``data.packing``): whole examples packed into rows whose ``position_ids``
restart per example (``pack_rows``), the encoded rows ``MAP_BATCH`` at a time (``pack``: a pass of
its own after the encoding, in one process, so the groups start at the same rows whatever number
of processes encoded them); ``collate.PackedCollator`` joins a micro-batch into one row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.encoded import MAP_BATCH, Encoding, encode, token_features

if TYPE_CHECKING:
    from datasets import Dataset

# Bump when pack_rows changes the rows it makes (every cached packing is redone).
VERSION = 1


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
    """``pack_rows`` over a list in chunks of ``MAP_BATCH`` rows, as ``pack`` packs a data set."""
    return [r for i in range(0, len(rows), MAP_BATCH) for r in pack_rows(rows[i : i + MAP_BATCH], max_length)]


def pack_columns(batch: dict[str, list[Any]], max_length: int) -> dict[str, list[list[int]]]:
    """A map batch of encoded rows (``input_ids``, ``labels``) packed (top-level: ``Dataset.map``)."""
    rows = [
        {"input_ids": ids, "labels": labels}
        for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True)
    ]
    packed = pack_rows(rows, max_length)
    return {k: [r[k] for r in packed] for k in ("input_ids", "labels", "position_ids")}


def pack(ds: Dataset, max_length: int, what: str) -> Dataset:
    """The encoded rows of ``ds`` packed ``MAP_BATCH`` at a time (``pack_all``'s groups), cached as
    the encoding is (``encoded.encode``, in one process: the groups do not depend on how many
    encoded the rows)."""
    columns = token_features(input_ids="int32", labels="int32", position_ids="int32")
    kwargs = {"max_length": max_length}
    packing = Encoding(
        "packed rows", pack_columns, kwargs, (VERSION, max_length), columns, False, grouped=True
    )
    return encode(ds, packing, what)
