"""Batching and evaluation pieces shared by the built-in tasks.

Everything here is a top-level class or function holding plain data only, so it pickles into
spawned DataLoader workers (Windows, macOS) and into ``torch.multiprocessing`` workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers.utils import ModelOutput

IGNORE_INDEX = -100  # labels the loss skips (padding, prompt tokens)


class PadCollator:
    """Pads a list of tokenised examples to the longest in the batch (right padding).

    ``input_ids`` are padded with ``pad_token_id``, sequence ``labels`` with -100, everything
    else (``attention_mask``, ``token_type_ids``) with 0. Scalar labels (classification) become
    a 1-D tensor. ``pad_to_multiple_of`` rounds the length up (8 suits GPU tensor cores).
    ``masks``: rows stored without an ``attention_mask`` (causal-lm's encoded rows: all ones) get
    one, 1 on each row's own tokens.
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None, masks: bool = False) -> None:
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.masks = masks

    def _pad_value(self, key: str) -> int:
        if key == "input_ids":
            return self.pad_token_id
        if key == "labels":
            return IGNORE_INDEX
        return 0

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("empty batch")
        length = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            length = math.ceil(length / self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch: dict[str, torch.Tensor] = {}
        for key in features[0]:
            values = [f[key] for f in features]
            if isinstance(values[0], (int, float)) or (torch.is_tensor(values[0]) and values[0].ndim == 0):
                batch[key] = torch.as_tensor([int(v) for v in values], dtype=torch.long)
                continue
            pad = self._pad_value(key)
            out = torch.full((len(values), length), pad, dtype=torch.long)
            for i, v in enumerate(values):
                v = torch.as_tensor(v, dtype=torch.long)
                out[i, : len(v)] = v
            batch[key] = out
        if self.masks and "attention_mask" not in batch and "input_ids" in batch:
            sizes = torch.tensor([len(f["input_ids"]) for f in features])
            batch["attention_mask"] = (torch.arange(length)[None, :] < sizes[:, None]).long()
        return batch

    def __repr__(self) -> str:
        return f"PadCollator(pad_token_id={self.pad_token_id}, pad_to_multiple_of={self.pad_to_multiple_of})"


class PackedCollator:
    """Packed rows (``position_ids`` restarting per example, from ``data.pack_rows``) into one
    padding-free row: ``input_ids``, ``labels`` and ``position_ids`` of shape ``[1, tokens]``,
    no ``attention_mask`` (transformers' ``DataCollatorWithFlattening`` layout). transformers
    keeps attention inside each example from the restarting ``position_ids``: flash-attention
    through its variable-length kernel, sdpa and eager through the block-diagonal mask that
    ``masking_utils.create_causal_mask`` builds, which it does only without an attention mask and
    without a KV cache, hence ``use_cache=False`` in the batch (a training forward otherwise makes
    a cache: ``config.use_cache`` is true for most models, and the examples would see each other).

    Rows without ``position_ids`` (the unpacked eval set) are padded as ``PadCollator`` does."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad = PadCollator(pad_token_id, pad_to_multiple_of, masks=True)

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not features:
            raise ValueError("empty batch")
        if "position_ids" not in features[0]:
            return self.pad(features)
        batch: dict[str, Any] = {}
        for key in ("input_ids", "labels", "position_ids"):
            flat = [t for f in features for t in f[key]]
            batch[key] = torch.as_tensor(flat, dtype=torch.long).unsqueeze(0)
        batch["use_cache"] = False
        return batch

    def __repr__(self) -> str:
        return f"PackedCollator(pad_token_id={self.pad.pad_token_id})"


class PreferenceCollator:
    """B preference rows -> one batch of 2B sequences, padded together (one forward over both):
    the B sequences of the first part (``chosen``, or KTO's ``completion``), then the B of the
    second (``rejected``, or KTO's mismatched ``kl`` completion), in row order. Each row's numbers
    (KTO's ``desirable``, the precomputed reference log-probs ``ref_first``/``ref_second``) become
    [B] tensors."""

    def __init__(
        self,
        pad_token_id: int,
        pad_to_multiple_of: int | None = None,
        parts: tuple[str, str] = ("chosen", "rejected"),
    ) -> None:
        self.pad = PadCollator(pad_token_id, pad_to_multiple_of)
        self.parts = parts

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        sequences = []
        for p in self.parts:
            for f in features:
                ids = f[f"{p}_input_ids"]
                labels = f[f"{p}_labels"]
                sequences.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
        batch = self.pad(sequences)
        sequence_keys = {f"{p}_{k}" for p in self.parts for k in ("input_ids", "labels")}
        for key in features[0]:
            if key not in sequence_keys:
                values = [f[key] for f in features]
                dtype = torch.float32 if isinstance(values[0], float) else torch.long
                batch[key] = torch.as_tensor(values, dtype=dtype)
        return batch

    def __repr__(self) -> str:
        return f"PreferenceCollator({self.pad!r}, parts={self.parts})"


def batch_tokens(batch: dict[str, Any], key: str | None) -> torch.Tensor | None:
    """What counts a micro-batch's tokens (tokens/s): its ``key`` (a mask, summed), or for a
    padding-free packed batch (no mask; ``position_ids`` restart per example) one per input id."""
    if key is None:
        return None
    shards = batch.get("sequence_shards")  # a sequence shard (sequence_shards.py): its real tokens
    if shards is not None:
        return torch.tensor(shards.tokens)
    mask = batch.get(key)
    if mask is None and "position_ids" in batch and "input_ids" in batch:
        return torch.tensor(batch["input_ids"].numel())  # a host number: no device sync
    return mask


# ---------------------------------------------------------------------------------------------
# Evaluation: per-example statistics (gathered by the loop), then one reduction


def causal_lm_eval_batch(outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per example: summed next-token cross-entropy, predicted tokens, correct predictions."""
    logits = outputs.logits[:, :-1, :].detach().float()
    labels = batch["labels"][:, 1:].to(logits.device)
    mask = labels != IGNORE_INDEX
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
    correct = (logits.argmax(dim=-1) == labels) & mask
    return {
        "loss_sum": ce.sum(dim=1),
        "count": mask.sum(dim=1).float(),
        "correct": correct.sum(dim=1).float(),
    }


def causal_lm_reduce(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    tokens = float(stats["count"].sum())
    if tokens == 0:
        return {}
    loss = float(stats["loss_sum"].sum()) / tokens
    return {
        "token_accuracy": float(stats["correct"].sum()) / tokens,
        "perplexity": math.exp(min(loss, 50.0)),
    }


def seq_cls_eval_batch(outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per example: cross-entropy, 1, and whether the predicted class is right."""
    logits = outputs.logits.detach().float()
    labels = batch["labels"].to(logits.device)
    ce = F.cross_entropy(logits, labels, reduction="none")
    return {
        "loss_sum": ce,
        "count": torch.ones_like(ce),
        "correct": (logits.argmax(dim=-1) == labels).float(),
    }


def seq_cls_reduce(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    n = float(stats["count"].sum())
    return {"accuracy": float(stats["correct"].sum()) / n} if n else {}
