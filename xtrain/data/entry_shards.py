"""A collated micro-batch prepared for a sequence cut inside the model (``parallel.sequence`` for
rows the model must see whole first: a vision-language row, whose image placeholder tokens become
the vision tower's features inside the model's forward, and whose positions (Qwen2-VL's 3-D
M-RoPE) are computed from the whole row).

Every process of a group gets the whole row: its ``input_ids``, ``attention_mask`` and other
per-token inputs padded to a multiple of N (padding ids, mask 0), the pixel values as they are.
Only the labels are this process's: shifted over the whole row first and then cut, exactly as
for text rows (xtrain/data/sequence_shards.py: ``labels`` and ``shift_labels``, the ``Shards`` it
describes, its segments from the attention mask). The model cuts the rest at its text decoder's
entry (xtrain/model/sequence_entry.py), after the images are merged and the positions computed.
"""

from __future__ import annotations

from typing import Any

import torch

from xtrain.data.sequence_shards import KEY, ShardCollator, _pad_id, shard_batch

# a row's per-token inputs, kept whole (padded to the group's multiple); labels are cut
WHOLE = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")


def entry_batch(batch: dict[str, Any], size: int, index: int) -> dict[str, Any]:
    """``batch`` for shard ``index`` of ``size`` cut at the model's text decoder: whole rows,
    this shard's shifted labels (see the module docstring)."""
    ids = batch["input_ids"]
    rows, length = ids.shape
    text = {k: batch[k] for k in ("input_ids", "labels", "attention_mask") if batch.get(k) is not None}
    cut = shard_batch(text, size, index)  # the labels, shifted then cut; the shards' description
    extra = cut[KEY].length - length
    pad_id = _pad_id(batch)
    out = dict(batch)
    for key in WHOLE:
        value = batch.get(key)
        if extra and torch.is_tensor(value) and value.dim() == 2 and value.shape == (rows, length):
            fill = pad_id if key == "input_ids" else 0
            out[key] = torch.cat([value, value.new_full((rows, extra), fill)], dim=1)
    if "labels" in cut:
        out["labels"] = out["shift_labels"] = cut["labels"]
    out["use_cache"] = False
    out[KEY] = cut[KEY]
    return out


class EntryShardCollator(ShardCollator):
    """The task's collator, then its batch prepared for the cut at the model's text decoder
    (``entry_batch``)."""

    cut = staticmethod(entry_batch)
